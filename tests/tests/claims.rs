//! Every claim case in `shared/cases/claims` against a real gpushared, once with NVIDIA's MPS
//! control daemon and once with our emulator: the outcomes of `shared/cases/README.md` after
//! prepare, and nothing left after unprepare or after a refused prepare.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use gpushare_e2e::*;
use gpushare_proto::{
    AttachParams, Attachment, ClaimInfo, ComputeMode, ErrorCode, GpuSharing, Method, MpsInfo,
    StrategyInfo, TimeSliceInterval,
};
use serde_json::Value;

fn mps_groups(c: &ClaimInfo) -> Vec<MpsInfo> {
    c.groups
        .iter()
        .filter_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn daemon_env(pid: i32) -> BTreeMap<String, String> {
    let raw = fs::read(format!("/proc/{pid}/environ")).expect("environ of the MPS control daemon");
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let s = String::from_utf8_lossy(kv);
            s.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// Checks one MPS group against the daemon itself: its environment, its answers over its own
/// pipe directory, and that its /dev/shm is the claim's tmpfs.
fn check_mps_daemon(
    d: &Daemon,
    m: &MpsInfo,
    expected_uuids: &[String],
    atp: &str,
    limits: &[(&str, &str)],
) {
    assert!(
        gpushare::sys::pid_alive(m.control_daemon_pid),
        "daemon {} not running",
        m.control_daemon_pid
    );
    let env = daemon_env(m.control_daemon_pid);
    assert_eq!(
        env["CUDA_VISIBLE_DEVICES"],
        expected_uuids.join(","),
        "the daemon sees only its GPUs, sorted"
    );
    assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], m.pipe_dir);
    assert_eq!(m.active_thread_percentage, atp);
    let ui = d.mps_ui(&m.pipe_dir, "get_default_active_thread_percentage");
    assert_eq!(
        String::from_utf8_lossy(&ui.stdout).trim(),
        atp,
        "asked the daemon directly"
    );
    for (ordinal, shown) in limits {
        // A device without a limit ("" read directly) is not listed at all.
        let listed = m
            .pinned_device_memory_limits
            .get(*ordinal)
            .map(String::as_str);
        assert_eq!(listed, (!shown.is_empty()).then_some(*shown), "{ordinal}");
        let ui = d.mps_ui(
            &m.pipe_dir,
            &format!("get_default_device_pinned_mem_limit {ordinal}"),
        );
        assert_eq!(
            String::from_utf8_lossy(&ui.stdout).trim(),
            *shown,
            "device {ordinal} read directly"
        );
    }
    // The daemon's own mount namespace has the claim's tmpfs on /dev/shm.
    let ns_mounts =
        fs::read_to_string(format!("/proc/{}/mountinfo", m.control_daemon_pid)).expect("mountinfo");
    let shm_line = ns_mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/dev/shm"))
        .expect("/dev/shm in the daemon's namespace");
    assert!(shm_line.contains("tmpfs"), "{shm_line}");
    let host_mounts = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        host_mounts.contains(&m.shm_dir),
        "claim shm tmpfs mounted on the host at {}",
        m.shm_dir
    );
    assert!(!host_mounts
        .lines()
        .any(|l| l.split(' ').nth(4) == Some("/dev/shm") && l.contains(&m.shm_dir)));
}

