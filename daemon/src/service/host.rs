//! The service's host part: the leaves through which it reads and changes the node (the GPU
//! backend, MPS control, processes, device nodes), each GPU's lock-free mode word, and what
//! guards the host's own records (the MPS daemons' watches, the MIG intents, the host
//! records' writes). Nothing here holds the registry; the registry's lock is never held
//! across a call into these.

use std::sync::{Arc, Mutex};

use crate::admission::GpuModes;
use crate::gpu::GpuBackend;
use crate::strategy::mig::MigIntents;
use crate::strategy::mps::{MpsControl, Watches};
use crate::sys::{DeviceFiles, Processes};

/// The node's leaves.
#[derive(Debug)]
pub(super) struct Host {
    pub(super) backend: Arc<dyn GpuBackend>,
    pub(super) mps: MpsControl,
    pub(super) processes: Arc<dyn Processes>,
    /// Host device nodes, for the check that a claim's spec names only nodes that exist.
    pub(super) devices: Arc<dyn DeviceFiles>,
    /// Each GPU's mode word: what admits a claim to a GPU (the registry's placement only
    /// records who holds it).
    pub(super) modes: GpuModes,
    /// Pidfds of MPS control daemons, for `attach`'s liveness check.
    pub(super) watches: Watches,
    /// Held while a claim's host record is written, and while a release removes the claim's
    /// directory: see `write_host_record`.
    pub(super) host_record_writes: Mutex<()>,
    /// The MIG slices being made or taken now, on disk before each is (see
    /// `strategy/mig/intents.rs`).
    pub(super) mig_intents: MigIntents,
}
