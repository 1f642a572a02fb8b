//! NVIDIA's `nvidia-ctk cdi generate`, run as the leaf of [`super::SpecGenerator`]: every run
//! bounded, its output captured for the error.
//!
//! Flags (research `toolkit-cdi-oci.md` §5): `--vendor`/`--class` for our kind,
//! `--device-name-strategy uuid` (GPUs as `GPU-<uuid>`, MIG devices as `MIG-<uuid>`, plus
//! `all`), `--driver-root` (`/`, or the GPU Operator's `/run/nvidia/driver`), `--format json`
//! and `--output` into our staging directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{GenerateError, SpecGenerator, NVIDIA_CTK_DIRS};
use crate::sys::{CommandRunner, CommandSpec};

/// The `PATH` the program runs with: it looks up `ldconfig` and the driver's binaries.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The loaded kernel module's version line: it changes when the module is reloaded (what ends
/// a "Driver/library version mismatch" without a reboot).
pub const KERNEL_MODULE_VERSION: &str = "/proc/driver/nvidia/version";

/// The dynamic linker's cache below the driver root: rewritten (by `ldconfig`) whenever the
/// driver's libraries are installed or updated.
pub const LIBRARY_CACHE: &str = "etc/ld.so.cache";

/// Most bytes of [`KERNEL_MODULE_VERSION`] read (it is two lines).
const MAX_VERSION_BYTES: u64 = 4096;

/// `nvidia-ctk cdi generate` on this host.
#[derive(Debug)]
pub struct NvidiaCtk {
    /// `[cdi] nvidia_ctk`; empty means the first of [`NVIDIA_CTK_DIRS`] that has it.
    configured: PathBuf,
    driver_root: PathBuf,
    runner: Arc<dyn CommandRunner>,
    timeout: Duration,
}

impl NvidiaCtk {
    /// Runs `configured` (or finds `nvidia-ctk`, at each run, so that a toolkit installed
    /// after gpushared started is used) for `driver_root` through `runner`, each run killed
    /// after `timeout`.
    pub fn new(
        configured: &Path,
        driver_root: &Path,
        runner: Arc<dyn CommandRunner>,
        timeout: Duration,
    ) -> NvidiaCtk {
        NvidiaCtk {
            configured: configured.to_path_buf(),
            driver_root: driver_root.to_path_buf(),
            runner,
            timeout,
        }
    }

    /// The program to run.
    ///
    /// # Errors
    /// [`FindError`], saying where it was looked for, when it is not there.
    pub fn program(&self) -> Result<PathBuf, FindError> {
        find(&self.configured, is_executable)
    }

    /// The arguments of one run writing to `output`.
    pub fn args(&self, vendor: &str, class: &str, output: &Path) -> Vec<String> {
        [
            "cdi",
            "generate",
            "--vendor",
            vendor,
            "--class",
            class,
            "--device-name-strategy",
            "uuid",
            "--driver-root",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            self.driver_root.display().to_string(),
            "--format".into(),
            "json".into(),
            "--output".into(),
            output.display().to_string(),
        ])
        .collect()
    }
}

/// Why no `nvidia-ctk` can be run ([`find`]); the message says where it was looked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    /// `[cdi] nvidia_ctk` names this path, and it is not an executable file.
    #[error("[cdi] nvidia_ctk {} is not an executable file", .0.display())]
    NotExecutable(PathBuf),
    /// `[cdi] nvidia_ctk` is empty and no directory of [`NVIDIA_CTK_DIRS`] has an
    /// executable `nvidia-ctk`.
    #[error("nvidia-ctk is in none of {}", NVIDIA_CTK_DIRS.join(", "))]
    NotInDirs,
}

