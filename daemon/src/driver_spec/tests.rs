use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::*;
use crate::gpu::{GpuBackend, SimulatedBackend};

/// A generator that writes `text` (its kind replaced by what is asked), counting runs;
/// `inputs` stands for the program and driver it depends on.
#[derive(Debug)]
struct Canned {
    text: Mutex<Result<String, GenerateError>>,
    runs: AtomicUsize,
    inputs: Mutex<String>,
}

impl Canned {
    fn new(r: Result<String, GenerateError>) -> Arc<Canned> {
        Arc::new(Canned {
            text: Mutex::new(r),
            runs: AtomicUsize::new(0),
            inputs: Mutex::new("nvidia-ctk@1".into()),
        })
    }
}

/// A clock that moves only when told.
#[derive(Debug)]
struct ManualClock(Mutex<Instant>);

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap()
    }
}

impl ManualClock {
    fn new() -> Arc<ManualClock> {
        Arc::new(ManualClock(Mutex::new(Instant::now())))
    }
    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

impl SpecGenerator for Canned {
    fn describe(&self) -> String {
        "canned".into()
    }
    fn inputs(&self) -> String {
        self.inputs.lock().unwrap().clone()
    }
    fn generate(&self, _vendor: &str, _class: &str, output: &Path) -> Result<(), GenerateError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let text = self.text.lock().unwrap().clone()?;
        std::fs::write(output, text).unwrap();
        Ok(())
    }
}

fn gpu_spec(kind: &str, names: &[&str]) -> String {
    let devices: Vec<String> = names
        .iter()
        .map(|n| {
            format!(
                r#"{{"name":"{n}","containerEdits":{{"deviceNodes":[{{"path":"/dev/nvidia0"}}]}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"cdiVersion":"0.5.0","kind":"{kind}","containerEdits":{{"env":["NVIDIA_VISIBLE_DEVICES=void"],
           "mounts":[{{"hostPath":"/tmp/nvidia-mps","containerPath":"/tmp/nvidia-mps","options":["rbind"]}},
                     {{"hostPath":"/usr/lib64/libcuda.so.570.172.08","containerPath":"/usr/lib64/libcuda.so.570.172.08","options":["ro","rbind"]}}]}},
           "devices":[{}]}}"#,
        devices.join(",")
    )
}

fn specs(dir: &Path, generator: Arc<dyn SpecGenerator>) -> DriverSpecs {
    DriverSpecs::new(
        generator,
        DEFAULT_KIND,
        &dir.join("cdi"),
        &dir.join("run/driver-spec"),
    )
    .unwrap()
}

#[test]
fn kinds_are_vendor_slash_class() {
    assert_eq!(
        split_kind("gpushare.io/gpu").unwrap(),
        ("gpushare.io", "gpu")
    );
    assert!(split_kind("gpushare.io").is_err());
    assert!(split_kind("gpushare.io/").is_err());
    assert!(split_kind("/gpu").is_err());
    assert!(split_kind("gp u/gpu").is_err());
}

