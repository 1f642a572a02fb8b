//! The NVIDIA driver's user-space for claims' containers, from NVIDIA's own toolkit.
//!
//! A CUDA container needs the host driver's libraries (`libcuda.so`, `libnvidia-ml.so`, …),
//! binaries (`nvidia-smi`), firmware and the toolkit's hooks (`create-symlinks`,
//! `update-ldcache`, …), all matching the host's kernel module. NVIDIA's Container Toolkit
//! knows them: `nvidia-ctk cdi generate` writes a CDI spec with one device per GPU and MIG
//! device and those files as common edits (research `toolkit-cdi-oci.md` §5). gpushared runs
//! it itself ([`nvidia_ctk`]), under a kind of its own ([`DEFAULT_KIND`], `gpushare.io/gpu`,
//! devices named by GPU UUID and `MIG-<uuid>`), into its CDI directory: at start and after
//! every MIG change it makes, because the toolkit's `nvidia-cdi-refresh` does not react to
//! those (NVIDIA/nvidia-container-toolkit#1828), and under a kind that never collides with the
//! `nvidia.com/gpu` spec that service keeps in `/var/run/cdi`. Every prepared device then gets
//! this spec's device for its GPU before the claim's device ([`DriverSpecs::device_ids`]).
//!
//! Before installing the spec gpushared removes what must not reach a claim's containers: a
//! mount of the host's `/tmp/nvidia-mps`, which the generator adds when a node-wide MPS
//! control daemon ran at generation time (`internal/discover/ipc.go`), and which would give
//! every claim, MPS or not, the node's MPS daemon ([`strip_host_mps`]).
//!
//! Generation is behind the narrow [`SpecGenerator`] trait: [`nvidia_ctk::NvidiaCtk`] runs the
//! real program; [`sim::SimulatedToolkit`] writes a spec of the same layout for a simulated
//! driver root, so that `--simulate` nodes, the demo and the tests run the same path as a
//! real node.

pub mod alias;
pub mod nvidia_ctk;
pub mod retry;
pub mod sim;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use retry::{Clock, DriverSpecStatus, RetryPolicy, SystemClock};

use gpushare_cdi::Spec;

/// The kind of the generated spec unless `[cdi] driver_kind` says otherwise.
pub const DEFAULT_KIND: &str = "gpushare.io/gpu";

/// Where NVIDIA's MPS clients and the generator's IPC discovery look for a node-wide MPS
/// control daemon's pipe directory.
pub const HOST_MPS_PIPE: &str = "/tmp/nvidia-mps";

/// Where `nvidia-ctk` is looked for when `[cdi] nvidia_ctk` is empty: the RPM's and the
/// Debian package's `/usr/bin`, a hand install's `/usr/local/bin`, and the GPU Operator's
/// toolkit container's host directory.
pub const NVIDIA_CTK_DIRS: &[&str] = &[
    "/usr/bin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/local/nvidia/toolkit",
];

/// Splits a CDI kind `vendor/class` into its parts, checked as CDI names them.
///
/// # Errors
/// Not `vendor/class`, or a part that is not a valid CDI vendor or class name.
pub fn split_kind(kind: &str) -> Result<(&str, &str), String> {
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| format!("{kind:?} is not vendor/class"))?;
    gpushare_cdi::validate_vendor_name(vendor).map_err(|e| format!("{kind:?}: {e}"))?;
    gpushare_cdi::validate_class_name(class).map_err(|e| format!("{kind:?}: {e}"))?;
    Ok((vendor, class))
}

/// Why a generator wrote no spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    /// The toolkit is not installed; the message says where it was looked for.
    #[error("{0}")]
    NotInstalled(String),
    /// It ran and failed, or ran past its time (the message has its output).
    #[error("{0}")]
    Failed(String),
}

/// Writes the driver's CDI spec: the leaf that NVIDIA's `nvidia-ctk` is behind.
pub trait SpecGenerator: Send + Sync + std::fmt::Debug {
    /// What generates, for logs and errors, e.g. `nvidia-ctk /usr/bin/nvidia-ctk (driver root /)`.
    fn describe(&self) -> String;

