//! `gpushare-mps-control`: a stand-in for NVIDIA's `nvidia-cuda-mps-control` (driver 535,
//! legacy "v2" command interface) on hosts where NVIDIA's program is absent.
//!
//! gpushared drives it exactly like NVIDIA's program: `-d` starts a control daemon for
//! `CUDA_MPS_PIPE_DIRECTORY`, and running the program without options sends stdin's lines
//! as commands. Replies, exit codes, control.log lines and pipe-directory artefacts follow
//! what NVIDIA's 535 program does, including its parsing quirks. No GPU is involved: MPS
//! servers are simulated and fail at once, as NVIDIA's do on a host without a GPU.
//!
//! Modules: [`cli`] (arguments, directories), [`command`] (pure state and interpreter),
//! [`cnum`] (C number scanning), [`log`] (log line format), [`wire`] (UI↔daemon framing),
//! [`ui`] (front end), [`daemon`] (control daemon).

pub mod cli;
pub mod cnum;
pub mod command;
pub mod daemon;
pub mod log;
pub mod ui;
pub mod wire;

/// Entry point shared by the binary: dispatches on the arguments after the program name
/// and returns the process exit status.
pub fn main_with_args(args: &[std::ffi::OsString]) -> i32 {
    let dirs = cli::Dirs::from_env();
    match cli::parse_mode(args) {
        cli::Mode::Help => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(cli::HELP.as_bytes());
            let _ = out.flush();
            0
        }
        cli::Mode::Daemon { foreground, .. } => daemon::run(&dirs, foreground),
        cli::Mode::Ui => ui::run(&dirs),
    }
}