/// The messages `[cdi] driver_kind` errors and `gpushare doctor` show, and the CDI name error
/// kept as the source.
#[test]
fn a_refused_kind_names_it_and_keeps_why() {
    let e = split_kind("gpushare.io").unwrap_err();
    assert_eq!(e.to_string(), r#""gpushare.io" is not vendor/class"#);
    let e = split_kind("gp u/gpu").unwrap_err();
    let source = std::error::Error::source(&e).expect("the CDI name error");
    assert!(
        e.to_string()
            .starts_with(r#""gp u/gpu": invalid vendor "gp u""#),
        "{e}"
    );
    assert_eq!(e.to_string(), format!(r#""gp u/gpu": {source}"#));
}

#[test]
fn the_hosts_mps_pipe_is_removed_wherever_it_is_mounted() {
    let mut spec = gpushare_cdi::parse_spec(
        gpu_spec(DEFAULT_KIND, &["GPU-1"]).as_bytes(),
        gpushare_cdi::SpecFormat::Json,
    )
    .unwrap();
    spec.devices[0].container_edits.mounts.push(Mount {
        host_path: "/elsewhere".into(),
        container_path: "/tmp/nvidia-mps/".into(),
        mount_type: String::new(),
        options: vec![],
    });
    assert_eq!(strip_host_mps(&mut spec), 2);
    assert_eq!(spec.container_edits.mounts.len(), 1);
    assert!(spec.devices[0].container_edits.mounts.is_empty());
    assert_eq!(strip_host_mps(&mut spec), 0);
}
use gpushare_cdi::Mount;

#[test]
fn a_generated_spec_is_cleaned_validated_and_installed_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let canned = Canned::new(Ok(gpu_spec(DEFAULT_KIND, &["GPU-1", "MIG-2"])));
    let d = specs(dir.path(), canned.clone());
    let spec = d.refresh().unwrap();
    assert_eq!(d.spec_path(), dir.path().join("cdi/gpushare.io-gpu.json"));
    let on_disk = gpushare_cdi::load_spec_file(&d.spec_path()).unwrap();
    assert_eq!(on_disk, spec);
    assert!(
        on_disk
            .container_edits
            .mounts
            .iter()
            .all(|m| m.container_path != "/tmp/nvidia-mps"),
        "the host's MPS pipe never reaches a claim: {on_disk:?}"
    );
    assert_eq!(on_disk.container_edits.mounts.len(), 1);
    assert_eq!(
        std::fs::read_dir(dir.path().join("run/driver-spec"))
            .unwrap()
            .count(),
        0,
        "the generator's output is removed once read"
    );
    assert_eq!(
        d.device_ids(&[
            ("gpu-0".into(), "GPU-1".into()),
            ("m".into(), "MIG-2".into())
        ])
        .unwrap(),
        vec!["gpushare.io/gpu=GPU-1", "gpushare.io/gpu=MIG-2"]
    );
    assert_eq!(
        canned.runs.load(Ordering::SeqCst),
        1,
        "no generation needed"
    );
}

#[test]
fn a_missing_device_is_generated_for_once_then_named() {
    let dir = tempfile::tempdir().unwrap();
    let canned = Canned::new(Ok(gpu_spec(DEFAULT_KIND, &["GPU-1"])));
    let d = specs(dir.path(), canned.clone());
    d.refresh().unwrap();
    let e = d
        .device_ids(&[("gpu-3".into(), "GPU-3".into())])
        .unwrap_err();
    assert_eq!(
        canned.runs.load(Ordering::SeqCst),
        2,
        "once more, then refused"
    );
    let text = e.to_string();
    assert!(
        text.contains("gpu-3 (GPU-3) not in the NVIDIA driver's CDI spec")
            && text.contains("gpushare.io-gpu.json")
            && text.contains("it has GPU-1"),
        "{text}"
    );
    // The next generation has it (say the spec was older than a MIG device).
    *canned.text.lock().unwrap() = Ok(gpu_spec(DEFAULT_KIND, &["GPU-1", "GPU-3"]));
    assert_eq!(
        d.device_ids(&[("gpu-3".into(), "GPU-3".into())]).unwrap(),
        vec!["gpushare.io/gpu=GPU-3"]
    );
}

#[test]
fn no_toolkit_a_failure_and_a_wrong_kind_keep_the_installed_spec() {
    let dir = tempfile::tempdir().unwrap();
    let canned = Canned::new(Err(GenerateError::NotInstalled(
        "nvidia-ctk is in none of /usr/bin".into(),
    )));
    let clock = ManualClock::new();
    let d = specs(dir.path(), canned.clone()).with_retry(RetryPolicy::default(), clock.clone());
    let e = d.current().unwrap_err();
    assert!(matches!(e, DriverSpecError::NotInstalled(_)));
    let line = e.to_string();
    assert!(
        line.contains("NVIDIA Container Toolkit not found")
            && line.contains("install nvidia-container-toolkit")
            && line.contains("driver_spec = \"none\"")
            && !line.contains('\n'),
        "{line}"
    );
    assert!(!d.spec_path().exists());
    *canned.text.lock().unwrap() = Ok(gpu_spec(DEFAULT_KIND, &["GPU-1"]));
    d.current().unwrap();
    let good = std::fs::read(d.spec_path()).unwrap();
    for bad in [
        Ok(gpu_spec("nvidia.com/gpu", &["GPU-1"])),
        Ok("{not json".to_string()),
        Err(GenerateError::Failed("exit 1".into())),
    ] {
        *canned.text.lock().unwrap() = bad;
        // Each after the wait of the one before.
        clock.advance(Duration::from_secs(300));
        assert!(d.refresh().is_err());
        assert_eq!(
            std::fs::read(d.spec_path()).unwrap(),
            good,
            "left as it was"
        );
    }
    // A deleted spec file is generated again when next needed.
    clock.advance(Duration::from_secs(300));
    std::fs::remove_file(d.spec_path()).unwrap();
    *canned.text.lock().unwrap() = Ok(gpu_spec(DEFAULT_KIND, &["GPU-1"]));
    d.current().unwrap();
    assert!(d.spec_path().is_file());
}

#[test]
fn the_simulated_toolkit_writes_the_toolkits_layout_for_a_simulated_driver_root() {
    let dir = tempfile::tempdir().unwrap();
    let backend: Arc<dyn GpuBackend> = Arc::new(
        SimulatedBackend::without_device_nodes("p4d.24xlarge", "n", &dir.path().join("dev"))
            .unwrap(),
    );
    let root = dir.path().join("driver");
    // A node-wide MPS daemon's pipe directory at generation time.
    std::fs::create_dir_all(root.join("tmp/nvidia-mps")).unwrap();
    let sim = Arc::new(sim::SimulatedToolkit::new(backend.clone(), &root));
    let raw = dir.path().join("raw.json");
    sim.generate("gpushare.io", "gpu", &raw).unwrap();
    let generated = gpushare_cdi::load_spec_file(&raw).unwrap();
    assert!(
        generated
            .container_edits
            .mounts
            .iter()
            .any(|m| m.container_path == "/tmp/nvidia-mps"),
        "the generator mounts it, as NVIDIA's does"
    );
    let d = specs(dir.path(), sim);
    let spec = d.refresh().unwrap();
    let v = &backend.gpus()[0].driver_version;
    let mounts: Vec<(&str, &str)> = spec
        .container_edits
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str()))
        .collect();
    for rel in [
        format!("usr/lib64/libcuda.so.{v}"),
        "usr/lib64/libcuda.so.1".to_string(),
        format!("usr/lib64/libnvidia-ml.so.{v}"),
        "usr/bin/nvidia-smi".to_string(),
        format!("lib/firmware/nvidia/{v}/gsp_ga10x.bin"),
    ] {
        let host = root.join(&rel);
        assert!(host.exists(), "{}", host.display());
        assert!(
            mounts.contains(&(
                format!("/{rel}").as_str(),
                host.display().to_string().as_str()
            )),
            "{rel} in {mounts:?}"
        );
    }
    assert!(mounts.iter().all(|(c, _)| *c != "/tmp/nvidia-mps"));
    assert_eq!(
        std::fs::read_link(root.join("usr/lib64/libcuda.so.1")).unwrap(),
        PathBuf::from(format!("libcuda.so.{v}"))
    );
    assert!(
        spec.container_edits.hooks.is_empty(),
        "no nvidia-cdi-hook here"
    );
    assert!(spec
        .container_edits
        .env
        .contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
    assert_eq!(spec.container_edits.device_nodes[0].path, "/dev/nvidiactl");
    let gpu3 = &backend.gpus()[3];
    let dev = spec.devices.iter().find(|d| d.name == gpu3.uuid).unwrap();
    assert_eq!(dev.container_edits.device_nodes[0].path, "/dev/nvidia3");
    assert_eq!(
        dev.container_edits.device_nodes[0].host_path,
        dir.path().join("dev/nvidia3").display().to_string()
    );
    assert_eq!(spec.devices.len(), 9, "8 GPUs and all");
    assert_eq!(spec.cdi_version, "0.5.0", "podman 4.3 reads it");
    // Generating again over the same root changes nothing.
    assert_eq!(d.refresh().unwrap(), spec);
}

#[test]
fn a_failing_generator_runs_again_after_its_wait_or_a_change_not_for_every_use() {
    let dir = tempfile::tempdir().unwrap();
    let mismatch = "Failed to initialize NVML: Driver/library version mismatch";
    let canned = Canned::new(Err(GenerateError::Failed(mismatch.into())));
    let clock = ManualClock::new();
    let d = specs(dir.path(), canned.clone()).with_retry(RetryPolicy::default(), clock.clone());
    let runs = || canned.runs.load(Ordering::SeqCst);
    let status = d.status();
    assert!(
        !status.ok && status.error.is_none(),
        "not tried yet: {status:?}"
    );
    assert!(d.refresh().unwrap_err().to_string().contains(mismatch));
    assert_eq!(runs(), 1);
    let status = d.status();
    assert!(!status.ok, "{status:?}");
    assert_eq!(status.error.as_deref(), Some(mismatch));
    assert_eq!(
        (status.failures, status.retry_in),
        (1, Some(Duration::from_secs(10)))
    );
    // Prepares meanwhile get the failure at once, saying when it is tried again.
    clock.advance(Duration::from_secs(4));
    for _ in 0..5 {
        let e = d
            .device_ids(&[("gpu-0".into(), "GPU-1".into())])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(mismatch) && e.contains("runs it again in 6 s"),
            "{e}"
        );
        assert!(d.current().is_err());
        assert!(d.refresh().is_err());
    }
    assert!(!d.retry_if_due());
    assert_eq!(runs(), 1, "not run again before its wait is over");
    // The retry thread runs it once the wait is over; the next wait is twice as long.
    clock.advance(Duration::from_secs(6));
    assert!(d.retry_if_due());
    assert_eq!(runs(), 2);
    assert_eq!(
        (d.status().failures, d.status().retry_in),
        (2, Some(Duration::from_secs(20)))
    );
    // A reload runs it at once.
    assert!(d.retry_now().unwrap().is_err());
    assert_eq!((runs(), d.status().failures), (3, 3));
    // So does a change of what it depends on (an updated toolkit or driver), and it works.
    *canned.text.lock().unwrap() = Ok(gpu_spec(DEFAULT_KIND, &["GPU-1"]));
    assert!(d.current().is_err(), "nothing changed yet");
    *canned.inputs.lock().unwrap() = "nvidia-ctk@2".into();
    assert_eq!(
        d.device_ids(&[("gpu-0".into(), "GPU-1".into())]).unwrap(),
        vec!["gpushare.io/gpu=GPU-1"]
    );
    assert_eq!(runs(), 4);
    let status = d.status();
    assert!(status.ok, "{status:?}");
    assert_eq!(
        (status.error, status.failures, status.retry_in),
        (None, 0, None)
    );
    assert!(d.retry_now().is_none(), "nothing to retry");
    assert!(!d.retry_if_due());
    assert_eq!(runs(), 4);
}

#[test]
fn aliases_are_installed_without_running_the_generator_and_follow_each_generation() {
    let dir = tempfile::tempdir().unwrap();
    let canned = Canned::new(Ok(gpu_spec(DEFAULT_KIND, &["GPU-1", "MIG-new"])));
    let d = specs(dir.path(), canned.clone());
    d.refresh().unwrap();
    let aliases = BTreeMap::from([("MIG-old".to_string(), "MIG-new".to_string())]);
    d.set_aliases(aliases.clone()).unwrap();
    assert_eq!(
        canned.runs.load(Ordering::SeqCst),
        1,
        "installed from memory"
    );
    let names = || -> Vec<String> {
        gpushare_cdi::load_spec_file(&d.spec_path())
            .unwrap()
            .devices
            .into_iter()
            .map(|x| x.name)
            .collect()
    };
    assert_eq!(names(), ["GPU-1", "MIG-new", "MIG-old"]);
    assert_eq!(
        d.device_ids(&[("m".into(), "MIG-old".into())]).unwrap(),
        vec!["gpushare.io/gpu=MIG-old"]
    );
    d.set_aliases(aliases).unwrap();
    assert_eq!(canned.runs.load(Ordering::SeqCst), 1);
    // The next generation keeps them; one whose device is gone is left out.
    *canned.text.lock().unwrap() = Ok(gpu_spec(DEFAULT_KIND, &["GPU-1"]));
    d.refresh().unwrap();
    assert_eq!(names(), ["GPU-1"]);
    *canned.text.lock().unwrap() = Ok(gpu_spec(DEFAULT_KIND, &["GPU-1", "MIG-new"]));
    d.refresh().unwrap();
    assert_eq!(names(), ["GPU-1", "MIG-new", "MIG-old"]);
    d.set_aliases(BTreeMap::new()).unwrap();
    assert_eq!(names(), ["GPU-1", "MIG-new"]);
}

/// A generator that writes `text` as it is when a run starts, one run (`gated`) waiting until
/// the test lets it end: a slow `nvidia-ctk`. Counts runs started and ended.
#[derive(Debug)]
struct Gated {
    text: Mutex<Result<String, GenerateError>>,
    gated: usize,
    started: AtomicUsize,
    ended: AtomicUsize,
    /// Told when the gated run starts.
    running: Mutex<std::sync::mpsc::Sender<()>>,
    /// What the gated run waits on.
    release: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Gated {
    /// The generator, what tells that its gated run started, and what ends that run.
    fn new(
        text: Result<String, GenerateError>,
        gated: usize,
    ) -> (
        Arc<Gated>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (running_tx, running_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        let g = Arc::new(Gated {
            text: Mutex::new(text),
            gated,
            started: AtomicUsize::new(0),
            ended: AtomicUsize::new(0),
            running: Mutex::new(running_tx),
            release: Mutex::new(release_rx),
        });
        (g, running_rx, release_tx)
    }
}

impl SpecGenerator for Gated {
    fn describe(&self) -> String {
        "gated".into()
    }
    fn generate(&self, _vendor: &str, _class: &str, output: &Path) -> Result<(), GenerateError> {
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        let text = self.text.lock().unwrap().clone();
        if n == self.gated {
            self.running.lock().unwrap().send(()).unwrap();
            // Bounded: a test that fails never lets it go.
            let _ = self
                .release
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60));
        }
        let r = text.map(|t| std::fs::write(output, t).unwrap());
        self.ended.fetch_add(1, Ordering::SeqCst);
        r
    }
}

/// A prepare whose device (a MIG slice just made) is not in the installed spec, while a
/// generation that started before the slice existed is under way (another prepare's, a MIG
/// change's), runs one generation of its own: it never waits for that one and then runs
/// another, which took it to twice `generate_timeout_seconds` against the plugin's claim
/// timeout. The older generation ending last does not replace the newer spec.
#[test]
fn a_prepare_waits_on_one_generation_not_on_one_under_way_and_then_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (gated, running, release) = Gated::new(Ok(gpu_spec(DEFAULT_KIND, &["GPU-1"])), 2);
    let d = Arc::new(specs(dir.path(), gated.clone()));
    d.refresh().unwrap();
    // The slow generation starts; the node has no slice yet.
    let slow = {
        let d = Arc::clone(&d);
        std::thread::spawn(move || d.refresh())
    };
    running.recv_timeout(Duration::from_secs(60)).unwrap();
    // The slice is made, and its prepare asks for it.
    *gated.text.lock().unwrap() = Ok(gpu_spec(DEFAULT_KIND, &["GPU-1", "MIG-new"]));
    let (tx, rx) = std::sync::mpsc::channel();
    let prepare = {
        let d = Arc::clone(&d);
        let gated = gated.clone();
        std::thread::spawn(move || {
            let before = gated.ended.load(Ordering::SeqCst);
            let ids = d.device_ids(&[("gpu-2-mig-1g5gb-19-0".into(), "MIG-new".into())]);
            let waited_on = gated.ended.load(Ordering::SeqCst) - before;
            tx.send((ids, waited_on)).unwrap();
        })
    };
    // Only ever let go of the slow one when the prepare is stuck behind it.
    let (ids, waited_on) = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(r) => r,
        Err(_) => {
            release.send(()).unwrap();
            rx.recv_timeout(Duration::from_secs(60)).unwrap()
        }
    };
    assert_eq!(ids.unwrap(), vec!["gpushare.io/gpu=MIG-new"]);
    assert_eq!(
        waited_on, 1,
        "the prepare waited on its own generation only"
    );
    let _ = release.send(());
    prepare.join().unwrap();
    // The slow one answers with the newer spec and leaves it installed.
    let spec = slow.join().unwrap().unwrap();
    assert!(spec.devices.iter().any(|x| x.name == "MIG-new"));
    let on_disk = gpushare_cdi::load_spec_file(&d.spec_path()).unwrap();
    assert_eq!(on_disk, spec);
    assert_eq!(gated.started.load(Ordering::SeqCst), 3);
    assert!(d.status().ok);
}

