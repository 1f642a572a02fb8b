//! Differential test against podman, which applies CDI devices with the reference Go library
//! (the copy vendored by Debian's podman 4.3.1, which reads cdiVersion up to 0.5.0).
//!
//! For each hand-written spec: the spec goes into `/var/run/cdi` under a unique kind; podman
//! creates a container once without and once with the device(s) (`podman init` makes it
//! write the OCI config; runc may then fail on the bare busybox rootfs, which does not
//! matter); our library applies the same spec to podman's device-less config; and the two
//! configs are compared on env, mounts, linux.devices, linux.resources.devices and hooks.
//!
//! Root and podman are required; otherwise the test prints a note and passes, unless
//! `GPUSHARE_E2E_REQUIRE=1`.
//!
//! Differences that podman or its vendored library introduce are handled explicitly, each
//! where it is compared:
//! - Container ids (full and short) appear in mount sources and in `HOSTNAME`; both sides are
//!   normalised to `<ID>`.
//! - podman builds its own env and mounts from Go maps, so their order differs from one
//!   container to the next: podman's own env entries are compared as a set, the CDI entries
//!   after them exactly; podman's own mounts as a set when the spec has no mounts.
//! - podman 4.3.1's vendored library predates three behaviours of the current reference
//!   library that ours follows: it orders mounts of equal depth by destination (ours keeps
//!   their existing order), it never fills `fileMode` from the host node, and it appends an
//!   env entry whose key the config already has instead of replacing it. The first two are
//!   normalised where compared; the third is asserted on its own below.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::{Path, PathBuf};
use std::process::Command;

use gpushare_cdi::{mount_depth, Registry};
use serde_json::Value;

fn skip_or_fail(reason: &str) -> bool {
    if std::env::var("GPUSHARE_E2E_REQUIRE").as_deref() == Ok("1") {
        panic!("podman differential test required but {reason}");
    }
    eprintln!("note: skipping the podman differential test: {reason}");
    false
}

fn prerequisites() -> bool {
    // SAFETY: geteuid has no preconditions, touches no memory of ours and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return skip_or_fail("not running as root");
    }
    match Command::new("podman").arg("--version").output() {
        Ok(out) if out.status.success() => true,
        _ => skip_or_fail("podman is not installed"),
    }
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().expect("spawn");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// A fresh busybox root filesystem with `sh` and `true`. Each podman container gets its own:
/// podman writes `/etc/passwd` and friends into a `--rootfs` directory, and a later container
/// on the same directory then gets a `HOME` entry from it, a difference unrelated to CDI.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let rootfs = dir.join(format!("rootfs{n}"));
    for sub in ["bin", "etc", "dev", "proc", "sys", "tmp"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox-static is installed");
    std::fs::copy(busybox, rootfs.join("bin/busybox")).unwrap();
    for link in ["sh", "true"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(link)).unwrap();
    }
    rootfs
}

/// Replaces every occurrence of the container id and its short form with `<ID>`.
fn normalise(value: &mut Value, id: &str) {
    match value {
        Value::String(s) => {
            *s = s.replace(id, "<ID>").replace(&id[..12], "<ID>");
        }
        Value::Array(items) => items.iter_mut().for_each(|v| normalise(v, id)),
        Value::Object(map) => map.values_mut().for_each(|v| normalise(v, id)),
        _ => {}
    }
}

/// podman's OCI config for a container with `devices` and `extra` flags, on a fresh rootfs
/// under `work`.
fn podman_config(work: &Path, devices: &[String], extra: &[&str]) -> Result<Value, String> {
    let rootfs = busybox_rootfs(work);
    let mut create = Command::new("podman");
    create.args([
        "create",
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "none",
    ]);
    create.args(extra);
    for d in devices {
        create.args(["--device", d]);
    }
    create.arg("--rootfs").arg(&rootfs).arg("/bin/true");
    let (ok, id, err) = run(&mut create);
    if !ok || id.len() < 12 {
        return Err(format!("podman create failed: {err}"));
    }
    // Writes config.json, then runs runc create (whose result does not matter here).
    let (_, _, init_err) = run(Command::new("podman").args(["init", &id]));
    let (_, inspected, _) =
        run(Command::new("podman").args(["inspect", "--format", "{{.OCIConfigPath}}", &id]));
    let path = if inspected.is_empty() {
        PathBuf::from(format!(
            "/var/lib/containers/storage/overlay-containers/{id}/userdata/config.json"
        ))
    } else {
        PathBuf::from(inspected)
    };
    let config = std::fs::read(&path)
        .map_err(|e| {
            format!(
                "no OCI config at {} ({e}); podman init said: {init_err}",
                path.display()
            )
        })
        .and_then(|data| serde_json::from_slice::<Value>(&data).map_err(|e| e.to_string()));
    let _ = run(Command::new("podman").args(["rm", "--force", &id]));
    let mut config = config?;
    normalise(&mut config, &id);
    Ok(config)
}

