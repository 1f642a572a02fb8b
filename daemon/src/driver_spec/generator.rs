//! The narrow interface generation is behind: [`SpecGenerator`], which
//! [`NvidiaCtk`](super::nvidia_ctk::NvidiaCtk) implements by running NVIDIA's program and
//! [`SimulatedToolkit`](super::sim::SimulatedToolkit) for a simulated driver root, and
//! [`GenerateError`], why one wrote no spec.

use std::path::Path;
use std::time::Duration;

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
    /// again at once when it changes ([`retry`](super::retry)). Cheap: read every few
    /// seconds while generations fail. Empty (the default): nothing to watch.
    fn inputs(&self) -> String {
        String::new()
    }

    /// The bound of one generation, when it runs a program.
    fn timeout(&self) -> Option<Duration> {
        None
    }
}