/// While the generator fails, a prepare that finds the due retry's generation under way
/// takes its outcome: a failing generator is not run once more for every prepare.
#[test]
fn while_failing_a_prepare_takes_the_outcome_of_the_retry_under_way() {
    let dir = tempfile::tempdir().unwrap();
    let mismatch = "Failed to initialize NVML: Driver/library version mismatch";
    let (gated, running, release) = Gated::new(Err(GenerateError::Failed(mismatch.into())), 2);
    let clock = ManualClock::new();
    let d = Arc::new(
        specs(dir.path(), gated.clone()).with_retry(RetryPolicy::default(), clock.clone()),
    );
    assert!(d.refresh().is_err());
    clock.advance(Duration::from_secs(10));
    let retry = {
        let d = Arc::clone(&d);
        std::thread::spawn(move || d.retry_if_due())
    };
    running.recv_timeout(Duration::from_secs(60)).unwrap();
    let prepare = {
        let d = Arc::clone(&d);
        std::thread::spawn(move || d.device_ids(&[("gpu-0".into(), "GPU-1".into())]))
    };
    // Time for the prepare to find the retry under way (had it not, it gets the failure the
    // retry leaves at once: the same outcome).
    std::thread::sleep(Duration::from_millis(200));
    release.send(()).unwrap();
    assert!(retry.join().unwrap());
    let e = prepare.join().unwrap().unwrap_err().to_string();
    assert!(e.contains(mismatch), "{e}");
    assert_eq!(gated.started.load(Ordering::SeqCst), 2);
    assert_eq!(d.status().failures, 2);
}

