//! Log lines in the shapes the callers read.
//!
//! containerd's runc shim reads the `--log` file after a failed runtime call and reports the
//! `msg` of the last line whose `level` is `error` (research notes §1.3). So every line is
//! one JSON object `{"level":"…","msg":"…","time":"RFC3339"}`, appended. With an explicit
//! `--log-format text` the runc-style text shape `time="…" level=… msg="…"` is used for the
//! `--log` file instead. Files are opened for append (created 0644, parent directories
//! created); a file that cannot be written is skipped, never an error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Severity, least verbose first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Failures that stop a container.
    Error,
    /// Problems worked around (a broken config file, a bad spec file).
    Warning,
    /// What was done (devices injected).
    Info,
    /// Details (the command line, the chosen runtime).
    Debug,
}

impl Level {
    /// The name written in log lines: `error`, `warning`, `info`, `debug`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warning => "warning",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    /// Parses a level name (`warn` is accepted for `warning`).
    pub fn parse(text: &str) -> Option<Level> {
        match text {
            "error" => Some(Level::Error),
            "warning" | "warn" => Some(Level::Warning),
            "info" => Some(Level::Info),
            "debug" => Some(Level::Debug),
            _ => None,
        }
    }
}

/// Line shape of one log file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"level":…,"msg":…,"time":…}`
    Json,
    /// `time="…" level=… msg="…"`
    Text,
}

/// Formats a UTC time as RFC 3339 with seconds, e.g. `2026-03-01T12:00:05Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01 so that leap days end each 400-year era's years.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of year from March 1st
    let mp = (5 * doy + 2) / 153; // month from March, 0..=11
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

/// One log line (without the newline).
pub fn format_line(format: Format, level: Level, msg: &str, time: &str) -> String {
    match format {
        Format::Json => {
            serde_json::json!({"level": level.as_str(), "msg": msg, "time": time}).to_string()
        }
        Format::Text => format!(
            "time={} level={} msg={}",
            serde_json::Value::from(time),
            level.as_str(),
            serde_json::Value::from(msg)
        ),
    }
}

/// Writes log lines to a set of files.
#[derive(Debug, Clone)]
pub struct Logger {
    level: Level,
    sinks: Vec<(PathBuf, Format)>,
}

impl Logger {
    /// A logger writing lines up to `level` (errors always) to no file yet.
    pub fn new(level: Level) -> Logger {
        Logger {
            level,
            sinks: Vec::new(),
        }
    }

    /// Adds a file to write to.
    pub fn add_file(&mut self, path: &Path, format: Format) {
        self.sinks.push((path.to_path_buf(), format));
    }

    /// Appends one line to every file, if `level` is within the logger's level.
    pub fn log(&self, level: Level, msg: &str) {
        if level > self.level {
            return;
        }
        let time = rfc3339(SystemTime::now());
        for (path, format) in &self.sinks {
            let line = format_line(*format, level, msg, &time);
            // Best effort: a log file we cannot write must not change the outcome.
            let _ = append_line(path, &line);
        }
    }

    /// [`Logger::log`] at [`Level::Error`].
    pub fn error(&self, msg: &str) {
        self.log(Level::Error, msg);
    }

    /// [`Logger::log`] at [`Level::Warning`].
    pub fn warning(&self, msg: &str) {
        self.log(Level::Warning, msg);
    }

    /// [`Logger::log`] at [`Level::Info`].
    pub fn info(&self, msg: &str) {
        self.log(Level::Info, msg);
    }

    /// [`Logger::log`] at [`Level::Debug`].
    pub fn debug(&self, msg: &str) {
        self.log(Level::Debug, msg);
    }
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(path)?;
    // One write per line, so concurrent writers (runc itself) never interleave inside it.
    file.write_all(format!("{line}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_709_251_199)),
            "2024-02-29T23:59:59Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(4_102_444_800)),
            "2100-01-01T00:00:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_735_689_599)),
            "2024-12-31T23:59:59Z"
        );
    }

    #[test]
    fn line_shapes() {
        let json = format_line(
            Format::Json,
            Level::Error,
            "unresolvable CDI devices \"a\"",
            "2026-01-01T00:00:00Z",
        );
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"level": "error", "msg": "unresolvable CDI devices \"a\"", "time": "2026-01-01T00:00:00Z"})
        );
        assert!(!json.contains('\n'));
        let text = format_line(Format::Text, Level::Warning, "a \"b\"\nc", "T");
        assert_eq!(text, r#"time="T" level=warning msg="a \"b\"\nc""#);
    }

    #[test]
    fn levels() {
        assert_eq!(Level::parse("warn"), Some(Level::Warning));
        assert_eq!(Level::parse("nope"), None);
        for l in [Level::Error, Level::Warning, Level::Info, Level::Debug] {
            assert_eq!(Level::parse(l.as_str()), Some(l));
        }
        assert!(Level::Error < Level::Debug);
    }

    #[test]
    fn files_get_lines_up_to_the_level() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("sub/dir/a.json");
        let b = dir.path().join("b.log");
        let mut logger = Logger::new(Level::Info);
        logger.add_file(&a, Format::Json);
        logger.add_file(&b, Format::Text);
        logger.add_file(Path::new("/proc/definitely/not/writable"), Format::Json);
        logger.debug("hidden");
        logger.info("shown");
        logger.error("bad");
        let a_text = std::fs::read_to_string(&a).unwrap();
        let lines: Vec<serde_json::Value> = a_text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["msg"], "shown");
        assert_eq!(lines[1]["level"], "error");
        let b_text = std::fs::read_to_string(&b).unwrap();
        assert_eq!(b_text.lines().count(), 2);
        assert!(b_text.contains("level=error msg=\"bad\""));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o600, 0o600);
    }
}