/// Spec files written into /var/run/cdi, removed on drop.
struct SpecFiles(Vec<PathBuf>);

impl Drop for SpecFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

struct Case {
    name: &'static str,
    /// Spec texts (JSON) with `KIND<n>` placeholders for the unique kinds.
    specs: Vec<String>,
    /// Requested devices, `KIND<n>=name`.
    devices: Vec<&'static str>,
    /// Extra `podman create` flags.
    extra: Vec<&'static str>,
}

fn env_list(config: &Value) -> Vec<String> {
    config["process"]["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn mounts(config: &Value) -> Vec<Value> {
    config["mounts"].as_array().cloned().unwrap_or_default()
}

fn destination(m: &Value) -> &str {
    m["destination"].as_str().unwrap_or_default()
}

fn section(config: &Value, path: &[&str]) -> Value {
    let mut v = config;
    for key in path {
        v = &v[*key];
    }
    v.clone()
}

/// Compares one case; returns the differences found (empty when equivalent).
fn compare(
    case: &Case,
    baseline: &Value,
    podman: &Value,
    ours: &Value,
    spec_has_mounts: bool,
) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut differ = |what: &str, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
        diffs.push(format!(
            "{}: {what}\n  podman: {a:?}\n  ours:   {b:?}",
            case.name
        ));
    };

    if ours == baseline {
        differ(
            "no CDI edit was applied (the comparison would be vacuous)",
            &"",
            &"",
        );
    }

    // env: podman's own entries first, in an order of their own (Go map), then the CDI ones.
    let base_env = env_list(baseline);
    let (p_env, o_env) = (env_list(podman), env_list(ours));
    let n = base_env.len();
    if p_env.len() < n || o_env.len() < n {
        differ("env lengths", &p_env, &o_env);
    } else {
        if sorted(p_env[..n].to_vec()) != sorted(base_env.clone()) {
            differ("podman's own env", &p_env[..n].to_vec(), &base_env);
        }
        if o_env[..n] != base_env[..] {
            differ(
                "our env prefix (baseline kept in place)",
                &base_env,
                &o_env[..n].to_vec(),
            );
        }
        if p_env[n..] != o_env[n..] {
            differ(
                "CDI env entries",
                &p_env[n..].to_vec(),
                &o_env[n..].to_vec(),
            );
        }
    }

    // mounts
    let (p_m, o_m) = (mounts(podman), mounts(ours));
    let depths: Vec<usize> = o_m.iter().map(|m| mount_depth(destination(m))).collect();
    if spec_has_mounts && depths.windows(2).any(|w| w[0] > w[1]) {
        differ("our mounts are not sorted by depth", &"", &o_m);
    }
    if spec_has_mounts {
        // podman 4.3.1's vendored library sorts by depth and then by destination; ours (like
        // the current reference) keeps the existing order within a depth. Both orders agree
        // once ties are broken by destination.
        let mut tie_broken = o_m.clone();
        tie_broken.sort_by(|a, b| {
            (mount_depth(destination(a)), destination(a))
                .cmp(&(mount_depth(destination(b)), destination(b)))
        });
        if p_m != tie_broken {
            differ("mounts (ties by destination)", &p_m, &tie_broken);
        }
    } else {
        let key = |v: &[Value]| sorted(v.iter().map(|m| m.to_string()).collect());
        if key(&p_m) != key(&o_m) {
            differ("mounts (as a set)", &p_m, &o_m);
        }
    }

    // linux.devices: podman 4.3.1's library never fills fileMode from the host node; ours
    // does (current reference behaviour). Drop ours where podman has none, after checking it
    // is a plain permission value.
    let p_dev = section(podman, &["linux", "devices"]);
    let mut o_dev = section(ours, &["linux", "devices"]);
    if let (Some(pa), Some(oa)) = (p_dev.as_array(), o_dev.as_array_mut()) {
        for (p, o) in pa.iter().zip(oa.iter_mut()) {
            if p.get("fileMode").is_none() {
                if let Some(mode) = o.as_object_mut().and_then(|m| m.remove("fileMode")) {
                    if mode.as_u64().is_none_or(|m| m > 0o7777) {
                        differ("odd fileMode", &"a permission value", &mode);
                    }
                }
            }
        }
    }
    if p_dev != o_dev {
        differ("linux.devices", &p_dev, &o_dev);
    }

    for path in [&["linux", "resources", "devices"][..], &["hooks"][..]] {
        let (p, o) = (section(podman, path), section(ours, path));
        if p != o {
            differ(&path.join("."), &p, &o);
        }
    }
    diffs
}

