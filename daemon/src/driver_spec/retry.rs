//! When a failing generator runs again, and what is answered meanwhile.
//!
//! A generation that fails (NVIDIA's "Driver/library version mismatch" after a driver update
//! without a reboot, a broken toolkit) fails the same way on the next prepare, and each run may
//! take its whole bound (`[cdi] generate_timeout_seconds`). So after a failure the generator
//! is not run for every prepare: prepares meanwhile get the last failure at once, saying when
//! it is tried again. It runs again when the back-off has passed ([`RetryPolicy`]: 10 s,
//! doubling to 5 min), or at once when what it depends on changes
//! ([`super::SpecGenerator::inputs`]: the `nvidia-ctk` program, the driver's libraries, its
//! kernel module), at a reload (SIGHUP) and at a restart. gpushared's retry thread
//! ([`spawn_retries`]) does this on its own, so `health` clears without a prepare. A toolkit
//! that is not installed is looked for again at every use: that costs a few `stat`s.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{DriverSpecError, DriverSpecs};

/// How long a failing generator is left alone: `first` after the first failure, doubling
/// after each further one, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first: Duration::from_secs(10),
            max: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The wait after `failures` failures in a row (at least 1).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        self.first
            .checked_mul(1 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// How often the retry thread looks: the inputs' fingerprint is a few `stat`s and a read of
/// the kernel module's version file.
pub const POLL: Duration = Duration::from_secs(2);

/// Where a [`DriverSpecs`] reads the time: the system's monotonic clock, or a test's.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now(&self) -> Instant;
}

/// The monotonic clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The last generation failed: what is answered until one succeeds.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    /// Its error.
    pub error: DriverSpecError,
    /// Failed generations in a row.
    pub failures: u32,
    /// When the generator may run again on its own.
    pub next: Instant,
    /// [`super::SpecGenerator::inputs`] when it ran.
    pub inputs: String,
}

impl Failure {
    /// Whether the generator may run again at `now`, when its inputs are `inputs`: always
    /// when it was not installed (nothing was run), else once the back-off has passed or the
    /// inputs changed.
    pub fn due(&self, now: Instant, inputs: &str) -> bool {
        matches!(self.error, DriverSpecError::NotInstalled(_))
            || now >= self.next
            || inputs != self.inputs
    }

    /// The error answered at `now` without running the generator: the last one, saying when
    /// it is tried again.
    pub fn answer(&self, now: Instant) -> DriverSpecError {
        match &self.error {
            DriverSpecError::Failed(m) => DriverSpecError::Failed(format!(
                "{m} (failed {} time{} in a row; gpushared runs it again in {} s, or at once when the toolkit or the driver changes, at a reload or a restart)",
                self.failures,
                if self.failures == 1 { "" } else { "s" },
                ceil_secs(self.next.saturating_duration_since(now)).max(1)
            )),
            other => other.clone(),
        }
    }
}

/// `d` in whole seconds, rounded up: a wait shown as 0 is over.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The driver spec's state as `health` shows it ([`DriverSpecs::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverSpecStatus {
    /// The installed spec file.
    pub path: std::path::PathBuf,
    /// What generates it.
    pub generator: String,
    /// A spec is installed and the last generation succeeded.
    pub ok: bool,
    /// The last generation's error while it fails.
    pub error: Option<String>,
    /// Failed generations in a row.
    pub failures: u32,
    /// Until the generator runs again on its own; `None` while `ok` or not installed.
    pub retry_in: Option<Duration>,
    /// The bound of one generation, when it runs a program.
    pub timeout: Option<Duration>,
}

/// Starts the thread that runs a failing generator again when it is due
/// ([`DriverSpecs::retry_if_due`], every [`POLL`]); it does nothing while generations succeed
/// and lives as long as the process.
///
/// # Errors
/// The thread cannot be started.
pub fn spawn_retries(specs: Arc<DriverSpecs>) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("driver-spec-retry".into())
        .spawn(move || loop {
            std::thread::sleep(POLL);
            specs.retry_if_due();
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_the_first_to_the_most() {
        let p = RetryPolicy::default();
        let waits: Vec<u64> = (1..=8).map(|n| p.delay(n).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(p.delay(0).as_secs(), 10);
        assert_eq!(p.delay(u32::MAX).as_secs(), 300);
    }

    #[test]
    fn a_failure_is_due_after_its_wait_or_when_the_inputs_change() {
        let t0 = Instant::now();
        let failed = Failure {
            error: DriverSpecError::Failed("Driver/library version mismatch".into()),
            failures: 2,
            next: t0 + Duration::from_secs(20),
            inputs: "ctk@1".into(),
        };
        assert!(!failed.due(t0, "ctk@1"));
        assert!(!failed.due(t0 + Duration::from_secs(19), "ctk@1"));
        assert!(failed.due(t0 + Duration::from_secs(20), "ctk@1"));
        assert!(failed.due(t0, "ctk@2"), "a new nvidia-ctk or driver");
        let said = failed.answer(t0 + Duration::from_secs(5)).to_string();
        assert!(
            said.starts_with("Driver/library version mismatch (failed 2 times in a row; gpushared runs it again in 15 s"),
            "{said}"
        );
        let absent = Failure {
            error: DriverSpecError::NotInstalled("nvidia-ctk is in none of /usr/bin".into()),
            ..failed
        };
        assert!(absent.due(t0, "ctk@1"), "looking again costs nothing");
        assert_eq!(absent.answer(t0), absent.error);
    }
}
