//! End to end through the kubelet stand-in: kubelet → gpushare-dra → a real gpushared
//! (simulated p4d.24xlarge-mig2, NVIDIA's MPS control program where installed) → CDI device
//! IDs, with the API-server stand-in serving the shared cases as ResourceClaims.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use gpushare_proto::{ClaimState, StrategyInfo};
use serde_json::Value;
use support::apiserver::ApiServer;
use support::kubelet::{Device, Kubelet, Release};
use support::*;

fn daemon() -> Daemon {
    Daemon::start_on(
        DaemonOptions {
            mps_control: mps_program(),
            cdi_dir: None,
            run_dir: None,
        },
        &p4d_mig_profile(),
    )
}

/// Every CDI device ID the daemon's specs define.
fn cdi_ids(cdi_dir: &Path) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for e in std::fs::read_dir(cdi_dir).into_iter().flatten().flatten() {
        let Ok(v) = serde_json::from_slice::<Value>(&std::fs::read(e.path()).unwrap()) else {
            continue;
        };
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        for d in v["devices"].as_array().into_iter().flatten() {
            ids.insert(format!("{kind}={}", d["name"].as_str().unwrap_or_default()));
        }
    }
    ids
}

fn mps_of(
    info: &gpushare_proto::ClaimInfo,
) -> Vec<(String, std::collections::BTreeMap<String, String>)> {
    info.groups
        .iter()
        .filter_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some((
                m.active_thread_percentage.clone(),
                m.pinned_device_memory_limits.clone(),
            )),
            _ => None,
        })
        .collect()
}

fn check_case_outcome(file: &str, info: &gpushare_proto::ClaimInfo) {
    assert_eq!(info.state, ClaimState::Prepared, "{file}: {info:?}");
    let kinds: Vec<&str> = info
        .groups
        .iter()
        .map(|g| match &g.sharing {
            StrategyInfo::Mps(_) => "mps",
            StrategyInfo::TimeSlicing { .. } => "ts",
            StrategyInfo::Exclusive => "exclusive",
        })
        .collect();
    match file {
        "seed-mps.yaml" => assert_eq!(mps_of(info)[0].0, "50.0", "{file}"),
        "seed-timeslicing.yaml" => assert_eq!(kinds, ["ts"], "{file}"),
        "seed-mig-3g20gb.yaml" => assert!(
            info.groups.iter().any(|g| !g.mig.is_empty()),
            "{file}: {info:?}"
        ),
        "seed-basic-v1beta1.yaml" => assert_eq!(kinds, ["exclusive"], "{file}"),
        "nvidia-mps-2gpu.json" => {
            let m = &mps_of(info)[0];
            assert_eq!(m.0, "30.0");
            assert_eq!(
                m.1.get("0").map(String::as_str),
                Some("8G"),
                "{file}: {m:?}"
            );
            assert_eq!(
                m.1.get("1").map(String::as_str),
                Some("20G"),
                "{file}: {m:?}"
            );
        }
        "nvidia-two-requests.yaml" => {
            assert!(
                kinds.contains(&"ts") && kinds.contains(&"mps"),
                "{file}: {kinds:?}"
            );
            assert_eq!(info.requests.len(), 2, "{file}");
        }
        other => panic!("a new shared case {other}: add its expected outcome here"),
    }
}