fn mknod(path: &Path, kind: &str, major: u32, minor: u32) {
    let (ok, _, err) =
        run(Command::new("mknod")
            .arg(path)
            .args([kind, &major.to_string(), &minor.to_string()]));
    assert!(ok, "mknod {}: {err}", path.display());
}

fn cases(nodes: &Path) -> Vec<Case> {
    let n = |name: &str| nodes.join(name).display().to_string();
    let hooks_all = r#"[
        {"hookName": "prestart", "path": "/bin/true", "args": ["true", "prestart"]},
        {"hookName": "createRuntime", "path": "/bin/true", "args": ["true", "createRuntime"], "env": ["HOOK=1"], "timeout": 10},
        {"hookName": "createContainer", "path": "/bin/true"},
        {"hookName": "startContainer", "path": "/bin/true", "args": ["true"]},
        {"hookName": "poststart", "path": "/bin/true", "timeout": 3},
        {"hookName": "poststop", "path": "/bin/true", "env": ["A=1", "B=2"]}
    ]"#;
    vec![
        Case {
            name: "v0.3.0 env, nodes, untyped mounts, every hook, spec-level edits",
            specs: vec![format!(
                r#"{{"cdiVersion": "0.3.0", "kind": "KIND0",
                  "containerEdits": {{"env": ["GPUSHARE_SPEC=1"], "mounts": [{{"hostPath": "/tmp", "containerPath": "/opt/gpushare/spec", "options": ["bind", "ro"]}}]}},
                  "devices": [{{"name": "dev", "containerEdits": {{
                    "env": ["GPUSHARE_A=1", "GPUSHARE_B=x=y", "GPUSHARE_A=2"],
                    "deviceNodes": [{{"path": "{null}"}}, {{"path": "/dev/null", "permissions": "rw"}}, {{"path": "{zero}", "permissions": "m"}}],
                    "mounts": [{{"hostPath": "/tmp", "containerPath": "/gpushare"}}, {{"hostPath": "/var/tmp", "containerPath": "/a/b/c/d", "options": ["rbind", "nosuid", "nodev"]}}],
                    "hooks": {hooks_all}
                  }}}}]}}"#,
                null = n("null"),
                zero = n("zero")
            )],
            devices: vec!["KIND0=dev"],
            extra: vec![],
        },
        Case {
            name: "v0.4.0 typed mounts, replacing podman's /dev/shm",
            specs: vec![r#"{"cdiVersion": "0.4.0", "kind": "KIND0", "devices": [{"name": "shm", "containerEdits": {
                "mounts": [
                    {"hostPath": "/tmp", "containerPath": "/dev/shm", "type": "bind", "options": ["rbind", "rw"]},
                    {"hostPath": "tmpfs", "containerPath": "/scratch", "type": "tmpfs", "options": ["size=64k", "mode=1777"]},
                    {"hostPath": "/var/tmp", "containerPath": "/srv/x/y", "type": "bind"}
                ]}}]}"#
                .to_string()],
            devices: vec!["KIND0=shm"],
            extra: vec![],
        },
        Case {
            name: "v0.5.0 host paths, digit names, minimal and explicit nodes",
            specs: vec![format!(
                r#"{{"cdiVersion": "0.5.0", "kind": "KIND0", "devices": [{{"name": "0", "containerEdits": {{
                    "deviceNodes": [
                        {{"path": "/dev/gpushare-null", "hostPath": "{null}"}},
                        {{"path": "/dev/gpushare-zero", "hostPath": "/dev/zero", "permissions": "rw"}},
                        {{"path": "/dev/gpushare-full", "type": "c", "major": 1, "minor": 7, "fileMode": 438, "uid": 1, "gid": 2}},
                        {{"path": "/dev/gpushare-blk", "hostPath": "{blk}", "permissions": "r"}},
                        {{"path": "/dev/gpushare-chr", "hostPath": "{chr}", "type": "c"}}
                    ],
                    "env": ["GPUSHARE_DEVICE=0"]}}}}]}}"#,
                null = n("null"),
                blk = n("blk"),
                chr = n("chr")
            )],
            devices: vec!["KIND0=0"],
            extra: vec![],
        },
        Case {
            name: "two specs, three devices: spec-level edits once each, request order",
            specs: vec![
                r#"{"cdiVersion": "0.3.0", "kind": "KIND0",
                    "containerEdits": {"env": ["SPEC0=1"], "hooks": [{"hookName": "createRuntime", "path": "/bin/true", "args": ["spec0"]}]},
                    "devices": [
                      {"name": "a", "containerEdits": {"env": ["DEV0A=1"], "mounts": [{"hostPath": "/tmp", "containerPath": "/m/a"}]}},
                      {"name": "b", "containerEdits": {"env": ["DEV0B=1"], "deviceNodes": [{"path": "/dev/zero"}]}}]}"#
                    .to_string(),
                r#"{"cdiVersion": "0.4.0", "kind": "KIND1",
                    "containerEdits": {"env": ["SPEC1=1"], "mounts": [{"hostPath": "/var/tmp", "containerPath": "/m", "type": "bind", "options": ["bind"]}]},
                    "devices": [{"name": "c", "containerEdits": {"env": ["DEV1C=1"], "hooks": [{"hookName": "createRuntime", "path": "/bin/true", "args": ["dev1c"]}]}}]}"#
                    .to_string(),
            ],
            devices: vec!["KIND1=c", "KIND0=b", "KIND0=a"],
            extra: vec![],
        },
        Case {
            // The shape gpushared writes for an MPS claim (daemon/src/cdi.rs): a digit-first
            // device name (the claim UID), simulated GPU nodes by hostPath with "rw", the MPS
            // env, the pipe dir and shm tmpfs as typed bind mounts, attach/detach hooks.
            name: "gpushared's own MPS claim spec",
            specs: vec![format!(
                r#"{{"cdiVersion": "0.5.0", "kind": "KIND0", "devices": [{{"name": "3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01", "containerEdits": {{
                    "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],
                    "deviceNodes": [
                        {{"path": "/dev/nvidiactl", "hostPath": "{null}", "permissions": "rw"}},
                        {{"path": "/dev/nvidia0", "hostPath": "{zero}", "permissions": "rw"}}
                    ],
                    "mounts": [
                        {{"hostPath": "/tmp", "containerPath": "/tmp/nvidia-mps", "type": "bind", "options": ["rbind", "rw", "nosuid", "nodev"]}},
                        {{"hostPath": "/var/tmp", "containerPath": "/dev/shm", "type": "bind", "options": ["rbind", "rw", "nosuid", "nodev"]}}
                    ],
                    "hooks": [
                        {{"hookName": "createRuntime", "path": "/usr/bin/gpushare-cdi-hook", "args": ["gpushare-cdi-hook", "attach", "--socket", "/run/gpushare/gpushared.sock", "--claim", "3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01"], "timeout": 10}},
                        {{"hookName": "poststop", "path": "/usr/bin/gpushare-cdi-hook", "args": ["gpushare-cdi-hook", "detach", "--socket", "/run/gpushare/gpushared.sock", "--claim", "3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01"], "timeout": 10}}
                    ]}}}}]}}"#,
                null = n("null"),
                zero = n("zero")
            )],
            devices: vec!["KIND0=3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01"],
            extra: vec![],
        },
        Case {
            name: "non-root process user: node owner defaults",
            specs: vec![format!(
                r#"{{"cdiVersion": "0.5.0", "kind": "KIND0", "devices": [{{"name": "u", "containerEdits": {{
                    "deviceNodes": [{{"path": "/dev/gpushare-null", "hostPath": "{null}"}}, {{"path": "/dev/gpushare-zero", "hostPath": "/dev/zero", "gid": 5}}]}}}}]}}"#,
                null = n("null")
            )],
            devices: vec!["KIND0=u"],
            extra: vec!["--user", "1000:1000"],
        },
    ]
}

