//! Which MPS control program `gpushared` runs when `[mps] control` is empty: NVIDIA's
//! `nvidia-cuda-mps-control` from `PATH`, else our emulator installed beside `gpushared`.
//! `gpushared` and `gpushare doctor` both ask here, so the doctor checks what the daemon
//! would actually run. Pure: the caller says what `PATH` holds and where `gpushared` lives.

use std::path::{Path, PathBuf};

/// NVIDIA's MPS control program.
pub const NVIDIA: &str = "nvidia-cuda-mps-control";

/// Our emulator (`mps-emulator/`): answers like NVIDIA's 535 but drives no GPU, so it is
/// only good for simulated GPUs.
pub const EMULATOR: &str = "gpushare-mps-control";

/// Neither NVIDIA's MPS control program nor our emulator is there ([`default_program`]);
/// the message names both places.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no MPS control program: {} is not in PATH and {} does not exist", NVIDIA, emulator.display())]
pub struct NoMpsProgram {
    /// Where the emulator was looked for, beside `gpushared`.
    pub emulator: PathBuf,
}

/// The program for an empty `[mps] control`: `which(NVIDIA)` when it finds one, else
/// `<gpushared_dir>/gpushare-mps-control` when `exists` says it is there.
///
/// # Errors
/// [`NoMpsProgram`] when neither is there.
pub fn default_program(
    which: impl Fn(&str) -> Option<PathBuf>,
    gpushared_dir: &Path,
    exists: impl Fn(&Path) -> bool,
) -> Result<PathBuf, NoMpsProgram> {
    if let Some(p) = which(NVIDIA) {
        return Ok(p);
    }
    let emulator = gpushared_dir.join(EMULATOR);
    if exists(&emulator) {
        return Ok(emulator);
    }
    Err(NoMpsProgram { emulator })
}

/// Whether `program` is our emulator (by its file name).
pub fn is_emulator(program: &Path) -> bool {
    program.file_name().is_some_and(|n| n == EMULATOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidias_program_first_then_the_emulator_beside_gpushared() {
        let dir = Path::new("/usr/bin");
        let nvidia = |n: &str| (n == NVIDIA).then(|| PathBuf::from("/usr/sbin").join(n));
        let none = |_: &str| None;
        assert_eq!(
            default_program(nvidia, dir, |_| true).unwrap(),
            Path::new("/usr/sbin/nvidia-cuda-mps-control")
        );
        let emu = default_program(none, dir, |_| true).unwrap();
        assert_eq!(emu, Path::new("/usr/bin/gpushare-mps-control"));
        assert!(is_emulator(&emu));
        let e = default_program(none, dir, |_| false).unwrap_err();
        assert_eq!(e.emulator, Path::new("/usr/bin/gpushare-mps-control"));
        let e = e.to_string();
        assert!(
            e.contains("nvidia-cuda-mps-control is not in PATH")
                && e.contains("/usr/bin/gpushare-mps-control does not exist"),
            "{e}"
        );
    }
}
