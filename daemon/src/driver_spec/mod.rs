//! The NVIDIA driver's user-space for claims' containers, from NVIDIA's own toolkit.
//!
//! A CUDA container needs the host driver's libraries (`libcuda.so`, `libnvidia-ml.so`, …),
//! binaries (`nvidia-smi`), firmware and the toolkit's hooks (`create-symlinks`,
//! `update-ldcache`, …), all matching the host's kernel module. NVIDIA's Container Toolkit
//! knows them: `nvidia-ctk cdi generate` writes a CDI spec with one device per GPU and MIG
//! device and those files as common edits (NVIDIA Container Toolkit's documentation,
//! "Support for Container Device Interface"). gpushared runs it itself ([`nvidia_ctk`]),
//! under a kind of its own ([`DEFAULT_KIND`], `gpushare.io/gpu`, devices named by GPU UUID
//! and `MIG-<uuid>`), into its CDI directory: at start and after every MIG change it makes,
//! because the toolkit's `nvidia-cdi-refresh` does not react to those
//! (NVIDIA/nvidia-container-toolkit#1828), and under a kind that never collides with the
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
//!
//! Here: the kind, the errors, the host-MPS cleaning and [`DriverSpecs`], what the service
//! asks for devices. The rest, by what each does:
//! - `generator.rs`: the [`SpecGenerator`] trait and [`GenerateError`];
//! - `generation.rs`: running a generation, or taking the outcome of one under way, and
//!   installing its spec ([`DriverSpecs`]' waiting rules as code);
//! - [`nvidia_ctk`]: NVIDIA's `nvidia-ctk cdi generate` as a [`SpecGenerator`];
//! - [`sim`]: the same layout for a simulated driver root;
//! - [`alias`]: the names recreated MIG slices keep;
//! - [`retry`]: when a failed generation runs again, and the thread that runs it.

pub mod alias;
mod generation;
mod generator;
pub mod nvidia_ctk;
pub mod retry;
pub mod sim;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

pub use generator::{GenerateError, SpecGenerator};
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

/// Why a CDI kind is refused ([`split_kind`]); the message names the kind as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KindError {
    /// The kind has no `/` between vendor and class.
    #[error("{kind:?} is not vendor/class")]
    NotVendorClass {
        /// The kind as written.
        kind: String,
    },
    /// Its vendor or class is not a valid CDI name.
    #[error("{kind:?}: {source}")]
    Name {
        /// The kind as written.
        kind: String,
        /// Which part, and why CDI refuses it.
        #[source]
        source: gpushare_cdi::NameError,
    },
}

/// Splits a CDI kind `vendor/class` into its parts, checked as CDI names them.
///
/// # Errors
/// [`KindError::NotVendorClass`] when it is not `vendor/class`, [`KindError::Name`] when a
/// part is not a valid CDI vendor or class name.
pub fn split_kind(kind: &str) -> Result<(&str, &str), KindError> {
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| KindError::NotVendorClass { kind: kind.into() })?;
    let named = |source| KindError::Name {
        kind: kind.into(),
        source,
    };
    gpushare_cdi::validate_vendor_name(vendor).map_err(named)?;
    gpushare_cdi::validate_class_name(class).map_err(named)?;
    Ok((vendor, class))
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
    /// [`KindError`]: `kind` is not a valid `vendor/class`.
    pub fn new(
        generator: Arc<dyn SpecGenerator>,
        kind: &str,
        cdi_dir: &Path,
        staging: &Path,
    ) -> Result<DriverSpecs, KindError> {
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

    /// Why the last install left alias `name` out ([`alias::with_aliases`]), if it did.
    pub fn alias_left_out(&self, name: &str) -> Option<String> {
        self.lock().left_out.get(name).cloned()
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