    /// Writes, as JSON, to `output` a CDI spec of kind `vendor/class` with a device per GPU
    /// named by its UUID and per MIG device named `MIG-<uuid>`, and the driver's files as
    /// common container edits. Bounded in time.
    ///
    /// # Errors
    /// [`GenerateError::NotInstalled`] when there is no generator on this node,
    /// [`GenerateError::Failed`] when it failed or ran too long.
    fn generate(&self, vendor: &str, class: &str, output: &Path) -> Result<(), GenerateError>;

    /// A fingerprint of what a generation depends on outside gpushared (for `nvidia-ctk`: the
    /// program, the driver's libraries, its kernel module): a failed generation is tried
    /// again at once when it changes ([`retry`]). Cheap: read every few seconds while
    /// generations fail. Empty (the default): nothing to watch.
    fn inputs(&self) -> String {
        String::new()
    }

    /// The bound of one generation, when it runs a program.
    fn timeout(&self) -> Option<Duration> {
        None
    }
}

/// Why the driver's spec cannot give a claim its devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverSpecError {
    /// No toolkit on this node.
    #[error("NVIDIA Container Toolkit not found ({0}): install nvidia-container-toolkit (it gives containers the driver's libraries), or set [cdi] driver_spec = \"none\" if the images bring their own")]
    NotInstalled(String),
    /// Generating, reading or installing the spec failed.
    #[error("{0}")]
    Failed(String),
    /// The spec has no device for these GPUs.
    #[error("{} not in the NVIDIA driver's CDI spec {spec} (generated by {generator}; it has {known})", missing.join(", "))]
    Missing {
        /// Each missing GPU, as `gpu-3 (GPU-…)`.
        missing: Vec<String>,
        /// The spec file.
        spec: String,
        /// What generated it.
        generator: String,
        /// The device names it has.
        known: String,
    },
}

/// Removes every mount of the host's `/tmp/nvidia-mps` (at that container path) from the
/// spec's and its devices' edits; returns how many there were.
pub fn strip_host_mps(spec: &mut Spec) -> usize {
    let mut removed = 0;
    let mut strip = |edits: &mut gpushare_cdi::ContainerEdits| {
        let before = edits.mounts.len();
        edits.mounts.retain(|m| {
            Path::new(&m.container_path) != Path::new(HOST_MPS_PIPE)
                && Path::new(&m.host_path) != Path::new(HOST_MPS_PIPE)
        });
        removed += before - edits.mounts.len();
    };
    strip(&mut spec.container_edits);
    for d in &mut spec.devices {
        strip(&mut d.container_edits);
    }
    removed
}

/// The driver's CDI spec of this node: generated, cleaned, validated and installed as
/// `<cdi_dir>/<vendor>-<class>.json`, with the names recreated MIG slices keep ([`alias`]);
/// the last good one kept in memory. A generator that fails is not run again for every use
/// ([`retry`]).
///
/// **Waits.** A use that needs a spec generated after it began (a prepare whose MIG slice was
/// just made) runs a generation of its own, even while another one is under way: that one may
/// have started before the slice existed, and waiting for it and then running another took a
/// prepare to twice the generator's bound (`generate_timeout_seconds`) against the plugin's
/// claim timeout. So no use waits on more than one generation. Generations that overlap are
/// installed in the order they started: one that ends after a later one leaves the later
/// one's spec (which saw the node as it is now) in place and answers with it. While the
/// generator fails, a use that finds a generation under way takes its outcome instead of
/// running one more.
#[derive(Debug)]
pub struct DriverSpecs {
    generator: Arc<dyn SpecGenerator>,
    vendor: String,
    class: String,
    cdi_dir: PathBuf,
    staging: PathBuf,
    policy: RetryPolicy,
    clock: Arc<dyn Clock>,
    /// Held for installs and bookkeeping, never across a generation.
    inner: Mutex<Inner>,
    /// Told when a generation ends (to uses that take its outcome).
    ended: Condvar,
    /// What `health` shows; never held across a generation, so `health` answers at once.
    status: Mutex<Snapshot>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The generator's last good spec, cleaned.
    generated: Option<Spec>,
    /// What is installed: `generated` with the aliases.
    installed: Option<Spec>,
    /// Old MIG device name → the device it stands for now ([`DriverSpecs::set_aliases`]).
    aliases: BTreeMap<String, String>,
    /// Aliases the last install left out, with why.
    left_out: BTreeMap<String, String>,
    /// The last generation failed.
    failure: Option<retry::Failure>,
    /// The number of the last generation started (the first is 1).
    started: u64,
    /// The generations under way, by number.
    running: BTreeSet<u64>,
    /// The number of the generation whose outcome the fields above hold (0: none yet).
    applied: u64,
}