/// Runs every case; returns the unexplained differences.
fn differential(work: &Path) -> Vec<String> {
    let nodes = work.join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    mknod(&nodes.join("null"), "c", 1, 3);
    mknod(&nodes.join("zero"), "c", 1, 5);
    mknod(&nodes.join("chr"), "c", 1, 8);
    mknod(&nodes.join("blk"), "b", 7, 200);
    let spec_dir = Path::new("/var/run/cdi");
    std::fs::create_dir_all(spec_dir).unwrap();

    let pid = std::process::id();
    let mut problems = Vec::new();
    for (index, case) in cases(&nodes).into_iter().enumerate() {
        let kinds: Vec<String> = (0..case.specs.len())
            .map(|k| format!("gpushare-test.io/dev{index}x{k}p{pid}"))
            .collect();
        let subst = |text: &str| {
            kinds
                .iter()
                .enumerate()
                .fold(text.to_string(), |t, (k, kind)| {
                    t.replace(&format!("KIND{k}"), kind)
                })
        };
        let ours_dir = work.join(format!("ours{index}"));
        std::fs::create_dir(&ours_dir).unwrap();
        let mut files = SpecFiles(Vec::new());
        let mut has_mounts = false;
        for (k, spec) in case.specs.iter().enumerate() {
            let text = subst(spec);
            has_mounts |= serde_json::from_str::<Value>(&text)
                .unwrap()
                .to_string()
                .contains("\"mounts\"");
            let file = spec_dir.join(format!("gpushare-test-{pid}-{index}-{k}.json"));
            std::fs::write(&file, &text).unwrap();
            files.0.push(file);
            std::fs::write(ours_dir.join(format!("{k}.json")), &text).unwrap();
        }
        let devices: Vec<String> = case.devices.iter().map(|d| subst(d)).collect();

        let baseline = podman_config(work, &[], &case.extra);
        let with_device = podman_config(work, &devices, &case.extra);
        drop(files);
        let (baseline, podman) = match (baseline, with_device) {
            (Ok(b), Ok(p)) => (b, p),
            (b, p) => {
                problems.push(format!(
                    "{}: podman failed: {:?} / {:?}",
                    case.name,
                    b.err(),
                    p.err()
                ));
                continue;
            }
        };
        let registry = Registry::load(&[&ours_dir]);
        assert!(registry.errors().is_empty(), "{:?}", registry.errors());
        let mut ours = baseline.clone();
        if let Err(e) = registry.inject(&mut ours, &devices) {
            problems.push(format!("{}: our injection failed: {e}", case.name));
            continue;
        }
        problems.extend(compare(&case, &baseline, &podman, &ours, has_mounts));
    }
    problems
}

