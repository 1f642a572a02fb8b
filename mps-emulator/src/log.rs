//! control.log / server.log writing in NVIDIA's line format.
//!
//! Lines look like `[2026-11-29 15:14:36.652 Control  8213] message`: local time with
//! milliseconds, the record type, the writer's pid right-aligned in 5 columns. Files are
//! opened in append mode and each line goes out in one `write` so that lines from other
//! writers (servers relayed through the `log` FIFO) never interleave mid-line.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Record type shown after the timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Lines of the control daemon itself.
    Control,
    /// Lines of helper processes (535 uses it for `Using log directory: ...`).
    Other,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Control => "Control",
            Kind::Other => "Other",
        }
    }
}

/// Formats one line (with its trailing newline) for a given local timestamp text
/// (`YYYY-MM-DD HH:MM:SS.mmm`).
pub fn format_line(timestamp: &str, kind: Kind, pid: u32, message: &str) -> String {
    format!("[{timestamp} {} {pid:>5}] {message}\n", kind.as_str())
}

/// Current local time as `YYYY-MM-DD HH:MM:SS.mmm`.
pub fn now_stamp() -> String {
    chrono::Local::now()
        .format("%Y-%m-%d %H:%M:%S%.3f")
        .to_string()
}

/// Formats a line stamped with the current time and this process's pid.
pub fn line_now(kind: Kind, message: &str) -> String {
    format_line(&now_stamp(), kind, std::process::id(), message)
}

/// Opens a log file the way 535 does: append, create with 0666 minus the umask.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o666)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// Where the control daemon's lines go.
#[derive(Debug)]
pub enum Sink {
    /// `-d`: `<logdir>/control.log` (`None` when it could not be opened: no logs then).
    File(Option<File>),
    /// `-f`: standard output.
    Stdout,
}

impl Sink {
    /// Appends one `Control` line.
    pub fn log(&mut self, message: &str) {
        self.write_raw(line_now(Kind::Control, message).as_bytes());
    }

    /// Appends already formatted bytes (lines relayed from the `log` FIFO in `-f` mode).
    ///
    /// Logging must never stop the daemon, so write errors are ignored, as a full disk
    /// would be by NVIDIA's daemon.
    pub fn write_raw(&mut self, bytes: &[u8]) {
        match self {
            Sink::File(Some(file)) => {
                let _ = file.write_all(bytes);
            }
            Sink::File(None) => {}
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(bytes);
                let _ = out.flush();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_is_right_aligned_in_five_columns() {
        assert_eq!(
            format_line(
                "2026-11-29 15:14:36.652",
                Kind::Control,
                8213,
                "Starting control daemon using socket /x/pipe/control"
            ),
            "[2026-11-29 15:14:36.652 Control  8213] Starting control daemon using socket /x/pipe/control\n"
        );
        assert_eq!(
            format_line("t", Kind::Control, 10153, "m"),
            "[t Control 10153] m\n"
        );
        assert_eq!(
            format_line("t", Kind::Other, 7, "Using log directory: /l"),
            "[t Other     7] Using log directory: /l\n"
        );
        assert_eq!(
            format_line("t", Kind::Control, 1234567, ""),
            "[t Control 1234567] \n"
        );
    }

    #[test]
    fn stamp_shape() {
        let stamp = now_stamp();
        assert_eq!(stamp.len(), 23, "{stamp}");
        let b = stamp.as_bytes();
        for (i, c) in [
            (4, b'-'),
            (7, b'-'),
            (10, b' '),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
        ] {
            assert_eq!(b[i], c, "{stamp}");
        }
    }

    #[test]
    fn file_sink_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.log");
        std::fs::write(&path, "old\n").unwrap();
        let mut sink = Sink::File(Some(open_append(&path).unwrap()));
        sink.log("NEW UI");
        sink.write_raw(b"raw\n");
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "old");
        assert!(lines[1].ends_with("] NEW UI"), "{}", lines[1]);
        assert!(lines[1].contains(" Control "), "{}", lines[1]);
        assert_eq!(lines[2], "raw");
    }
}