/// [`DriverSpecStatus`] as of the last attempt.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    generator: String,
    ok: bool,
    error: Option<String>,
    failures: u32,
    next: Option<Instant>,
}

impl DriverSpecs {
    /// Specs of `kind` (checked by [`split_kind`]) from `generator`, installed in `cdi_dir`;
    /// the generator writes into `staging` (a directory of ours, created when needed). A
    /// failing generator is run again as [`RetryPolicy::default`] says.
    ///
    /// # Errors
    /// `kind` is not a valid `vendor/class`.
    pub fn new(
        generator: Arc<dyn SpecGenerator>,
        kind: &str,
        cdi_dir: &Path,
        staging: &Path,
    ) -> Result<DriverSpecs, String> {
        let (vendor, class) = split_kind(kind)?;
        Ok(DriverSpecs {
            generator,
            vendor: vendor.to_string(),
            class: class.to_string(),
            cdi_dir: cdi_dir.to_path_buf(),
            staging: staging.to_path_buf(),
            policy: RetryPolicy::default(),
            clock: Arc::new(SystemClock),
            inner: Mutex::new(Inner::default()),
            ended: Condvar::new(),
            status: Mutex::new(Snapshot::default()),
        })
    }

    /// The same with another retry policy and clock (tests).
    pub fn with_retry(mut self, policy: RetryPolicy, clock: Arc<dyn Clock>) -> DriverSpecs {
        self.policy = policy;
        self.clock = clock;
        self
    }

    /// `vendor/class`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }

    /// The installed spec file, `<cdi_dir>/<vendor>-<class>.json` (the reference library's
    /// name for a static spec of that kind).
    pub fn spec_path(&self) -> PathBuf {
        self.cdi_dir
            .join(format!("{}-{}.json", self.vendor, self.class))
    }