fn cdi_spec(d: &Daemon, uid: &str) -> Value {
    let p = d.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"));
    serde_json::from_slice(&fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .expect("CDI JSON")
}

fn uuid_of(d: &Daemon, name: &str) -> String {
    d.gpus()[name].uuid.clone()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn valid_cases(program: &Path) {
    let Some(cases) = cases_dir() else {
        need(false, "shared/cases beside the repository");
        return;
    };
    // gpu-2 has MIG mode on, as its operator set it up (A100 needs a reset for that).
    let d = Daemon::start_on(
        DaemonOptions {
            mps_control: program.to_path_buf(),
            cdi_dir: None,
            run_dir: None,
        },
        &p4d_mig_profile(),
    );
    let claims = cases.join("claims");
    let mut pids: BTreeMap<String, Vec<i32>> = BTreeMap::new();

    // seed-mps.yaml
    let r = d
        .prepare(&load_claim(&claims.join("seed-mps.yaml")))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let uid = r.uid.clone();
    // The driver's device of the GPU (the simulated toolkit's spec), then the claim's.
    assert_eq!(
        r.requests[0].cdi_device_ids,
        vec![
            format!("gpushare.io/gpu={}", uuid_of(&d, "gpu-0")),
            format!("gpushare.io/claim={uid}")
        ]
    );
    let c = d.claim(&uid).unwrap();
    let m = &mps_groups(&c)[0];
    check_mps_daemon(&d, m, &[uuid_of(&d, "gpu-0")], "50.0", &[("0", "")]);
    pids.entry(uid.clone())
        .or_default()
        .push(m.control_daemon_pid);
    let spec = cdi_spec(&d, &uid);
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(
        edits["env"],
        serde_json::json!([
            "NVIDIA_VISIBLE_DEVICES=void",
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
        ])
    );
    let mounts: Vec<(String, String)> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["hostPath"].as_str().unwrap().into(),
                m["containerPath"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(
        mounts.contains(&(m.pipe_dir.clone(), "/tmp/nvidia-mps".into())),
        "{mounts:?}"
    );
    assert!(
        mounts.contains(&(m.shm_dir.clone(), "/dev/shm".into())),
        "{mounts:?}"
    );
    assert_eq!(
        d.gpus()["gpu-0"].compute_mode,
        ComputeMode::ExclusiveProcess
    );
    // Prepare is idempotent.
    let again = d
        .prepare(&load_claim(&claims.join("seed-mps.yaml")))
        .unwrap();
    assert!(again.already_prepared);
    assert_eq!(again.requests, r.requests);

    // seed-timeslicing.yaml: interval Default, at most 4 containers attached.
    let r = d
        .prepare(&load_claim(&claims.join("seed-timeslicing.yaml")))
        .unwrap();
    let ts = r.uid.clone();
    let c = d.claim(&ts).unwrap();
    assert_eq!(
        c.groups[0].sharing,
        StrategyInfo::TimeSlicing {
            interval: TimeSliceInterval::Default
        }
    );
    assert_eq!(c.attach_limit, Some(4));
    assert_eq!(d.gpus()["gpu-1"].time_slice, TimeSliceInterval::Default);
    assert_eq!(d.gpus()["gpu-1"].sharing, GpuSharing::TimeSlicing);
    for i in 0..4 {
        let a: Attachment = d
            .client()
            .call(
                Method::Attach,
                Some(&AttachParams {
                    claim_uid: ts.clone(),
                    container_id: format!("c{i}"),
                    pid: None,
                    bundle: None,
                    pod: None,
                }),
            )
            .unwrap();
        assert_eq!(a.container_id, format!("c{i}"));
    }
    let err = d
        .client()
        .call::<_, Attachment>(
            Method::Attach,
            Some(&AttachParams {
                claim_uid: ts.clone(),
                container_id: "c4".into(),
                pid: None,
                bundle: None,
                pod: None,
            }),
        )
        .unwrap_err();
    let body = err.remote().expect("a refusal");
    assert_eq!(body.code, ErrorCode::LimitReached);
    assert!(
        body.message.contains(&ts) && body.message.contains('4'),
        "{}",
        body.message
    );

    // seed-basic-v1beta1.yaml: gpu-3 exclusive, nothing changed.
    let r = d
        .prepare(&load_claim(&claims.join("seed-basic-v1beta1.yaml")))
        .unwrap();
    let basic = r.uid.clone();
    let g3 = &d.gpus()["gpu-3"];
    assert_eq!(g3.sharing, GpuSharing::Exclusive);
    assert_eq!(
        (g3.compute_mode, g3.time_slice),
        (ComputeMode::Default, TimeSliceInterval::Default)
    );
    assert_eq!(
        d.claim(&basic).unwrap().groups[0].sharing,
        StrategyInfo::Exclusive
    );

    // nvidia-mps-2gpu.json: one daemon over gpu-4 and gpu-5, limits by ordinal.
    let r = d
        .prepare(&load_claim(&claims.join("nvidia-mps-2gpu.json")))
        .unwrap();
    let two = r.uid.clone();
    let c = d.claim(&two).unwrap();
    let groups = mps_groups(&c);
    assert_eq!(groups.len(), 1);
    let uuids = sorted(vec![uuid_of(&d, "gpu-4"), uuid_of(&d, "gpu-5")]);
    check_mps_daemon(&d, &groups[0], &uuids, "30.0", &[("0", "8G"), ("1", "20G")]);
    pids.entry(two.clone())
        .or_default()
        .push(groups[0].control_daemon_pid);

    // nvidia-two-requests.yaml: gpu-6 Short, gpu-7 MPS 50, one CDI device per request.
    let r = d
        .prepare(&load_claim(&claims.join("nvidia-two-requests.yaml")))
        .unwrap();
    let mixed = r.uid.clone();
    assert_eq!(r.requests.len(), 2);
    assert_eq!(
        r.requests[0].cdi_device_ids,
        vec![
            format!("gpushare.io/gpu={}", uuid_of(&d, "gpu-6")),
            format!("gpushare.io/claim={mixed}-ts-gpu")
        ]
    );
    assert_eq!(
        r.requests[1].cdi_device_ids,
        vec![
            format!("gpushare.io/gpu={}", uuid_of(&d, "gpu-7")),
            format!("gpushare.io/claim={mixed}-mps-gpu")
        ]
    );
    assert_eq!(d.gpus()["gpu-6"].time_slice, TimeSliceInterval::Short);
    let c = d.claim(&mixed).unwrap();
    let groups = mps_groups(&c);
    check_mps_daemon(&d, &groups[0], &[uuid_of(&d, "gpu-7")], "50.0", &[]);
    pids.entry(mixed.clone())
        .or_default()
        .push(groups[0].control_daemon_pid);
    let spec = cdi_spec(&d, &mixed);
    let ts_dev = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == format!("{mixed}-ts-gpu"))
        .unwrap();
    assert_eq!(
        ts_dev["containerEdits"]["env"],
        serde_json::json!(["NVIDIA_VISIBLE_DEVICES=void"]),
        "the time-sliced request gets no MPS env, only what hides other GPUs"
    );

    // seed-mig-3g20gb.yaml: gpu-2 gets one 3g.20gb GPU instance (profile 9) at placement
    // start 4 with a full compute instance; the CDI device carries the MIG capability nodes.
    let r = d
        .prepare(&load_claim(&claims.join("seed-mig-3g20gb.yaml")))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let mig = r.uid.clone();
    let g2 = d.gpus()["gpu-2"].clone();
    assert!(g2.mig_enabled);
    assert_eq!(g2.sharing, GpuSharing::Mig);
    assert_eq!(g2.mig_devices.len(), 1, "{:?}", g2.mig_devices);
    let m = &g2.mig_devices[0];
    assert_eq!(
        (
            m.profile.as_str(),
            m.gi_profile_id,
            m.placement_start,
            m.memory_slices
        ),
        ("3g.20gb", 9, 4, 4)
    );
    assert!(m.uuid.starts_with("MIG-"), "{m:?}");
    assert_eq!(m.owner.as_deref(), Some(mig.as_str()));
    let c = d.claim(&mig).unwrap();
    assert_eq!(c.groups[0].mig[0].uuid, m.uuid);
    let nodes: Vec<String> = cdi_spec(&d, &mig)["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect();
    assert!(nodes.contains(&"/dev/nvidia2".to_string()), "{nodes:?}");
    assert_eq!(
        nodes
            .iter()
            .filter(|n| n.starts_with("/dev/nvidia-caps/nvidia-cap"))
            .count(),
        2,
        "GI and CI access nodes: {nodes:?}"
    );

    // Unprepare everything: daemons quit, dirs, mounts, CDI files, checkpoint entries gone,
    // GPU settings back to DEFAULT / Default.
    for uid in [&uid, &ts, &basic, &two, &mixed, &mig] {
        d.unprepare(uid);
        d.assert_nothing_left(uid, pids.get(uid).map_or(&[][..], Vec::as_slice));
    }
    for g in d.gpus().values() {
        assert_eq!(
            (g.compute_mode, g.time_slice, g.sharing),
            (
                ComputeMode::Default,
                TimeSliceInterval::Default,
                GpuSharing::Free
            ),
            "{}",
            g.name
        );
    }
    // MIG instances are destroyed; MIG mode stays as the operator set it.
    let g2 = d.gpus()["gpu-2"].clone();
    assert!(g2.mig_devices.is_empty(), "{:?}", g2.mig_devices);
    assert!(g2.mig_enabled);
    assert_eq!(
        fs::read_dir(d.run_dir.join("claims"))
            .map(|r| r.count())
            .unwrap_or(0),
        0
    );
    // Unprepare is idempotent.
    let r: gpushare_proto::UnprepareResult = d
        .client()
        .call(
            Method::Unprepare,
            Some(&gpushare_proto::UidParams { uid: uid.clone() }),
        )
        .unwrap();
    assert!(!r.released);
}

fn invalid_cases(program: &Path) {
    let Some(cases) = cases_dir() else {
        need(false, "shared/cases beside the repository");
        return;
    };
    let dir = cases.join("claims/invalid");
    let expected: BTreeMap<String, String> =
        serde_json::from_slice(&fs::read(dir.join("expected.json")).unwrap()).unwrap();
    assert!(expected.len() >= 10);
    let d = Daemon::start(DaemonOptions {
        mps_control: program.to_path_buf(),
        cdi_dir: None,
        run_dir: None,
    });
    for (file, code) in &expected {
        let claim = load_claim(&dir.join(file));
        let err = d.prepare(&claim).expect_err(file);
        let body = err.remote().unwrap_or_else(|| panic!("{file}: {err}"));
        assert_eq!(body.code.as_str(), code, "{file}: {}", body.message);
        assert!(!body.message.is_empty());
        let uid = claim["metadata"]["uid"].as_str().unwrap();
        if uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            d.assert_nothing_left(uid, &[]);
        }
    }
    // Nothing at all: no claim, no claim's CDI file (the node's driver spec, generated at
    // start, is all there is), no run directory entry, no MPS daemon.
    let claims: Vec<ClaimInfo> = d.client().call(Method::ListClaims, None::<&()>).unwrap();
    assert!(claims.is_empty());
    let specs: Vec<String> = fs::read_dir(&d.cdi_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(specs, vec!["gpushare.io-gpu.json"]);
    assert_eq!(
        fs::read_dir(d.run_dir.join("claims"))
            .map(|r| r.count())
            .unwrap_or(0),
        0
    );
    assert!(!Path::new("/etc/cron.d/x").exists());
    for g in d.gpus().values() {
        assert_eq!(g.sharing, GpuSharing::Free);
    }
}

#[test]
fn valid_cases_with_each_mps_program() {
    if !need(is_root(), "root (mounts, device nodes)") {
        return;
    }
    for (name, program) in mps_programs() {
        eprintln!("--- MPS control program: {name}");
        valid_cases(&program);
    }
}

#[test]
fn invalid_cases_leave_nothing_behind() {
    if !need(is_root(), "root (mounts, device nodes)") {
        return;
    }
    for (name, program) in mps_programs() {
        eprintln!("--- MPS control program: {name}");
        invalid_cases(&program);
    }
}

#[test]
fn conflicting_claims_are_refused_and_change_nothing() {
    let Some(cases) = setup() else {
        return;
    };
    let d = Daemon::emulated();
    let ts = load_claim(&cases.join("claims/seed-timeslicing.yaml"));
    d.prepare(&ts).unwrap();
    // The same GPU asked with another interval, and with MPS.
    let mut long = with_uid(&ts, "conflict-long");
    long["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["timeSlice"] =
        "long".into();
    let err = d.prepare(&long).unwrap_err();
    assert_eq!(err.remote().unwrap().code, ErrorCode::Conflict, "{err}");
    assert!(err.to_string().contains("gpu-1"), "{err}");
    let mut mps = with_uid(&ts, "conflict-mps");
    mps["status"]["allocation"]["devices"]["config"] = serde_json::json!([{"source": "FromClaim", "requests": ["gpu"],
        "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharingMode": "mps"}}}]);
    let err = d.prepare(&mps).unwrap_err();
    assert_eq!(err.remote().unwrap().code, ErrorCode::Conflict, "{err}");
    d.assert_nothing_left("conflict-long", &[]);
    d.assert_nothing_left("conflict-mps", &[]);
    // A second claim at the same interval shares the GPU; the interval stays until the last
    // one leaves.
    let same = with_uid(&ts, "same-interval");
    d.prepare(&same).unwrap();
    let mut short = with_uid(&ts, "short-elsewhere");
    short["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-2".into();
    short["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["timeSlice"] =
        "short".into();
    d.prepare(&short).unwrap();
    assert_eq!(d.gpus()["gpu-2"].time_slice, TimeSliceInterval::Short);
    d.unprepare("short-elsewhere");
    assert_eq!(
        d.gpus()["gpu-2"].time_slice,
        TimeSliceInterval::Default,
        "last time-sliced claim restores Default"
    );
    assert_eq!(d.gpus()["gpu-1"].claims.len(), 2);
    d.unprepare(ts["metadata"]["uid"].as_str().unwrap());
    assert_eq!(d.gpus()["gpu-1"].sharing, GpuSharing::TimeSlicing);
    d.unprepare("same-interval");
    assert_eq!(d.gpus()["gpu-1"].sharing, GpuSharing::Free);
}
