//! Runs the built `gpushare-runtime` with a fake low-level runtime: a shell script that records
//! its argv, its pid and the bundle's `config.json` as it finds them, then exits 0.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};

use gpushare_cdi::Registry;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_gpushare-runtime");

const FAKE_RUNTIME: &str = r#"#!/bin/sh
out="$FAKE_RUNTIME_OUT"
printf '%s\n' "$$" > "$out/pid"
grep '^SigIgn:' /proc/$$/status > "$out/sigign"
env > "$out/env"
printf '%s\n' "$0" > "$out/argv0"
: > "$out/argv"
for a in "$@"; do printf '%s\n' "$a" >> "$out/argv"; done
bundle=.
prev=
for a in "$@"; do
  case "$prev" in --bundle|-b) bundle="$a" ;; esac
  case "$a" in --bundle=*) bundle="${a#--bundle=}" ;; esac
  prev="$a"
done
if [ -f "$bundle/config.json" ]; then cp "$bundle/config.json" "$out/config.json"; fi
exit 0
"#;

/// A scratch world: fake runtime, spec dir, bundle, config file, log file.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let w = World {
            dir: tempfile::tempdir().unwrap(),
        };
        for sub in ["bin", "cdi", "bundle", "out", "logs"] {
            std::fs::create_dir(w.path(sub)).unwrap();
        }
        let runtime = w.path("bin/runc");
        std::fs::write(&runtime, FAKE_RUNTIME).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        w.write_config(&format!(
            "runtimes = [{:?}]\nspec_dirs = [{:?}]\nlog_level = \"info\"\n",
            runtime.display().to_string(),
            w.path("cdi").display().to_string()
        ));
        w.write_bundle(&base_config(&[]));
        w
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write_config(&self, text: &str) {
        std::fs::write(self.path("runtime.toml"), text).unwrap();
    }

    fn write_bundle(&self, config: &Value) {
        std::fs::write(
            self.path("bundle/config.json"),
            serde_json::to_vec_pretty(config).unwrap(),
        )
        .unwrap();
    }

    fn write_spec(&self, name: &str, text: &str) {
        std::fs::write(self.path("cdi").join(name), text).unwrap();
    }

    fn log_file(&self) -> PathBuf {
        self.path("logs/log.json")
    }

    /// containerd 1.6's argv for `create`.
    fn containerd_create_args(&self) -> Vec<String> {
        let bundle = self.path("bundle").display().to_string();
        vec![
            "--root".into(),
            "/run/containerd/runc/k8s.io".into(),
            "--log".into(),
            self.log_file().display().to_string(),
            "--log-format".into(),
            "json".into(),
            "create".into(),
            "--bundle".into(),
            bundle.clone(),
            "--pid-file".into(),
            format!("{bundle}/init.pid"),
            "ctr-1".into(),
        ]
    }

    fn run(&self, args: &[String]) -> Output {
        self.run_with_path(
            args,
            &format!("{}:/usr/bin:/bin", self.path("bin").display()),
        )
    }

    /// Runs the wrapper with this PATH (one without any runtime shows the missing-runtime path).
    fn run_with_path(&self, args: &[String], path: &str) -> Output {
        Command::new(BIN)
            .args(args)
            .env_clear()
            .env("PATH", path)
            .env("GPUSHARE_RUNTIME_CONFIG", self.path("runtime.toml"))
            .env("FAKE_RUNTIME_OUT", self.path("out"))
            .output()
            .unwrap()
    }

    fn recorded_argv(&self) -> Option<Vec<String>> {
        let text = std::fs::read_to_string(self.path("out/argv")).ok()?;
        Some(text.lines().map(String::from).collect())
    }

    fn recorded_config(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.path("out/config.json")).unwrap()).unwrap()
    }

    fn log_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(self.log_file())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn base_config(env: &[&str]) -> Value {
    let mut all = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "TERM=xterm",
    ];
    all.extend_from_slice(env);
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {"terminal": false, "user": {"uid": 0, "gid": 0}, "args": ["sh"], "env": all, "cwd": "/"},
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "runc",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
        ],
        "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "namespaces": [{"type": "pid"}, {"type": "mount"}]},
        "annotations": {"io.kubernetes.cri.container-type": "container"},
        "x-unknown-extension": {"kept": true}
    })
}

