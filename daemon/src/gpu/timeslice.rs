//! Time-slice intervals on real GPUs through `nvidia-smi compute-policy -i <uuid>
//! --set-timeslice <0..3>`: NVML has no public call for this policy (none in the NVML API
//! reference or `nvml.h`), so, like NVIDIA's DRA driver (NVIDIA/k8s-dra-driver-gpu,
//! `cmd/gpu-kubelet-plugin/nvlib.go`), we run NVIDIA's tool, through the same bounded
//! process-spawn trait as the MPS control program.
//!
//! What the tool prints (strings of nvidia-smi 550; the failure as reported on a Tesla P4 in
//! the DRA driver's issue #41, exit status 3):
//!
//! ```text
//! Successfully set timeslice policy with value Short for GPU 0
//! Failed to set timeslice policy with value Default for GPU 0 : Not Supported
//! Failed to set timeslice for requested devices : Not Supported
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpushare_proto::TimeSliceInterval;

use super::GpuError;
use crate::sys::{CommandOutput, CommandRunner, CommandSpec};

/// Where `nvidia-smi` is looked for when not configured: the places NVIDIA's packages and the
/// EKS AL2023 AMIs install it.
pub const NVIDIA_SMI_CANDIDATES: &[&str] = &[
    "/usr/bin/nvidia-smi",
    "/usr/sbin/nvidia-smi",
    "/bin/nvidia-smi",
    "/opt/bin/nvidia-smi",
];

/// Runs `nvidia-smi compute-policy` for one GPU at a time, each run bounded by `timeout`.
#[derive(Debug, Clone)]
pub struct NvidiaSmi {
    program: PathBuf,
    runner: Arc<dyn CommandRunner>,
    timeout: Duration,
}

impl NvidiaSmi {
    /// `program` is run through `runner`; a run longer than `timeout` is killed and fails.
    pub fn new(program: PathBuf, runner: Arc<dyn CommandRunner>, timeout: Duration) -> Self {
        NvidiaSmi {
            program,
            runner,
            timeout,
        }
    }