#[test]
fn cdi_edits_match_podman() {
    if !prerequisites() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let problems = differential(work.path());
    assert!(
        problems.is_empty(),
        "{} difference(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The one env difference, shown precisely: a CDI env key already present in podman's env
/// (`TERM`) is appended again by podman 4.3.1's vendored library, but replaced in place by the
/// current reference library and by ours.
#[test]
fn existing_env_keys_podman_appends_we_replace() {
    if !prerequisites() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let kind = format!("gpushare-test.io/env{}", std::process::id());
    let text = format!(
        r#"{{"cdiVersion": "0.3.0", "kind": "{kind}", "devices": [{{"name": "e", "containerEdits": {{"env": ["TERM=cdi", "GPUSHARE_NEW=1"]}}}}]}}"#
    );
    let file =
        Path::new("/var/run/cdi").join(format!("gpushare-test-env-{}.json", std::process::id()));
    std::fs::create_dir_all("/var/run/cdi").unwrap();
    std::fs::write(&file, &text).unwrap();
    let guard = SpecFiles(vec![file]);
    let device = format!("{kind}=e");
    let baseline = podman_config(work.path(), &[], &[]).unwrap();
    let podman = podman_config(work.path(), std::slice::from_ref(&device), &[]).unwrap();
    drop(guard);

    let ours_dir = work.path().join("ours");
    std::fs::create_dir(&ours_dir).unwrap();
    std::fs::write(ours_dir.join("e.json"), &text).unwrap();
    let mut ours = baseline.clone();
    Registry::load(&[&ours_dir])
        .inject(&mut ours, &[device])
        .unwrap();

    let count = |env: &[String], key: &str| env.iter().filter(|e| e.starts_with(key)).count();
    let (p_env, o_env) = (env_list(&podman), env_list(&ours));
    assert_eq!(count(&p_env, "TERM="), 2, "podman appends: {p_env:?}");
    assert_eq!(p_env.last().map(String::as_str), Some("GPUSHARE_NEW=1"));
    assert_eq!(count(&o_env, "TERM="), 1, "we replace: {o_env:?}");
    assert!(o_env.contains(&"TERM=cdi".to_string()));
    assert_eq!(o_env.len(), env_list(&baseline).len() + 1);
}