/// `configured` when set (it must be executable), else the first `nvidia-ctk` of
/// [`NVIDIA_CTK_DIRS`] that `executable` accepts.
///
/// # Errors
/// [`FindError::NotExecutable`] when `configured` is set and not executable,
/// [`FindError::NotInDirs`] when it is empty and no directory has the program.
pub fn find(configured: &Path, executable: impl Fn(&Path) -> bool) -> Result<PathBuf, FindError> {
    if !configured.as_os_str().is_empty() {
        return if executable(configured) {
            Ok(configured.to_path_buf())
        } else {
            Err(FindError::NotExecutable(configured.to_path_buf()))
        };
    }
    NVIDIA_CTK_DIRS
        .iter()
        .map(|d| Path::new(d).join("nvidia-ctk"))
        .find(|p| executable(p))
        .ok_or(FindError::NotInDirs)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A file's identity as written (device, inode, size, modification time), or `absent`.
fn stamp(p: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map_or_else(
        |_| "absent".to_string(),
        |m| {
            format!(
                "{}:{}:{}:{}.{}",
                m.dev(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec()
            )
        },
    )
}

impl SpecGenerator for NvidiaCtk {
    /// The program (which one, and its file's identity), the driver root's library cache
    /// ([`LIBRARY_CACHE`]) and the kernel module's version ([`KERNEL_MODULE_VERSION`]).
    fn inputs(&self) -> String {
        use std::io::Read;
        let program = self.program().map_or_else(
            |e| e.to_string(),
            |p| format!("{}@{}", p.display(), stamp(&p)),
        );
        let libraries = stamp(&self.driver_root.join(LIBRARY_CACHE));
        let mut module = String::new();
        if std::fs::File::open(KERNEL_MODULE_VERSION)
            .and_then(|f| f.take(MAX_VERSION_BYTES).read_to_string(&mut module))
            .is_err()
        {
            module = "absent".into();
        }
        format!("{program} | {libraries} | {module}")
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn describe(&self) -> String {
        match self.program() {
            Ok(p) => format!(
                "{} cdi generate (driver root {})",
                p.display(),
                self.driver_root.display()
            ),
            Err(_) => "nvidia-ctk cdi generate (not installed)".into(),
        }
    }

    fn generate(&self, vendor: &str, class: &str, output: &Path) -> Result<(), GenerateError> {
        let program = self
            .program()
            .map_err(|e| GenerateError::NotInstalled(e.to_string()))?;
        let spec = CommandSpec {
            program: program.clone(),
            args: self.args(vendor, class, output),
            env: BTreeMap::from([("PATH".to_string(), PATH.to_string())]),
            stdin: Vec::new(),
            timeout: self.timeout,
            private_shm: None,
            new_process_group: false,
        };
        let out = self
            .runner
            .run(&spec)
            .map_err(|e| GenerateError::Failed(format!("running {}: {e}", program.display())))?;
        if out.timed_out {
            return Err(GenerateError::Failed(format!(
                "{} cdi generate ran past {} s and was killed; output: {}",
                program.display(),
                self.timeout.as_secs(),
                out.summary()
            )));
        }
        if !out.success() {
            return Err(GenerateError::Failed(format!(
                "{} cdi generate failed: {}",
                program.display(),
                out.summary()
            )));
        }
        if !output.is_file() {
            return Err(GenerateError::Failed(format!(
                "{} cdi generate wrote no {}; output: {}",
                program.display(),
                output.display(),
                out.summary()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::CommandOutput;
    use std::sync::Mutex;

    /// Records the run and writes `spec` where `--output` says (or not).
    #[derive(Debug, Default)]
    struct Ctk {
        runs: Mutex<Vec<CommandSpec>>,
        answer: Option<CommandOutput>,
        write: bool,
    }

    impl CommandRunner for Ctk {
        fn run(&self, spec: &CommandSpec) -> std::io::Result<CommandOutput> {
            self.runs.lock().unwrap().push(spec.clone());
            if self.write {
                let at = spec.args.iter().position(|a| a == "--output").unwrap();
                std::fs::write(&spec.args[at + 1], "{}").unwrap();
            }
            Ok(self.answer.clone().unwrap_or(CommandOutput {
                code: Some(0),
                stdout: String::new(),
                stderr: String::new(),
                timed_out: false,
            }))
        }
    }

    fn fake_ctk(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("nvidia-ctk");
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn runs_cdi_generate_with_our_kind_uuids_and_the_driver_root_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let program = fake_ctk(dir.path());
        let runner = Arc::new(Ctk {
            write: true,
            ..Ctk::default()
        });
        let ctk = NvidiaCtk::new(
            &program,
            Path::new("/run/nvidia/driver"),
            runner.clone(),
            Duration::from_secs(7),
        );
        let out = dir.path().join("out.json");
        ctk.generate("gpushare.io", "gpu", &out).unwrap();
        let runs = runner.runs.lock().unwrap();
        assert_eq!(runs[0].program, program);
        assert_eq!(
            runs[0].args.join(" "),
            format!(
                "cdi generate --vendor gpushare.io --class gpu --device-name-strategy uuid --driver-root /run/nvidia/driver --format json --output {}",
                out.display()
            )
        );
        assert_eq!(runs[0].timeout, Duration::from_secs(7));
        assert!(runs[0].env.contains_key("PATH"));
    }

    #[test]
    fn its_inputs_change_with_the_program_and_the_drivers_libraries() {
        let dir = tempfile::tempdir().unwrap();
        let program = fake_ctk(dir.path());
        let ctk = NvidiaCtk::new(
            &program,
            dir.path(),
            Arc::new(Ctk::default()),
            Duration::from_secs(1),
        );
        let first = ctk.inputs();
        assert_eq!(ctk.inputs(), first, "nothing changed");
        assert!(first.contains(&program.display().to_string()), "{first}");
        // A toolkit update replaces the program (a new file).
        let next = dir.path().join("nvidia-ctk.new");
        std::fs::write(&next, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::rename(&next, &program).unwrap();
        let updated = ctk.inputs();
        assert_ne!(updated, first);
        // A driver update runs ldconfig.
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join(LIBRARY_CACHE), "cache").unwrap();
        assert_ne!(ctk.inputs(), updated);
        assert_eq!(ctk.timeout(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn not_installed_failed_and_timed_out_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let gone = NvidiaCtk::new(
            &dir.path().join("nvidia-ctk"),
            Path::new("/"),
            Arc::new(Ctk::default()),
            Duration::from_secs(1),
        );
        let e = gone
            .generate("gpushare.io", "gpu", &dir.path().join("o.json"))
            .unwrap_err();
        assert!(
            matches!(&e, GenerateError::NotInstalled(m) if m.contains("is not an executable file")),
            "{e}"
        );
        let searched = find(Path::new(""), |_| false).unwrap_err();
        assert_eq!(searched, FindError::NotInDirs);
        let searched = searched.to_string();
        assert!(
            searched.contains("/usr/bin") && searched.contains("/usr/local/nvidia/toolkit"),
            "{searched}"
        );
        assert_eq!(
            find(Path::new("/opt/ctk"), |_| false)
                .unwrap_err()
                .to_string(),
            "[cdi] nvidia_ctk /opt/ctk is not an executable file"
        );
        assert_eq!(
            find(Path::new(""), |p| p
                == Path::new("/usr/local/bin/nvidia-ctk"))
            .unwrap(),
            PathBuf::from("/usr/local/bin/nvidia-ctk")
        );

        let program = fake_ctk(dir.path());
        let failing = NvidiaCtk::new(
            &program,
            Path::new("/"),
            Arc::new(Ctk {
                answer: Some(CommandOutput {
                    code: Some(1),
                    stdout: String::new(),
                    stderr: "ERRO failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND\n".into(),
                    timed_out: false,
                }),
                ..Ctk::default()
            }),
            Duration::from_secs(1),
        );
        let e = failing
            .generate("gpushare.io", "gpu", &dir.path().join("o.json"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ERROR_LIBRARY_NOT_FOUND") && e.contains("exit 1"),
            "{e}"
        );
        let slow = NvidiaCtk::new(
            &program,
            Path::new("/"),
            Arc::new(Ctk {
                answer: Some(CommandOutput {
                    code: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    timed_out: true,
                }),
                ..Ctk::default()
            }),
            Duration::from_secs(3),
        );
        let e = slow
            .generate("gpushare.io", "gpu", &dir.path().join("o.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ran past 3 s"), "{e}");
        let silent = NvidiaCtk::new(
            &program,
            Path::new("/"),
            Arc::new(Ctk::default()),
            Duration::from_secs(1),
        );
        let e = silent
            .generate("gpushare.io", "gpu", &dir.path().join("o.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("wrote no"), "{e}");
    }
}