const CLAIM_SPEC: &str = r#"{
  "cdiVersion": "0.5.0",
  "kind": "gpushare.io/claim",
  "containerEdits": {"env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]},
  "devices": [{
    "name": "c1",
    "containerEdits": {
      "env": ["GPUSHARE_CLAIM=c1"],
      "deviceNodes": [{"path": "/dev/gpushare-null", "hostPath": "/dev/null"}],
      "mounts": [{"hostPath": "/run/gpushare/claims/c1/pipe", "containerPath": "/tmp/nvidia-mps", "options": ["rbind", "rw"]}],
      "hooks": [{"hookName": "createRuntime", "path": "/usr/bin/gpushare-cdi-hook", "args": ["gpushare-cdi-hook", "attach", "--claim", "c1"]}]
    }
  }]
}"#;

const OTHER_SPEC: &str = "cdiVersion: 0.3.0\nkind: vendor.example/gpu\ndevices:\n- name: g0\n  containerEdits:\n    env: [VENDOR_GPU=0]\n";

#[test]
fn devices_are_applied_and_the_arguments_untouched() {
    let w = World::new();
    w.write_spec("gpushare.io-claim.json", CLAIM_SPEC);
    w.write_spec("vendor.yaml", OTHER_SPEC);
    let mut original = base_config(&["GPUSHARE_VISIBLE_DEVICES=c1"]);
    original["annotations"]["cdi.k8s.io/vendor_g0"] = json!("vendor.example/gpu=g0");
    w.write_bundle(&original);
    let args = w.containerd_create_args();

    let mut child = Command::new(BIN);
    child
        .args(&args)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", w.path("bin").display()))
        .env("GPUSHARE_RUNTIME_CONFIG", w.path("runtime.toml"))
        .env("FAKE_RUNTIME_OUT", w.path("out"));
    let child = child.spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // exec: same process, runtime path as argv[0], arguments untouched.
    assert_eq!(
        std::fs::read_to_string(w.path("out/pid")).unwrap().trim(),
        pid.to_string()
    );
    assert_eq!(
        std::fs::read_to_string(w.path("out/argv0")).unwrap().trim(),
        w.path("bin/runc").display().to_string()
    );
    assert_eq!(w.recorded_argv().unwrap(), args);

    // The runtime saw the edited config: annotation devices first, then the env ones.
    let mut expected = original.clone();
    Registry::load(&[w.path("cdi")])
        .inject(
            &mut expected,
            &["vendor.example/gpu=g0", "gpushare.io/claim=c1"],
        )
        .unwrap();
    expected["annotations"]["io.gpushare.runtime.injected"] =
        serde_json::json!("vendor.example/gpu=g0, gpushare.io/claim=c1");
    let seen = w.recorded_config();
    assert_eq!(seen, expected);
    let env: Vec<&str> = seen["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        &env[3..],
        [
            "VENDOR_GPU=0",
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            "GPUSHARE_CLAIM=c1"
        ]
    );
    assert_eq!(seen["linux"]["devices"][0]["path"], "/dev/gpushare-null");
    assert_eq!(seen["linux"]["devices"][0]["major"], 1);
    assert_eq!(seen["hooks"]["createRuntime"][0]["args"][1], "attach");
    assert_eq!(seen["x-unknown-extension"], json!({"kept": true}));
    assert!(seen["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["destination"] == "/tmp/nvidia-mps"));

    // It was written back in place, and logged for the record.
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(w.path("bundle/config.json")).unwrap()).unwrap();
    assert_eq!(on_disk, expected);
    let lines = w.log_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "info");
    assert!(lines[0]["msg"]
        .as_str()
        .unwrap()
        .contains("vendor.example/gpu=g0, gpushare.io/claim=c1"));
}

#[test]
fn run_and_podman_style_arguments_inject_too() {
    let w = World::new();
    w.write_spec("claim.json", CLAIM_SPEC);
    w.write_bundle(&base_config(&[
        "GPUSHARE_VISIBLE_DEVICES=gpushare.io/claim=c1",
    ]));
    let bundle = w.path("bundle").display().to_string();
    let args: Vec<String> = vec![
        "--log-format=json".into(),
        "--log".into(),
        w.log_file().display().to_string(),
        "run".into(),
        "--detach".into(),
        format!("--bundle={bundle}"),
        "ctr-2".into(),
    ];
    let out = w.run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(w.recorded_argv().unwrap(), args);
    assert_eq!(
        w.recorded_config()["linux"]["devices"][0]["path"],
        "/dev/gpushare-null"
    );
}