    /// The first of [`NVIDIA_SMI_CANDIDATES`] that exists, else `nvidia-smi` (then the run
    /// fails with "not found", which names it).
    pub fn default_program() -> PathBuf {
        NVIDIA_SMI_CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("nvidia-smi"))
    }

    /// The program run.
    pub fn program(&self) -> &std::path::Path {
        &self.program
    }

    /// The command line for `uuid` and `interval`.
    pub fn command(&self, uuid: &str, interval: TimeSliceInterval) -> CommandSpec {
        CommandSpec {
            program: self.program.clone(),
            args: vec![
                "compute-policy".into(),
                "-i".into(),
                uuid.into(),
                "--set-timeslice".into(),
                interval.as_int().to_string(),
            ],
            env: BTreeMap::from([(
                "PATH".to_string(),
                "/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            )]),
            stdin: Vec::new(),
            timeout: self.timeout,
            private_shm: None,
            new_process_group: false,
        }
    }

    /// Sets `interval` on the GPU `uuid`.
    ///
    /// # Errors
    /// [`GpuError::Unsupported`] when the GPU does not support the policy ("Not Supported",
    /// seen on Tesla P4); [`GpuError::Failed`] when the tool cannot be started, runs past the
    /// bound, fails otherwise, or prints no confirmation.
    pub fn set_time_slice(&self, uuid: &str, interval: TimeSliceInterval) -> Result<(), GpuError> {
        let spec = self.command(uuid, interval);
        let out = self.runner.run(&spec).map_err(|e| {
            GpuError::Failed(format!(
                "running {} to set time-slice {} on {uuid}: {e}",
                self.program.display(),
                interval.as_str()
            ))
        })?;
        interpret(&out, uuid, interval, self.timeout)
    }
}

/// What one `--set-timeslice` run means. Pure, so that recorded outputs test it.
///
/// # Errors
/// As [`NvidiaSmi::set_time_slice`].
pub fn interpret(
    out: &CommandOutput,
    uuid: &str,
    interval: TimeSliceInterval,
    timeout: Duration,
) -> Result<(), GpuError> {
    let what = format!(
        "nvidia-smi compute-policy --set-timeslice {} ({}) on {uuid}",
        interval.as_int(),
        interval.as_str()
    );
    if out.timed_out {
        return Err(GpuError::Failed(format!(
            "{what} did not finish within {} s and was killed",
            timeout.as_secs_f64()
        )));
    }
    let text = format!("{}\n{}", out.stdout, out.stderr);
    if text.to_ascii_lowercase().contains("not supported") {
        return Err(GpuError::Unsupported(format!(
            "this GPU does not support setting a time-slice interval ({what}: {})",
            out.summary()
        )));
    }
    let confirmed = out.stdout.lines().any(|l| {
        l.trim_start()
            .starts_with("Successfully set timeslice policy")
    });
    match (out.success(), confirmed) {
        (true, true) => Ok(()),
        (true, false) => Err(GpuError::Failed(format!(
            "{what} exited 0 without confirming the change: {}",
            out.summary()
        ))),
        (false, _) => Err(GpuError::Failed(format!(
            "{what} failed: {}",
            out.summary()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn out(code: Option<i32>, stdout: &str, timed_out: bool) -> CommandOutput {
        CommandOutput {
            code,
            stdout: stdout.into(),
            stderr: String::new(),
            timed_out,
        }
    }

    const T: Duration = Duration::from_secs(5);

    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<CommandSpec>>);

    impl CommandRunner for Recorder {
        fn run(&self, spec: &CommandSpec) -> std::io::Result<CommandOutput> {
            self.0.lock().unwrap().push(spec.clone());
            Ok(out(
                Some(0),
                "Successfully set timeslice policy with value Long for GPU 0\n",
                false,
            ))
        }
    }

    #[test]
    fn command_line_names_the_uuid_and_the_interval_number() {
        let rec = Arc::new(Recorder::default());
        let smi = NvidiaSmi::new("/usr/bin/nvidia-smi".into(), rec.clone(), T);
        smi.set_time_slice("GPU-abc", TimeSliceInterval::Long)
            .unwrap();
        let calls = rec.0.lock().unwrap();
        assert_eq!(
            calls[0].args,
            ["compute-policy", "-i", "GPU-abc", "--set-timeslice", "3"]
        );
        assert_eq!(calls[0].timeout, T);
    }

    #[test]
    fn outcomes() {
        let ok = out(
            Some(0),
            "Successfully set timeslice policy with value Short for GPU 0\n",
            false,
        );
        assert!(interpret(&ok, "GPU-a", TimeSliceInterval::Short, T).is_ok());
        let p4 = out(
            Some(3),
            "Failed to set timeslice policy with value Default for GPU 0 : Not Supported\nFailed to set timeslice for requested devices : Not Supported\n",
            false,
        );
        assert!(matches!(
            interpret(&p4, "GPU-a", TimeSliceInterval::Default, T),
            Err(GpuError::Unsupported(_))
        ));
        let garbage = out(Some(0), "\u{1b}[?1049h@@@ segfault? ###\n", false);
        let e = interpret(&garbage, "GPU-a", TimeSliceInterval::Short, T).unwrap_err();
        assert!(
            matches!(e, GpuError::Failed(ref m) if m.contains("without confirming")),
            "{e}"
        );
        let hang = out(None, "", true);
        let e = interpret(&hang, "GPU-a", TimeSliceInterval::Short, T).unwrap_err();
        assert!(
            matches!(e, GpuError::Failed(ref m) if m.contains("within 5 s")),
            "{e}"
        );
        let perm = out(Some(4), "Insufficient Permissions\n", false);
        let e = interpret(&perm, "GPU-a", TimeSliceInterval::Short, T).unwrap_err();
        assert!(e.to_string().contains("Insufficient Permissions"), "{e}");
    }
}