    /// What generates it.
    pub fn generator(&self) -> String {
        self.generator.describe()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Generates the spec now and installs it: what gpushared does at start and after every
    /// MIG change. Bounded by the generator's timeout, and waits on no other generation
    /// (see the type's doc). After a failure the generator runs again only when [`retry`]
    /// says so; until then this answers the last failure at once.
    ///
    /// # Errors
    /// Not installed, the generator failed, its spec is invalid or of another kind, or it
    /// cannot be written. The previously installed spec stays in place then.
    pub fn refresh(&self) -> Result<Spec, DriverSpecError> {
        self.fresh(self.lock())
    }

    /// The installed spec, generated first when there is none yet (the toolkit installed
    /// after gpushared started) or its file is gone.
    ///
    /// # Errors
    /// As [`DriverSpecs::refresh`].
    pub fn current(&self) -> Result<Spec, DriverSpecError> {
        let inner = self.lock();
        if let Some(spec) = self.on_disk(&inner) {
            return Ok(spec);
        }
        self.fresh(inner)
    }

    /// Whether a prepare that generates the spec later anyway (a MIG claim's, once its slice
    /// exists) can count on it, without running the generator for it: a spec was installed
    /// and the last generation did not fail (a deleted file is written again by that later
    /// generation). After a failure, the last one at once, even when a new run is due (the
    /// retry thread runs it within [`retry::POLL`]); only a toolkit that was not installed is
    /// looked for again (a few `stat`s). So such a prepare waits on one generation at most.
    ///
    /// # Errors
    /// As [`DriverSpecs::refresh`].
    pub fn usable(&self) -> Result<(), DriverSpecError> {
        let inner = self.lock();
        match &inner.failure {
            Some(f) if !matches!(f.error, DriverSpecError::NotInstalled(_)) => {
                Err(f.answer(self.clock.now()))
            }
            None if inner.installed.is_some() => Ok(()),
            _ => self.fresh(inner).map(|_| ()),
        }
    }

    /// The qualified CDI device IDs of `devices` (`(label, name)`: a GPU's `gpu-3` and its
    /// `GPU-…` UUID, or a MIG device's name and its `MIG-…` UUID, or the UUID it had when
    /// its claim was prepared), in order. When the installed spec lacks a device (it may
    /// predate the device) or its file is gone, one generation gives the answer
    /// ([`DriverSpecs::refresh`]): the call waits on no more than that one.
    ///
    /// # Errors
    /// [`DriverSpecError::Missing`] naming every device still missing, or as
    /// [`DriverSpecs::refresh`].
    pub fn device_ids(&self, devices: &[(String, String)]) -> Result<Vec<String>, DriverSpecError> {
        let inner = self.lock();
        let spec = match self.on_disk(&inner) {
            Some(spec) if missing(&spec, devices).is_empty() => spec,
            _ => self.fresh(inner)?,
        };
        self.ids_in(&spec, devices)
    }

    /// The same against the installed spec alone, never running the generator: for a caller
    /// that has just generated it with every device it can have (gpushared's start, after
    /// making MIG slices again).
    ///
    /// # Errors
    /// As [`DriverSpecs::device_ids`]; [`DriverSpecError::Failed`] when no spec is installed.
    pub fn installed_ids(
        &self,
        devices: &[(String, String)],
    ) -> Result<Vec<String>, DriverSpecError> {
        let inner = self.lock();
        match (inner.installed.clone(), &inner.failure) {
            (Some(spec), _) => self.ids_in(&spec, devices),
            (None, Some(f)) => Err(f.answer(self.clock.now())),
            (None, None) => Err(DriverSpecError::Failed(format!(
                "the NVIDIA driver's CDI spec {} is not generated yet",
                self.spec_path().display()
            ))),
        }
    }

    /// The installed spec when its file is there (else, after saying so, `None`).
    fn on_disk(&self, inner: &Inner) -> Option<Spec> {
        let spec = inner.installed.as_ref()?;
        if self.spec_path().is_file() {
            return Some(spec.clone());
        }
        tracing::warn!(path = %self.spec_path().display(), "the driver's CDI spec is gone; generating it again");
        None
    }

    /// The IDs of `devices` in `spec`, or the error naming those it lacks.
    fn ids_in(
        &self,
        spec: &Spec,
        devices: &[(String, String)],
    ) -> Result<Vec<String>, DriverSpecError> {
        let absent = missing(spec, devices);
        if !absent.is_empty() {
            let mut known: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
            known.sort_unstable();
            return Err(DriverSpecError::Missing {
                missing: absent,
                spec: self.spec_path().display().to_string(),
                generator: self.generator.describe(),
                known: if known.is_empty() {
                    "no devices".into()
                } else {
                    known.join(", ")
                },
            });
        }
        Ok(devices
            .iter()
            .map(|(_, name)| gpushare_cdi::qualified_name(&self.kind(), name))
            .collect())
    }

    /// Sets the names recreated MIG slices keep (old MIG device name → the name of the
    /// slice's device now, see [`alias`]) and installs the spec again with them when they
    /// changed, from the last generation: the generator is not run, nor waited on (one under
    /// way installs with these when it ends).
    ///
    /// # Errors
    /// The spec cannot be written (the aliases are kept for the next install).
    pub fn set_aliases(&self, aliases: BTreeMap<String, String>) -> Result<(), DriverSpecError> {
        let mut inner = self.lock();
        if inner.aliases == aliases {
            return Ok(());
        }
        inner.aliases = aliases;
        match inner.generated.clone() {
            Some(generated) => self.install(&mut inner, generated).map(|_| ()),
            // Installed with the first generation.
            None => Ok(()),
        }
    }

    /// Runs the generator when its last generation failed and a new one is due (the
    /// back-off passed, its inputs changed, or it was not installed) and none is under way;
    /// what the retry thread calls ([`retry::spawn_retries`]). Never waits for a generation
    /// under way. Returns whether it ran.
    pub fn retry_if_due(&self) -> bool {
        let inner = self.lock();
        let due = inner.running.is_empty()
            && inner
                .failure
                .as_ref()
                .is_some_and(|f| f.due(self.clock.now(), &self.generator.inputs()));
        if due {
            let _ = self.attempt(inner);
        }
        due
    }

    /// Runs the generator now when its last generation failed, whatever the back-off: an
    /// operator's reload (SIGHUP) after fixing the node. `None` when it did not fail.
    pub fn retry_now(&self) -> Option<Result<(), DriverSpecError>> {
        let inner = self.lock();
        inner.failure.as_ref()?;
        Some(self.attempt(inner).map(|_| ()))
    }

    /// The state `health` shows; answers at once, even during a generation.
    pub fn status(&self) -> DriverSpecStatus {
        let snap = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let now = self.clock.now();
        DriverSpecStatus {
            path: self.spec_path(),
            generator: if snap.generator.is_empty() {
                self.generator.describe()
            } else {
                snap.generator
            },
            ok: snap.ok,
            error: snap.error,
            failures: snap.failures,
            retry_in: snap.next.map(|n| n.saturating_duration_since(now)),
            timeout: self.generator.timeout(),
        }
    }

    /// A spec generated after this call began: [`DriverSpecs::attempt`], unless the last
    /// generation failed and a new one is not due (then that failure, at once) or is due and
    /// one is under way (then that one's outcome, once it ends).
    fn fresh(&self, inner: MutexGuard<'_, Inner>) -> Result<Spec, DriverSpecError> {
        if let Some(f) = &inner.failure {
            let now = self.clock.now();
            if !f.due(now, &self.generator.inputs()) {
                return Err(f.answer(now));
            }
            // The retry thread's, or another prepare's: a failing generator is not run once
            // more for every prepare that comes while it runs.
            if let Some(&n) = inner.running.last() {
                return self.outcome_of(inner, n);
            }
        }
        self.attempt(inner)
    }

    /// Waits for generation `n` to end (bounded by the generator's own bound), then answers
    /// what is installed or the failure now.
    fn outcome_of(
        &self,
        mut inner: MutexGuard<'_, Inner>,
        n: u64,
    ) -> Result<Spec, DriverSpecError> {
        while inner.running.contains(&n) {
            inner = self.ended.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
        self.outcome(&inner)
    }

    /// What a use is answered now without running the generator: the last failure, else the
    /// installed spec.
    fn outcome(&self, inner: &Inner) -> Result<Spec, DriverSpecError> {
        match (&inner.failure, &inner.installed) {
            (Some(f), _) => Err(f.answer(self.clock.now())),
            (None, Some(spec)) => Ok(spec.clone()),
            (None, None) => Err(DriverSpecError::Failed(format!(
                "the NVIDIA driver's CDI spec {} is not generated yet",
                self.spec_path().display()
            ))),
        }
    }

    /// Runs a generation (outside the lock: other uses, `set_aliases` and `health` go on
    /// meanwhile) and installs it, recording how it went for the retries and `health`; one
    /// that ends after a later-started one has been applied changes nothing and answers
    /// [`DriverSpecs::outcome`].
    fn attempt(&self, mut inner: MutexGuard<'_, Inner>) -> Result<Spec, DriverSpecError> {
        inner.started += 1;
        let n = inner.started;
        inner.running.insert(n);
        if n == 1 {
            // A killed gpushared's outputs: only this process's generations write there.
            self.sweep_staging();
        }
        drop(inner);
        let running = Running {
            specs: self,
            n,
            ended: false,
        };
        // Read before the run: a change during it is one the next check sees.
        let inputs = self.generator.inputs();
        let generated = self.generate(n);
        let mut inner = self.lock();
        if n < inner.applied {
            tracing::debug!(
                generation = n,
                newer = inner.applied,
                "a generation ended after a later one; the later one's spec stays"
            );
            running.end(&mut inner);
            return self.outcome(&inner);
        }
        inner.applied = n;
        let result = generated.and_then(|generated| self.install(&mut inner, generated));
        let generator = self.generator.describe();
        match &result {
            Ok(_) => {
                if let Some(f) = inner.failure.take() {
                    tracing::info!(failures = f.failures, generator = %generator, "the NVIDIA driver's CDI spec is generated again; claims that need it are prepared again");
                }
            }
            Err(e) => {
                let failures = inner.failure.as_ref().map_or(0, |f| f.failures) + 1;
                let wait = self.policy.delay(failures);
                let not_installed = matches!(e, DriverSpecError::NotInstalled(_));
                // A missing toolkit is looked for at every use: said once, not every time.
                let repeated = not_installed
                    && inner
                        .failure
                        .as_ref()
                        .is_some_and(|f| f.error.to_string() == e.to_string());
                if !repeated {
                    if not_installed {
                        tracing::error!(error = %e, generator = %generator, "cannot generate the NVIDIA driver's CDI spec; claims that need it are refused until it can be");
                    } else {
                        tracing::error!(error = %e, generator = %generator, failures, retry_in_s = wait.as_secs(), "cannot generate the NVIDIA driver's CDI spec; claims that need it are refused until it can be (the generator is run again after the wait, or at once when it or the driver changes)");
                    }
                }
                inner.failure = Some(retry::Failure {
                    error: e.clone(),
                    failures,
                    next: self.clock.now() + wait,
                    inputs,
                });
            }
        }
        let snap = Snapshot {
            generator,
            ok: result.is_ok(),
            error: inner.failure.as_ref().map(|f| f.error.to_string()),
            failures: inner.failure.as_ref().map_or(0, |f| f.failures),
            next: inner
                .failure
                .as_ref()
                .filter(|f| !matches!(f.error, DriverSpecError::NotInstalled(_)))
                .map(|f| f.next),
        };
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = snap;
        running.end(&mut inner);
        result
    }

    /// Removes what generations of an earlier process left in the staging directory.
    fn sweep_staging(&self) {
        let Ok(entries) = std::fs::read_dir(&self.staging) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("generated") && name.ends_with(".json") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Installs `generated` with the aliases: validated, written atomically; kept in memory.
    fn install(&self, inner: &mut Inner, generated: Spec) -> Result<Spec, DriverSpecError> {
        let (spec, left_out) = alias::with_aliases(&generated, &inner.aliases);
        for (name, why) in &left_out {
            tracing::warn!(alias = %name, reason = %why, "a recreated MIG slice's first name is not in the driver's CDI spec");
        }
        gpushare_cdi::validate_spec(&spec).map_err(|e| {
            DriverSpecError::Failed(format!("the driver's CDI spec is not valid: {e}"))
        })?;
        crate::fsutil::create_dir_if_missing(&self.cdi_dir, 0o755).map_err(|e| {
            DriverSpecError::Failed(format!("creating {}: {e}", self.cdi_dir.display()))
        })?;
        let mut bytes = serde_json::to_vec_pretty(&spec)
            .map_err(|e| DriverSpecError::Failed(format!("encoding the driver's CDI spec: {e}")))?;
        bytes.push(b'\n');
        crate::fsutil::write_atomic(&self.spec_path(), &bytes, 0o644).map_err(|e| {
            DriverSpecError::Failed(format!("writing {}: {e}", self.spec_path().display()))
        })?;
        tracing::info!(path = %self.spec_path().display(), devices = spec.devices.len(), aliases = spec.devices.len() - generated.devices.len(), generator = %self.generator.describe(), "driver's CDI spec installed");
        inner.generated = Some(generated);
        inner.installed = Some(spec.clone());
        inner.left_out = left_out;
        Ok(spec)
    }

    /// Why the last install left alias `name` out ([`alias::with_aliases`]), if it did.
    pub fn alias_left_out(&self, name: &str) -> Option<String> {
        self.lock().left_out.get(name).cloned()
    }

    /// Runs the generator (generation `n`, into a file of its own) and reads, checks and
    /// cleans what it wrote.
    fn generate(&self, n: u64) -> Result<Spec, DriverSpecError> {
        crate::fsutil::create_dir_if_missing(&self.staging, 0o700).map_err(|e| {
            DriverSpecError::Failed(format!("creating {}: {e}", self.staging.display()))
        })?;
        let out = self.staging.join(format!("generated-{n}.json"));
        crate::fsutil::remove_file_if_exists(&out)
            .map_err(|e| DriverSpecError::Failed(format!("removing {}: {e}", out.display())))?;
        let generated = self.generator.generate(&self.vendor, &self.class, &out);
        let loaded = generated
            .map_err(|e| match e {
                GenerateError::NotInstalled(m) => DriverSpecError::NotInstalled(m),
                GenerateError::Failed(m) => DriverSpecError::Failed(m),
            })
            .and_then(|()| {
                gpushare_cdi::load_spec_file(&out).map_err(|e| {
                    DriverSpecError::Failed(format!(
                        "the driver's CDI spec that {} wrote is not valid: {e}",
                        self.generator.describe()
                    ))
                })
            });
        let _ = std::fs::remove_file(&out);
        let mut spec = loaded?;
        if spec.kind != self.kind() {
            return Err(DriverSpecError::Failed(format!(
                "{} wrote a spec of kind {:?}, not {:?}",
                self.generator.describe(),
                spec.kind,
                self.kind()
            )));
        }
        let removed = strip_host_mps(&mut spec);
        if removed > 0 {
            tracing::warn!(mounts = removed, path = HOST_MPS_PIPE, "removed the host's MPS pipe directory from the driver's CDI spec: a node-wide MPS control daemon ran at generation time, and claims' containers must not reach it");
        }
        // Removing mounts never raises the version needed; the lowest that fits keeps older
        // readers (podman 4.3 reads up to 0.5.0) able to read it.
        spec.cdi_version = gpushare_cdi::minimum_version(&spec).to_string();
        gpushare_cdi::validate_spec(&spec).map_err(|e| {
            DriverSpecError::Failed(format!("the driver's CDI spec is not valid: {e}"))
        })?;
        Ok(spec)
    }
}

/// A generation under way ([`Inner::running`]): ended when its outcome is applied, or when it
/// unwinds, so that no use waits on it for ever.
struct Running<'a> {
    specs: &'a DriverSpecs,
    n: u64,
    ended: bool,
}

impl Running<'_> {
    fn end(mut self, inner: &mut Inner) {
        inner.running.remove(&self.n);
        self.specs.ended.notify_all();
        self.ended = true;
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.specs.lock().running.remove(&self.n);
            self.specs.ended.notify_all();
        }
    }
}

/// The labels of `devices` whose name `spec` has no device for.
fn missing(spec: &Spec, devices: &[(String, String)]) -> Vec<String> {
    let names: BTreeSet<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    devices
        .iter()
        .filter(|(_, name)| !names.contains(name.as_str()))
        .map(|(label, name)| format!("{label} ({name})"))
        .collect()
}

#[cfg(test)]
mod tests;