#[test]
fn other_subcommands_pass_through_untouched() {
    let w = World::new();
    w.write_spec("claim.json", CLAIM_SPEC);
    w.write_bundle(&base_config(&["GPUSHARE_VISIBLE_DEVICES=c1"]));
    let before = std::fs::read(w.path("bundle/config.json")).unwrap();
    for args in [
        vec![
            "--root",
            "/run/containerd/runc/k8s.io",
            "--log",
            "/dev/null",
            "--log-format",
            "json",
            "start",
            "ctr-1",
        ],
        vec!["delete", "--force", "ctr-1"],
        vec!["--root", "/r", "state", "ctr-1"],
        vec!["features"],
    ] {
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        let out = w.run(&args);
        assert!(out.status.success());
        assert_eq!(w.recorded_argv().unwrap(), args);
    }
    assert_eq!(std::fs::read(w.path("bundle/config.json")).unwrap(), before);
}

/// The `SigIgn` mask the fake runtime found in its /proc status.
fn recorded_ignored_signals(w: &World) -> u64 {
    let line = std::fs::read_to_string(w.path("out/sigign")).unwrap();
    u64::from_str_radix(line.trim().trim_start_matches("SigIgn:").trim(), 16).unwrap()
}

#[test]
fn the_runtime_is_the_wrapper_process_with_its_environment_and_ignored_signals() {
    let w = World::new();
    let mut cmd = Command::new(BIN);
    cmd.args(["start", "ctr-1"])
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", w.path("bin").display()))
        .env("GPUSHARE_RUNTIME_CONFIG", w.path("runtime.toml"))
        .env("FAKE_RUNTIME_OUT", w.path("out"))
        .env("CALLER_SETTING", "kept as it is");
    // SAFETY: between fork and exec only async-signal-safe calls are allowed; signal(2) is one.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    // exec, not a child: the runtime has the pid the caller started.
    let recorded: u32 = std::fs::read_to_string(w.path("out/pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(recorded, pid);
    // The caller's environment, plus the loop marker, and nothing else.
    let mut env: Vec<String> = std::fs::read_to_string(w.path("out/env"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="))
        .map(String::from)
        .collect();
    env.sort();
    let mut expected = vec![
        "CALLER_SETTING=kept as it is".to_string(),
        format!("FAKE_RUNTIME_OUT={}", w.path("out").display()),
        "GPUSHARE_RUNTIME_ACTIVE=1".to_string(),
        format!(
            "GPUSHARE_RUNTIME_CONFIG={}",
            w.path("runtime.toml").display()
        ),
        format!("PATH={}:/usr/bin:/bin", w.path("bin").display()),
    ];
    expected.sort();
    assert_eq!(env, expected);
    // An ignored signal stays ignored through the wrapper (the wrapper installs no handler of
    // its own); SIGPIPE is set back to its default for the exec, by Rust's exec.
    let ignored = recorded_ignored_signals(&w);
    assert_ne!(ignored & (1 << (libc::SIGINT - 1)), 0, "SigIgn {ignored:x}");
    assert_eq!(
        ignored & (1 << (libc::SIGPIPE - 1)),
        0,
        "SigIgn {ignored:x}"
    );
}

#[test]
fn version_names_the_wrapper_then_the_low_level_runtime() {
    let w = World::new();
    for flag in ["--version", "-v"] {
        let out = w.run(&[flag.to_string()]);
        assert!(out.status.success(), "{flag}: {out:?}");
        // Ours first; then the low-level runtime, exec'd with the same arguments, prints its own.
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).lines().next(),
            Some(format!("gpushare-runtime {}", env!("CARGO_PKG_VERSION")).as_str()),
            "{flag}"
        );
        assert_eq!(w.recorded_argv().unwrap(), vec![flag.to_string()]);
    }
    // A subcommand's own -v is not the version flag.
    let out = w.run(&["exec".into(), "-v".into(), "ctr".into()]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty(), "{out:?}");
}

#[test]
fn no_device_execs_even_with_corrupt_specs_config_or_bundle() {
    let w = World::new();
    // Corrupt spec dir: garbage, an unknown field, a directory named like a spec, a fifo.
    w.write_spec("garbage.json", "{{{{");
    w.write_spec(
        "unknown.yaml",
        "cdiVersion: 0.3.0\nkind: a.com/b\nwhat: 1\ndevices: []\n",
    );
    std::fs::create_dir(w.path("cdi/dir.json")).unwrap();
    assert!(Command::new("mkfifo")
        .arg(w.path("cdi/fifo.json"))
        .status()
        .unwrap()
        .success());
    let untouched = std::fs::read(w.path("bundle/config.json")).unwrap();
    let args = w.containerd_create_args();

    let out = w.run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(w.recorded_argv().unwrap(), args);
    assert_eq!(
        std::fs::read(w.path("bundle/config.json")).unwrap(),
        untouched
    );

    // Corrupt config too (unknown key): defaults are used, so "runc" is found on PATH.
    w.write_config("runtimes = [\"runc\"]\nspec_dir = [\"/x\"]\n");
    std::fs::remove_file(w.path("out/argv")).unwrap();
    let out = w.run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(w.recorded_argv().unwrap(), args);
    assert_eq!(
        std::fs::read(w.path("bundle/config.json")).unwrap(),
        untouched
    );
    let warning = w
        .log_lines()
        .into_iter()
        .find(|l| l["level"] == "warning")
        .expect("a warning");
    assert!(
        warning["msg"].as_str().unwrap().contains("spec_dir"),
        "{warning}"
    );
    assert!(out.stderr.is_empty());

    // Not even a readable bundle config: the low-level runtime reports that itself.
    std::fs::write(w.path("bundle/config.json"), "{not json").unwrap();
    std::fs::remove_file(w.path("out/argv")).unwrap();
    let out = w.run(&args);
    assert!(out.status.success());
    assert_eq!(w.recorded_argv().unwrap(), args);
    std::fs::remove_file(w.path("bundle/config.json")).unwrap();
    std::fs::remove_file(w.path("out/argv")).unwrap();
    let out = w.run(&args);
    assert!(out.status.success());
    assert_eq!(w.recorded_argv().unwrap(), args);
}

fn assert_failed_with(w: &World, out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(1));
    assert!(w.recorded_argv().is_none(), "nothing may be exec'd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(needle), "{stderr}");
    let last_error = w
        .log_lines()
        .into_iter()
        .rev()
        .find(|l| l["level"] == "error")
        .expect("an error line");
    assert!(
        last_error["msg"].as_str().unwrap().contains(needle),
        "{last_error}"
    );
    let time = last_error["time"].as_str().unwrap();
    assert!(
        time.len() == 20 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{time}"
    );
}

#[test]
fn an_unknown_device_fails_the_start_naming_it() {
    let w = World::new();
    w.write_spec("claim.json", CLAIM_SPEC);
    w.write_config(&format!(
        "runtimes = [{:?}]\nspec_dirs = [{:?}]\nlog_file = {:?}\n",
        w.path("bin/runc").display().to_string(),
        w.path("cdi").display().to_string(),
        w.path("logs/extra.log").display().to_string()
    ));
    w.write_bundle(&base_config(&["GPUSHARE_VISIBLE_DEVICES=c1,missing-claim"]));
    let before = std::fs::read(w.path("bundle/config.json")).unwrap();
    let out = w.run(&w.containerd_create_args());
    assert_failed_with(
        &w,
        &out,
        "unresolvable CDI devices gpushare.io/claim=missing-claim",
    );
    assert_eq!(std::fs::read(w.path("bundle/config.json")).unwrap(), before);
    // The configured log file gets the same error line.
    let extra = std::fs::read_to_string(w.path("logs/extra.log")).unwrap();
    let line: Value = serde_json::from_str(extra.lines().last().unwrap()).unwrap();
    assert_eq!(line["level"], "error");
    assert!(line["msg"].as_str().unwrap().contains("missing-claim"));
}

#[test]
fn other_device_failures_stop_the_start() {
    let w = World::new();
    // A device whose host node is gone.
    w.write_spec(
        "gone.json",
        r#"{"cdiVersion":"0.3.0","kind":"gpushare.io/claim","devices":[{"name":"gone","containerEdits":{"deviceNodes":[{"path":"/dev/gpushare-test-gone"}]}}]}"#,
    );
    w.write_bundle(&base_config(&["GPUSHARE_VISIBLE_DEVICES=gone"]));
    let out = w.run(&w.containerd_create_args());
    assert_failed_with(
        &w,
        &out,
        "failed to stat CDI host device \"/dev/gpushare-test-gone\"",
    );

    // A malformed annotation request.
    let mut config = base_config(&[]);
    config["annotations"]["cdi.k8s.io/x"] = json!("not-qualified");
    w.write_bundle(&config);
    let out = w.run(&w.containerd_create_args());
    assert_failed_with(&w, &out, "not-qualified");

    // A broken config when a device is requested: refuse rather than guess spec dirs.
    w.write_spec("claim.json", CLAIM_SPEC);
    w.write_bundle(&base_config(&["GPUSHARE_VISIBLE_DEVICES=c1"]));
    w.write_config(&format!(
        "runtimes = [{:?}]\nbogus_key = 1\n",
        w.path("bin/runc").display().to_string()
    ));
    let out = w.run(&w.containerd_create_args());
    assert_failed_with(&w, &out, "bogus_key");
}

#[test]
fn a_missing_low_level_runtime_is_one_readable_line() {
    let w = World::new();
    w.write_config("runtimes = [\"/nonexistent/runc\", \"no-such-runtime\"]\n");
    let empty = w.path("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    for args in [
        w.containerd_create_args(),
        vec!["delete".to_string(), "--force".to_string(), "x".to_string()],
    ] {
        let out = w.run_with_path(&args, &empty.display().to_string());
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("gpushare-runtime: no low-level OCI runtime found: none of /nonexistent/runc, no-such-runtime is an executable"),
            "{stderr}"
        );
    }
    let last = w.log_lines().pop().unwrap();
    assert_eq!(last["level"], "error");
    assert!(last["msg"]
        .as_str()
        .unwrap()
        .contains("no low-level OCI runtime found"));
}

#[test]
fn text_log_format_is_honoured() {
    let w = World::new();
    w.write_config("runtimes = [\"/nonexistent/runc\"]\n");
    let log = w.path("logs/text.log");
    let args: Vec<String> = [
        "--log",
        log.to_str().unwrap(),
        "--log-format",
        "text",
        "state",
        "x",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let empty = w.path("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let out = w.run_with_path(&args, &empty.display().to_string());
    assert_eq!(out.status.code(), Some(1));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("time=\""), "{text}");
    assert!(
        text.contains(" level=error msg=\"no low-level OCI runtime found"),
        "{text}"
    );
}

#[test]
fn a_second_create_on_the_same_bundle_does_not_inject_twice() {
    let w = World::new();
    let args = w.containerd_create_args();
    assert!(w.run(&args).status.success());
    let once = w.recorded_config();
    assert!(w.run(&args).status.success());
    assert_eq!(
        w.recorded_config(),
        once,
        "the second create saw the same config"
    );
}

#[test]
fn a_runtime_leading_back_here_is_stopped_not_looped() {
    let w = World::new();
    // A wrapper script that execs gpushare-runtime again, as a misconfigured chain would.
    let again = w.path("bin/again");
    std::fs::write(&again, format!("#!/bin/sh\nexec {BIN} \"$@\"\n")).unwrap();
    std::fs::set_permissions(&again, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    w.write_config(&format!("runtimes = [{:?}]\n", again.display().to_string()));
    let out = w.run(&["state".to_string(), "x".to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("exec loop"), "{stderr}");
}

#[test]
fn an_unreadable_config_that_asks_for_devices_fails_instead_of_starting_without_them() {
    let w = World::new();
    // Valid for runc's JSON reader, not for a strict one: a lone surrogate escape.
    std::fs::write(
        w.path("bundle/config.json"),
        r#"{"ociVersion":"1.0.2","process":{"env":["X=\ud800"]},"annotations":{"cdi.k8s.io/x":"vendor.example/gpu=g0"}}"#,
    )
    .unwrap();
    let out = w.run(&w.containerd_create_args());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read") && stderr.contains("config.json"),
        "{stderr}"
    );
    // Without a request, the same unreadable file is runc's business.
    std::fs::write(
        w.path("bundle/config.json"),
        r#"{"process":{"env":["X=\ud800"]}}"#,
    )
    .unwrap();
    assert!(w.run(&w.containerd_create_args()).status.success());
}