/// What a MIG prepare checks before making its slice, and what the start checks after making
/// slices again, never run the generator (those uses generate once elsewhere): only a
/// toolkit that was not installed is looked for again.
#[test]
fn usable_and_installed_ids_do_not_generate() {
    let dir = tempfile::tempdir().unwrap();
    let canned = Canned::new(Ok(gpu_spec(DEFAULT_KIND, &["GPU-1", "MIG-a"])));
    let clock = ManualClock::new();
    let d = specs(dir.path(), canned.clone()).with_retry(RetryPolicy::default(), clock.clone());
    let runs = || canned.runs.load(Ordering::SeqCst);
    assert!(d.installed_ids(&[("m".into(), "MIG-a".into())]).is_err());
    assert_eq!(runs(), 0);
    d.refresh().unwrap();
    std::fs::remove_file(d.spec_path()).unwrap();
    d.usable().unwrap();
    assert_eq!(
        d.installed_ids(&[("m".into(), "MIG-a".into())]).unwrap(),
        vec!["gpushare.io/gpu=MIG-a"]
    );
    let e = d
        .installed_ids(&[("m".into(), "MIG-b".into())])
        .unwrap_err();
    assert!(matches!(e, DriverSpecError::Missing { .. }), "{e}");
    assert_eq!(runs(), 1);
    // A failing generator: its failure at once, even once a new run is due (the retry
    // thread's to run).
    let mismatch = "Driver/library version mismatch";
    *canned.text.lock().unwrap() = Err(GenerateError::Failed(mismatch.into()));
    assert!(d.refresh().is_err());
    clock.advance(Duration::from_secs(10));
    assert!(d.usable().unwrap_err().to_string().contains(mismatch));
    assert_eq!(runs(), 2);
    // A toolkit that is not installed is looked for again.
    *canned.text.lock().unwrap() = Err(GenerateError::NotInstalled("none".into()));
    assert!(d.retry_now().unwrap().is_err());
    assert!(matches!(d.usable(), Err(DriverSpecError::NotInstalled(_))));
    assert_eq!(runs(), 4);
}