fn assert_devices_sound(file: &str, devices: &[Device], cdi: &BTreeSet<String>) {
    assert!(!devices.is_empty(), "{file}: no devices");
    let mut seen = BTreeSet::new();
    for d in devices {
        assert_eq!(d.pool_name, NODE, "{file}: {d:?}");
        assert!(
            d.request_names.iter().all(|r| !r.contains('/')),
            "{file}: base names: {d:?}"
        );
        for id in &d.cdi_device_ids {
            assert!(
                seen.insert(id.clone()),
                "{file}: {id} given twice: {devices:?}"
            );
            if id.starts_with("gpushare.io/") {
                assert!(
                    cdi.contains(id),
                    "{file}: {id} not defined by any CDI spec: {cdi:?}"
                );
            }
        }
    }
    assert!(
        devices.iter().any(|d| !d.cdi_device_ids.is_empty()),
        "{file}: no CDI IDs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shared_case_through_the_kubelet_stand_in() {
    if !need(is_root(), "root") {
        return;
    }
    let (Some(valid), Some(invalid)) = (valid_cases(), invalid_cases()) else {
        need(false, "shared/cases");
        return;
    };
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    for (_, c) in &valid {
        api.add_claim(c, Some(NODE));
    }
    for (_, c, _) in &invalid {
        api.add_claim(c, Some(NODE));
    }
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    let kubelet = Kubelet::new(&dirs.registry, Release::K134);
    let reg = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    assert_eq!(reg.info.r#type, "DRAPlugin");
    assert_eq!(reg.info.endpoint, dirs.dra_socket().display().to_string());
    assert_eq!(
        reg.info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(reg.version, "v1");

    // An empty request succeeds (NVIDIA's health probe sends one).
    assert!(reg.prepare(&[], Some("v1")).await.unwrap().is_empty());
    assert!(reg.prepare(&[], Some("v1beta1")).await.unwrap().is_empty());

    let mut pids = Vec::new();
    for (file, claim) in &valid {
        let r = claim_ref(claim);
        let answer = reg
            .prepare(std::slice::from_ref(&r), Some("v1"))
            .await
            .unwrap();
        let devices = answer[&r.uid]
            .clone()
            .unwrap_or_else(|e| panic!("{file}: {e}\n{}\n{}", plugin.log(), d.log()));
        assert_devices_sound(file, &devices, &cdi_ids(&d.cdi_dir));
        let info = d.claim(&r.uid).unwrap();
        check_case_outcome(file, &info);
        pids.extend(info.groups.iter().filter_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.control_daemon_pid),
            _ => None,
        }));
        // kubelet 1.33 asks the same through v1beta1: the same answer (idempotent).
        let again = reg
            .prepare(std::slice::from_ref(&r), Some("v1beta1"))
            .await
            .unwrap();
        assert_eq!(again[&r.uid].as_ref().unwrap(), &devices, "{file}");
    }
    for (file, claim, code) in &invalid {
        let r = claim_ref(claim);
        let answer = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
        let err = answer[&r.uid].clone().expect_err(file);
        assert!(
            err.contains(&format!(": {code}: ")),
            "{file}: {code} not in {err:?}"
        );
        d.assert_nothing_left(&r.uid, &[]);
    }
    // One call with every valid claim: every claim gets its entry (all already prepared).
    let all: Vec<_> = valid.iter().map(|(_, c)| claim_ref(c)).collect();
    let answer = reg.prepare(&all, None).await.unwrap();
    assert!(answer.values().all(Result::is_ok), "{answer:?}");

    // The claims are deleted from the API server before kubelet unprepares (as when the
    // pods and their claims go): unprepare needs only the UID.
    for (_, c) in &valid {
        api.delete_claim(
            c["metadata"]["namespace"].as_str().unwrap_or("default"),
            c["metadata"]["name"].as_str().unwrap(),
        );
    }
    let released = reg.unprepare(&all, Some("v1beta1")).await.unwrap();
    assert!(released.values().all(Result::is_ok), "{released:?}");
    for r in &all {
        d.assert_nothing_left(&r.uid, &pids);
    }
    // Idempotent, and an unknown UID succeeds.
    let mut again = all.clone();
    again.push(support::kubelet::Claim {
        namespace: "x".into(),
        uid: "3f9d2c4e-0000-4000-8000-00000000abcd".into(),
        name: "never".into(),
    });
    let released = reg.unprepare(&again, Some("v1")).await.unwrap();
    assert!(released.values().all(Result::is_ok), "{released:?}");
    assert!(
        api.refused().is_empty(),
        "the plugin asked for what a node may not: {:?}",
        api.refused()
    );
    let log = plugin.log();
    assert!(
        log.lines().any(|l| l.contains(" prepare claim=")
            && l.contains("outcome=ok")
            && l.contains("duration_ms=")),
        "one log line per prepare: {log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains(" unprepare claim=") && l.contains("outcome=ok")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_the_node_may_not_read_missing_or_replaced_claims_fail_alone() {
    if !need(is_root(), "root") {
        return;
    }
    let Some(valid) = valid_cases() else {
        need(false, "shared/cases");
        return;
    };
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    // 1.33: v1 not served; the plugin reads claims and writes slices in v1beta2.
    api.serve_versions(&["v1beta2", "v1beta1"]);
    let seed = valid
        .iter()
        .find(|(f, _)| f == "seed-basic-v1beta1.yaml")
        .unwrap()
        .1
        .clone();
    api.add_claim(&seed, Some(NODE));
    let mut foreign = with_uid(&seed, "0b8f4c2a-1111-4222-8333-444455556666");
    foreign["metadata"]["name"] = "of-another-node".into();
    api.add_claim(&foreign, None);
    let mut replaced = with_uid(&seed, "0b8f4c2a-1111-4222-8333-777788889999");
    replaced["metadata"]["name"] = "replaced".into();
    api.add_claim(&replaced, Some(NODE));
    let mut unallocated = with_uid(&seed, "0b8f4c2a-1111-4222-8333-aaaabbbbcccc");
    unallocated["metadata"]["name"] = "unallocated".into();
    unallocated["status"] = serde_json::json!({});
    api.add_claim(&unallocated, Some(NODE));
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    let kubelet = Kubelet::new(&dirs.registry, Release::K133);
    let reg = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    assert_eq!(reg.version, "v1beta1");
    let ok = claim_ref(&seed);
    let forbidden = claim_ref(&foreign);
    // A claim its pod still names but that was deleted: the node may read it, so 404.
    let mut gone = with_uid(&seed, "0b8f4c2a-1111-4222-8333-dddddddddddd");
    gone["metadata"]["name"] = "gone".into();
    api.add_claim(&gone, Some(NODE));
    api.delete_claim(&ok.namespace, "gone");
    let missing = claim_ref(&gone);
    let mut wrong_uid = claim_ref(&replaced);
    wrong_uid.uid = "0b8f4c2a-1111-4222-8333-eeeeeeeeeeee".into();
    let unalloc = claim_ref(&unallocated);
    let answer = reg
        .prepare(
            &[
                ok.clone(),
                forbidden.clone(),
                missing.clone(),
                wrong_uid.clone(),
                unalloc.clone(),
            ],
            None,
        )
        .await
        .unwrap();
    assert!(answer[&ok.uid].is_ok(), "{answer:?}\n{}", plugin.log());
    assert!(
        answer[&forbidden.uid].as_ref().unwrap_err().contains("403"),
        "{answer:?}"
    );
    assert!(
        answer[&missing.uid].as_ref().unwrap_err().contains("404"),
        "{answer:?}"
    );
    assert!(
        answer[&wrong_uid.uid]
            .as_ref()
            .unwrap_err()
            .contains("replaced"),
        "{answer:?}"
    );
    assert!(
        answer[&unalloc.uid]
            .as_ref()
            .unwrap_err()
            .contains("not allocated"),
        "{answer:?}"
    );
    for u in [&forbidden.uid, &missing.uid, &wrong_uid.uid, &unalloc.uid] {
        d.assert_nothing_left(u, &[]);
    }
    let gets = api.claim_gets();
    assert!(
        gets.iter()
            .all(|p| p.starts_with("/apis/resource.k8s.io/v1beta2/")),
        "{gets:?}"
    );
    // The slices are in v1beta2's shape.
    assert!(
        wait_until(Duration::from_secs(10), || !api.slices().is_empty()),
        "{}",
        plugin.log()
    );
    let s = &api.slices()[0];
    assert_eq!(s["apiVersion"], "resource.k8s.io/v1beta2");
    assert!(
        s["spec"]["devices"][0]["attributes"]["type"].is_object(),
        "{s}"
    );
    let released = reg
        .unprepare(std::slice::from_ref(&ok), None)
        .await
        .unwrap();
    assert!(released[&ok.uid].is_ok());
    d.assert_nothing_left(&ok.uid, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1beta1_only_servers_get_the_basic_device_shape() {
    if !need(is_root(), "root") {
        return;
    }
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    api.serve_versions(&["v1beta1"]);
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    assert!(
        wait_until(Duration::from_secs(10), || !api.slices().is_empty()),
        "{}",
        plugin.log()
    );
    let s = &api.slices()[0];
    assert_eq!(s["apiVersion"], "resource.k8s.io/v1beta1");
    let dev = &s["spec"]["devices"][0];
    assert!(
        dev.get("attributes").is_none() && dev["basic"]["attributes"]["type"].is_object(),
        "{dev}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_are_published_restored_after_a_wipe_and_follow_the_mig_layout() {
    if !need(is_root(), "root") {
        return;
    }
    let Some(valid) = valid_cases() else {
        need(false, "shared/cases");
        return;
    };
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    let mut other = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "other-node-slice"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "ip-10-0-9-9.us-west-2.compute.internal",
                 "pool": {"name": "ip-10-0-9-9.us-west-2.compute.internal", "generation": 1, "resourceSliceCount": 1}, "devices": []}});
    api.put_foreign_slice(other.clone());
    let dirs = Dirs::new(&api);
    let mut plugin = Plugin::start(&dirs, &d.socket, &[]);
    let ours = |api: &ApiServer| -> Vec<Value> {
        api.slices()
            .into_iter()
            .filter(|s| s["spec"]["nodeName"] == NODE)
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(10), || !ours(&api).is_empty()),
        "{}",
        plugin.log()
    );
    let s = ours(&api)[0].clone();
    assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(s["spec"]["driver"], "gpu.nvidia.com");
    assert_eq!(s["spec"]["pool"]["name"], NODE);
    assert_eq!(s["spec"]["pool"]["resourceSliceCount"], 1);
    let owner = &s["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("Node"), Some(NODE))
    );
    assert_eq!(owner["uid"], format!("node-uid-{NODE}"));
    assert_eq!(owner["controller"], true);
    let gpus: Vec<_> = d.gpus().into_values().collect();
    let mut sorted = gpus.clone();
    sorted.sort_by_key(|g| g.minor);
    let want = gpushare_slice::build_pool(&sorted, NODE, "gpu.nvidia.com", 1);
    let got = gpushare_slice::devices_of_object(&s, gpushare_slice::ApiVersion::V1).unwrap();
    let names =
        |d: &[gpushare_slice::Device]| d.iter().map(|x| x.name.clone()).collect::<BTreeSet<_>>();
    assert_eq!(names(&got), names(&want[0].spec.devices));

    // kubelet's start wipes the node's slices: back within 5 s; the other node's untouched.
    assert_eq!(api.wipe_node_slices(NODE), 1);
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(5), || ours(&api).len() == 1),
        "not back in 5 s: {}",
        plugin.log()
    );
    eprintln!("slices back {:?} after the wipe", t.elapsed());

    // A MIG device created by a claim changes the node's devices: published within 5 s.
    let mig = valid
        .iter()
        .find(|(f, _)| f == "seed-mig-3g20gb.yaml")
        .unwrap()
        .1
        .clone();
    let before = names(
        &gpushare_slice::devices_of_object(&ours(&api)[0], gpushare_slice::ApiVersion::V1).unwrap(),
    );
    api.add_claim(&mig, Some(NODE));
    let kubelet = Kubelet::new(&dirs.registry, Release::K134);
    let reg = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap();
    let answer = reg.prepare(&[claim_ref(&mig)], None).await.unwrap();
    assert!(answer.values().all(Result::is_ok), "{answer:?}");
    let after_gpus: Vec<_> = {
        let mut g: Vec<_> = d.gpus().into_values().collect();
        g.sort_by_key(|g| g.minor);
        g
    };
    let want_after = names(&gpushare_slice::devices(&after_gpus));
    assert_ne!(
        before, want_after,
        "the MIG claim should change the device list"
    );
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(5), || {
            ours(&api).first().is_some_and(|s| {
                names(
                    &gpushare_slice::devices_of_object(s, gpushare_slice::ApiVersion::V1).unwrap(),
                ) == want_after
            })
        }),
        "MIG change not published in 5 s: {}",
        plugin.log()
    );
    eprintln!("MIG change published after {:?}", t.elapsed());
    d.unprepare(mig["metadata"]["uid"].as_str().unwrap());

    // SIGTERM: sockets gone, slices kept, exit 0.
    plugin.signal(nix::sys::signal::Signal::SIGTERM);
    let st = plugin
        .wait_exit(Duration::from_secs(10))
        .expect("exits on SIGTERM");
    assert!(st.success(), "{st:?}\n{}", plugin.log());
    assert!(
        !dirs.reg_socket().exists() && !dirs.dra_socket().exists(),
        "sockets left"
    );
    assert_eq!(ours(&api).len(), 1, "slices must stay over a stop");

    // --remove-slices removes ours only.
    let out = std::process::Command::new(bin("gpushare-dra"))
        .args([
            "--config",
            "/dev/null",
            "--remove-slices",
            "--node-name",
            NODE,
        ])
        .arg("--kubeconfig")
        .arg(&dirs.kubeconfig)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ours(&api).is_empty());
    other["metadata"]["uid"] = "uid-other-node-slice".into();
    assert_eq!(api.slices().len(), 1, "the other node's slice stays");
    assert!(api.refused().is_empty(), "{:?}", api.refused());

    // deployments/rbac.yaml's ClusterRole grants exactly what the plugin used here (claims,
    // its Node, and every slice operation: list, watch, create, update on the MIG change,
    // delete by --remove-slices), no more.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deployments/rbac.yaml"),
    )
    .unwrap();
    let mut granted = BTreeSet::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if v["kind"] != "ClusterRole" {
            continue;
        }
        for rule in v["rules"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    granted.insert((
                        verb.as_str().unwrap().to_string(),
                        r.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    assert_eq!(
        api.seen(),
        granted,
        "the ClusterRole must cover exactly what the plugin does"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_down_or_slow_and_gpushared_down_fail_each_claim_within_its_bound() {
    if !need(is_root(), "root") {
        return;
    }
    let Some(valid) = valid_cases() else {
        need(false, "shared/cases");
        return;
    };
    let api = ApiServer::start(NODE).await;
    let seed = valid
        .iter()
        .find(|(f, _)| f == "seed-basic-v1beta1.yaml")
        .unwrap()
        .1
        .clone();
    api.add_claim(&seed, Some(NODE));
    let dirs = Dirs::new(&api);
    // gpushared is reached through a link that does not lead anywhere yet.
    let link = dirs.root.path().join("gpushared.sock");
    let plugin = Plugin::start(&dirs, &link, &["--claim-timeout-seconds", "3"]);
    let kubelet = Kubelet::new(&dirs.registry, Release::K134);
    let reg = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap();
    let r = claim_ref(&seed);

    let a = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
    let e = a[&r.uid].clone().unwrap_err();
    assert!(e.contains("gpushared is unreachable"), "{e}");

    let d = daemon();
    std::os::unix::fs::symlink(&d.socket, &link).unwrap();
    api.set_down(true);
    let t = Instant::now();
    let a = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
    let e = a[&r.uid].clone().unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(e.contains("API server"), "{e}");
    api.set_down(false);
    api.set_delay(Duration::from_secs(5));
    let t = Instant::now();
    let a = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
    let e = a[&r.uid].clone().unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(
        e.contains("timed out after 3 s waiting for the API server"),
        "{e}"
    );
    d.assert_nothing_left(&r.uid, &[]);
    api.set_delay(Duration::ZERO);
    // gpushared is back: served.
    let a = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
    assert!(a[&r.uid].is_ok(), "{a:?}\n{}", plugin.log());
    let _ = reg.unprepare(std::slice::from_ref(&r), None).await.unwrap();
    d.assert_nothing_left(&r.uid, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_plugin_for_the_driver_is_refused_and_stale_sockets_are_replaced() {
    if !need(is_root(), "root") {
        return;
    }
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    let dirs = Dirs::new(&api);
    // Stale sockets of a killed run: bound, then the process gone.
    std::fs::create_dir_all(dirs.dra_socket().parent().unwrap()).unwrap();
    for p in [dirs.reg_socket(), dirs.dra_socket()] {
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        assert!(p.exists());
    }
    let first = Plugin::start(&dirs, &d.socket, &[]);
    let kubelet = Kubelet::new(&dirs.registry, Release::K134);
    let reg = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", first.log()));
    let mut second = Plugin::start(&dirs, &d.socket, &[]);
    let st = second
        .wait_exit(Duration::from_secs(10))
        .expect("the second plugin stops");
    assert!(!st.success());
    let log = second.log();
    assert!(
        log.contains("in use") || log.contains("another kubelet plugin"),
        "{log}"
    );
    // The first still serves.
    assert!(reg.prepare(&[], None).await.unwrap().is_empty());
    drop(first);

    // Another vendor's plugin (NVIDIA's, with a rolling-update socket name) holds the driver.
    let dirs2 = Dirs::new(&api);
    let other = dirs2.registry.join("gpu.nvidia.com-5f2d6c1e-reg.sock");
    let listener = tokio::net::UnixListener::bind(&other).unwrap();
    let info = gpushare_dra::grpc::registration::PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "gpu.nvidia.com".into(),
        endpoint: "/var/lib/kubelet/plugins/gpu.nvidia.com/dra-5f2d6c1e.sock".into(),
        supported_versions: vec!["v1.DRAPlugin".into()],
    };
    let svc = gpushare_dra::service::RegistrationService::new(info, std::sync::Arc::default());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                gpushare_dra::grpc::registration::registration_server::RegistrationServer::new(svc),
            )
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let mut third = Plugin::start(&dirs2, &d.socket, &[]);
    let st = third.wait_exit(Duration::from_secs(10)).expect("refused");
    assert!(!st.success());
    let log = third.log();
    assert!(
        log.contains("another kubelet plugin") && log.contains("gpu.nvidia.com-5f2d6c1e-reg.sock"),
        "{log}"
    );
    assert_eq!(log.trim().lines().count(), 1, "one line: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_prepare_then_kubelets_retry_gets_the_same_ids_and_one_mps_daemon() {
    if !need(is_root(), "root") {
        return;
    }
    let Some(valid) = valid_cases() else {
        need(false, "shared/cases");
        return;
    };
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    let seed = valid
        .iter()
        .find(|(f, _)| f == "seed-mps.yaml")
        .unwrap()
        .1
        .clone();
    api.add_claim(&seed, Some(NODE));
    let dirs = Dirs::new(&api);
    let mut plugin = Plugin::start(&dirs, &d.socket, &[]);
    let kubelet = Kubelet::new(&dirs.registry, Release::K134);
    let reg = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap();
    let r = claim_ref(&seed);
    let call = {
        let reg = reg.clone();
        let r = r.clone();
        tokio::spawn(async move { reg.prepare(&[r], None).await })
    };
    // Kill it while the claim is on its way through gpushared.
    let uid = r.uid.clone();
    let socket = d.socket.clone();
    tokio::task::spawn_blocking(move || {
        wait_until(Duration::from_secs(10), || {
            gpushare_proto::Client::connect(&socket, Duration::from_secs(2))
                .and_then(|mut c| {
                    c.call::<_, Value>(
                        gpushare_proto::Method::GetClaim,
                        Some(&gpushare_proto::UidParams { uid: uid.clone() }),
                    )
                })
                .is_ok()
        })
    })
    .await
    .unwrap();
    plugin.signal(nix::sys::signal::Signal::SIGKILL);
    plugin.wait_exit(Duration::from_secs(5)).unwrap();
    let first = call.await.unwrap();
    assert!(
        first.is_err() || first.as_ref().unwrap()[&r.uid].is_ok(),
        "{first:?}"
    );
    let killed_at = SystemTime::now();
    std::thread::sleep(Duration::from_millis(20));
    // systemd restarts it; the stale sockets are replaced and kubelet registers again.
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    let reg2 = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), Some(killed_at))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    let retry = reg2.prepare(std::slice::from_ref(&r), None).await.unwrap();
    let devices = retry[&r.uid].clone().unwrap();
    let info = d.claim(&r.uid).unwrap();
    let want: Vec<String> = info
        .requests
        .iter()
        .flat_map(|q| q.cdi_device_ids.clone())
        .collect();
    let got: Vec<String> = devices
        .iter()
        .flat_map(|x| x.cdi_device_ids.clone())
        .collect();
    assert_eq!(got, want);
    let again = reg2.prepare(std::slice::from_ref(&r), None).await.unwrap();
    assert_eq!(again[&r.uid].as_ref().unwrap(), &devices);
    let daemons: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .map(|env| {
                    String::from_utf8_lossy(&env).contains(&format!(
                        "{}/claims/{}/",
                        d.run_dir.display(),
                        r.uid
                    ))
                })
                .unwrap_or(false)
        })
        .map(|e| {
            format!(
                "{:?} {}",
                e.file_name(),
                String::from_utf8_lossy(
                    &std::fs::read(e.path().join("cmdline")).unwrap_or_default()
                )
            )
        })
        .collect();
    assert_eq!(
        daemons.len(),
        1,
        "one MPS control daemon for the claim: {daemons:?}"
    );
    let pid = match &info.groups[0].sharing {
        StrategyInfo::Mps(m) => m.control_daemon_pid,
        _ => panic!("not MPS"),
    };
    let _ = reg2
        .unprepare(std::slice::from_ref(&r), None)
        .await
        .unwrap();
    d.assert_nothing_left(&r.uid, &[pid]);
}

// The guard serializes with the other tests that use /var/run/cdi; each test has its own
// runtime, so holding it across awaits blocks no other task of this test.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_podman_container_started_with_exactly_the_kubelet_ids_attaches_and_nothing_is_left() {
    if !need(is_root(), "root")
        || !need(which("podman").is_some(), "podman")
        || !need(which("runc").is_some(), "runc")
    {
        return;
    }
    let Some(valid) = valid_cases() else {
        need(false, "shared/cases");
        return;
    };
    let _serial = global_lock();
    let d = Daemon::start_on(
        DaemonOptions {
            mps_control: mps_program(),
            // podman reads CDI specs from /etc/cdi and /var/run/cdi only.
            cdi_dir: Some(std::path::PathBuf::from("/var/run/cdi")),
            run_dir: None,
        },
        &p4d_mig_profile(),
    );
    let api = ApiServer::start(NODE).await;
    let uid = unique_uid("dra-podman");
    let claim = with_uid(
        &valid.iter().find(|(f, _)| f == "seed-mps.yaml").unwrap().1,
        &uid,
    );
    api.add_claim(&claim, Some(NODE));
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    let kubelet = Kubelet::new(&dirs.registry, Release::K134);
    let reg = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap();
    let r = claim_ref(&claim);
    let answer = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
    let devices = answer[&uid]
        .clone()
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    // kubelet hands the runtime every ID of every Device, in order; containerd 1.7+/2.x
    // applies them with the reference CDI library, as podman does.
    let ids: Vec<String> = devices
        .iter()
        .flat_map(|x| x.cdi_device_ids.clone())
        .collect();
    assert!(!ids.is_empty());
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs(tmp.path(), &[]);
    let mut cmd = std::process::Command::new("podman");
    cmd.args([
        "run",
        "--rm",
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "none",
    ]);
    for id in &ids {
        cmd.args(["--device", id]);
    }
    cmd.arg("--rootfs").arg(&rootfs).args([
        "/bin/sh",
        "-c",
        "echo pipe=$CUDA_MPS_PIPE_DIRECTORY; ls /tmp/nvidia-mps; sleep 2",
    ]);
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let attached = tokio::task::spawn_blocking({
        let socket = d.socket.clone();
        let uid = uid.clone();
        move || {
            wait_until(Duration::from_secs(30), || {
                gpushare_proto::Client::connect(&socket, Duration::from_secs(2))
                    .and_then(|mut c| {
                        c.call::<_, gpushare_proto::ClaimInfo>(
                            gpushare_proto::Method::GetClaim,
                            Some(&gpushare_proto::UidParams { uid: uid.clone() }),
                        )
                    })
                    .is_ok_and(|c| c.attached.len() == 1)
            })
        }
    })
    .await
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "podman: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert!(attached, "the hook never attached the container");
    assert!(
        stdout.contains("pipe=/tmp/nvidia-mps") && stdout.lines().any(|l| l.trim() == "control"),
        "{stdout}"
    );
    let info = d.claim(&uid).unwrap();
    assert!(info.attached.is_empty(), "detached at poststop: {info:?}");
    let pid = match &info.groups[0].sharing {
        StrategyInfo::Mps(m) => m.control_daemon_pid,
        _ => panic!("not MPS"),
    };
    // The pod and its claim are deleted; kubelet unprepares by UID.
    api.delete_claim(&r.namespace, &r.name);
    let released = reg.unprepare(std::slice::from_ref(&r), None).await.unwrap();
    assert!(released[&uid].is_ok(), "{released:?}");
    d.assert_nothing_left(&uid, &[pid]);
    assert!(api.refused().is_empty(), "{:?}", api.refused());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_mismatch_stops_the_plugin_before_it_makes_any_socket() {
    if !need(is_root(), "root") {
        return;
    }
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    let dirs = Dirs::new(&api);
    // Every name made in kubelet's directories while the plugin lives, even one removed
    // again: kubelet's plugin watcher would have seen it.
    let mut made = Creations::watch(&[&dirs.registry, &dirs.plugins]);
    let mut wrong = Plugin::start(
        &dirs,
        &d.socket,
        &["--node-name", "ip-10-0-9-9.us-west-2.compute.internal"],
    );
    let st = wrong.wait_exit(Duration::from_secs(15)).expect("stops");
    assert_eq!(st.code(), Some(2), "{}", wrong.log());
    let log = wrong.log();
    assert!(
        log.lines()
            .any(|l| l.starts_with("gpushare-dra: node name mismatch")),
        "{log}"
    );
    assert_eq!(made.paths(), Vec::<std::path::PathBuf>::new(), "{log}");
    let left: Vec<_> = std::fs::read_dir(&dirs.registry)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left in the registry: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_which_gpushare_doctor_runs_sees_the_plugin_and_name_mismatches() {
    if !need(is_root(), "root") {
        return;
    }
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    let dirs = Dirs::new(&api);
    let probe = |node: &str| {
        let out = std::process::Command::new(bin("gpushare-dra"))
            .args([
                "--config",
                "/dev/null",
                "--node-name",
                node,
                "probe",
                "--json",
            ])
            .arg("--gpushared-socket")
            .arg(&d.socket)
            .arg("--plugins-dir")
            .arg(&dirs.plugins)
            .arg("--registry-dir")
            .arg(&dirs.registry)
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.success(), v)
    };
    let (ok, v) = probe(NODE);
    assert!(!ok, "nothing runs yet: {v}");
    assert_eq!(v[0]["name"], "registration");
    // The same shape as `gpushare doctor -o json`'s checks: a status, and a hint on failure.
    assert_eq!(v[0]["status"], "fail", "{v}");
    assert!(
        v[0]["hint"]
            .as_str()
            .is_some_and(|h| h.contains("systemctl status gpushare-dra")
                && h.contains("kubectl -n gpushare get pods")),
        "{v}"
    );
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    assert!(wait_until(Duration::from_secs(10), || dirs
        .reg_socket()
        .exists()));
    let (ok, v) = probe(NODE);
    assert!(ok, "{v}\n{}", plugin.log());

    // The plugin got its node name from a flag (GPUSHARE_DRA_ARGS=--node-name …); the probe
    // as `gpushare doctor` runs it has no such flag, no NODE_NAME, and this host's name is
    // not the node's: the running plugin's name counts, not the probe's own default.
    assert_ne!(nix::unistd::gethostname().unwrap().to_string_lossy(), NODE);
    let out = std::process::Command::new(bin("gpushare-dra"))
        .args(["--config", "/dev/null", "probe", "--json"])
        .arg("--gpushared-socket")
        .arg(&d.socket)
        .arg("--plugins-dir")
        .arg(&dirs.plugins)
        .arg("--registry-dir")
        .arg(&dirs.registry)
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{v}");
    let names = v
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "names")
        .unwrap();
    assert!(
        names["detail"].as_str().unwrap().contains(NODE)
            && names["detail"]
                .as_str()
                .unwrap()
                .contains(&format!("pid {}", plugin.child.id())),
        "{v}"
    );
    // And `gpushare doctor` itself (which finds gpushare-dra on PATH) passes its check.
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(bin("gpushare"))
        .args([
            "doctor",
            "--simulate",
            "p4d.24xlarge",
            "--dra-config",
            "/dev/null",
        ])
        .arg("--socket")
        .arg(&d.socket)
        .arg("--dra-plugins-dir")
        .arg(&dirs.plugins)
        .arg("--dra-registry-dir")
        .arg(&dirs.registry)
        .env("PATH", path)
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("dra-plugin"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("OK"), "{line}");

    let (ok, v) = probe("ip-10-0-9-9.us-west-2.compute.internal");
    assert!(!ok);
    let names = v
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "names")
        .unwrap();
    assert!(
        names["detail"]
            .as_str()
            .unwrap()
            .contains("node name mismatch"),
        "{v}"
    );

    // A plugin started with another node name than gpushared's stops with one line naming
    // both, exit status 2 (no restart loop: RestartPreventExitStatus=2).
    let dirs2 = Dirs::new(&api);
    let mut wrong = Plugin::start(
        &dirs2,
        &d.socket,
        &["--node-name", "ip-10-0-9-9.us-west-2.compute.internal"],
    );
    let st = wrong.wait_exit(Duration::from_secs(15)).expect("stops");
    assert_eq!(st.code(), Some(2), "{}", wrong.log());
    let log = wrong.log();
    let line = log
        .lines()
        .find(|l| l.starts_with("gpushare-dra: "))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("ip-10-0-9-9.us-west-2.compute.internal") && line.contains(NODE),
        "{line}"
    );
    assert!(!dirs2.reg_socket().exists(), "sockets removed");

    // A driver name gpushared does not serve (its health reports its [node] drivers).
    let dirs3 = Dirs::new(&api);
    let mut other = Plugin::start(&dirs3, &d.socket, &["--driver-name", "gpu.example.com"]);
    let st = other.wait_exit(Duration::from_secs(15)).expect("stops");
    assert_eq!(st.code(), Some(2), "{}", other.log());
    let log = other.log();
    let line = log
        .lines()
        .find(|l| l.starts_with("gpushare-dra: "))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("gpu.example.com") && line.contains("gpu.nvidia.com"),
        "{line}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_credentials_metrics_healthz_and_device_health() {
    if !need(is_root(), "root") {
        return;
    }
    let Some(valid) = valid_cases() else {
        need(false, "shared/cases");
        return;
    };
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    let seed = valid
        .iter()
        .find(|(f, _)| f == "seed-mps.yaml")
        .unwrap()
        .1
        .clone();
    api.add_claim(&seed, Some(NODE));
    let dirs = Dirs::new(&api);
    // kubelet's kubeconfig on AL2023 gets its token from an `exec` credential plugin.
    let helper = dirs.root.path().join("get-token");
    std::fs::write(
        &helper,
        format!("#!/bin/sh\necho '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"node:{NODE}\"}}}}'\n"),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(
        &dirs.kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n      interactiveMode: Never\n",
            api.addr,
            helper.display()
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let dirs2 = &dirs;
    let plugin = Plugin::start(
        dirs2,
        &d.socket,
        &["--device-health", "--metrics-address", &addr],
    );
    let kubelet = Kubelet::new(&dirs2.registry, Release::K134);
    let reg = kubelet
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    assert_eq!(
        reg.info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    let r = claim_ref(&seed);
    let a = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
    assert!(
        a[&r.uid].is_ok(),
        "exec credentials: {a:?}\n{}",
        plugin.log()
    );
    assert!(wait_until(Duration::from_secs(10), || !api
        .slices()
        .is_empty()));
    // `gpushare doctor`'s probe calls NodePrepareResources with no claim: not kubelet's
    // traffic, so not counted in gpushare_dra_calls_total.
    let probe = std::process::Command::new(bin("gpushare-dra"))
        .args([
            "--config",
            "/dev/null",
            "--node-name",
            NODE,
            "probe",
            "--json",
        ])
        .arg("--gpushared-socket")
        .arg(&d.socket)
        .arg("--plugins-dir")
        .arg(&dirs.plugins)
        .arg("--registry-dir")
        .arg(&dirs.registry)
        .output()
        .unwrap();
    assert!(probe.status.success(), "{probe:?}");

    let (code, body) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || http_get(&addr, "/healthz")
    })
    .await
    .unwrap();
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, metrics) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || http_get(&addr, "/metrics")
    })
    .await
    .unwrap();
    assert_eq!(code, 200);
    for needle in [
        "gpushare_dra_claims_total{method=\"NodePrepareResources\",outcome=\"ok\"} 1",
        "gpushare_dra_calls_total{method=\"NodePrepareResources\",version=\"v1\"} 1",
        "gpushare_dra_published_slices 1",
        "gpushare_dra_registered 1",
        "gpushare_dra_gpushared_up 1",
        "gpushare_dra_claim_duration_seconds_count{method=\"NodePrepareResources\"} 1",
        "# EOF",
    ] {
        assert!(metrics.contains(needle), "{needle} not in:\n{metrics}");
    }

    // Device health: the complete list, every published device HEALTHY.
    let ch = gpushare_dra::sockets::channel(&dirs2.dra_socket(), Duration::from_secs(5))
        .await
        .unwrap();
    let mut h =
        gpushare_dra::grpc::health::dra_resource_health_client::DraResourceHealthClient::new(ch);
    let mut stream = h
        .node_watch_resources(gpushare_dra::grpc::health::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let names: BTreeSet<String> = first
        .devices
        .iter()
        .map(|x| x.device.as_ref().unwrap().device_name.clone())
        .collect();
    assert!(
        names.contains("gpu-0") && names.contains("gpu-7"),
        "{names:?}"
    );
    assert!(
        first.devices.iter().all(|x| x.health
            == gpushare_dra::grpc::health::HealthStatus::Healthy as i32
            && x.device.as_ref().unwrap().pool_name == NODE),
        "{first:?}"
    );
    let _ = reg.unprepare(std::slice::from_ref(&r), None).await.unwrap();
    d.assert_nothing_left(&r.uid, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_kubelet_refuses_shows_in_healthz_and_metrics() {
    if !need(is_root(), "root") {
        return;
    }
    let d = daemon();
    let api = ApiServer::start(NODE).await;
    let dirs = Dirs::new(&api);
    let addr = format!("127.0.0.1:{}", free_port());
    let plugin = Plugin::start(&dirs, &d.socket, &["--metrics-address", &addr]);
    assert!(
        wait_until(Duration::from_secs(10), || dirs.reg_socket().exists()),
        "{}",
        plugin.log()
    );
    let ch = gpushare_dra::sockets::channel(&dirs.reg_socket(), Duration::from_secs(5))
        .await
        .unwrap();
    let mut reg =
        gpushare_dra::grpc::registration::registration_client::RegistrationClient::new(ch);
    // As kubelet does when ValidatePlugin or RegisterPlugin fails.
    let answer = reg
        .notify_registration_status(gpushare_dra::grpc::registration::RegistrationStatus {
            plugin_registered: false,
            error: "plugin gpu.nvidia.com already registered at another endpoint".into(),
        })
        .await;
    assert!(
        answer.is_err(),
        "a refusal is answered with an error, as the Go helper does"
    );
    let (code, body) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || http_get(&addr, "/healthz")
    })
    .await
    .unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("kubelet refused the registration: plugin gpu.nvidia.com already registered"),
        "{body}"
    );
    // The liveness probe fails too: a restart registers again.
    let (code, live) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || http_get(&addr, "/livez")
    })
    .await
    .unwrap();
    assert_eq!((code, live.as_str()), (503, body.as_str()));
    let (_, metrics) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || http_get(&addr, "/metrics")
    })
    .await
    .unwrap();
    assert!(metrics.contains("gpushare_dra_registered -1"), "{metrics}");
    assert!(
        plugin
            .log()
            .contains("kubelet refused the plugin's registration"),
        "{}",
        plugin.log()
    );
}
