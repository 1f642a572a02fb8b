//! Reading and atomically rewriting a bundle's `config.json`.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The OCI config file of a bundle.
pub fn config_path(bundle: &Path) -> PathBuf {
    bundle.join("config.json")
}

/// Why the config could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be read.
    Io(std::io::Error),
    /// The file is not JSON.
    Json(serde_json::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Json(e) => write!(f, "not valid JSON: {e}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// Reads an OCI config file (normally `<bundle>/config.json`) as generic JSON, so that
/// unknown fields survive.
pub fn read_config(file: &Path) -> Result<Value, ReadError> {
    let data = std::fs::read(file).map_err(ReadError::Io)?;
    serde_json::from_slice(&data).map_err(ReadError::Json)
}

/// Replaces the OCI config file `file` with `config`, atomically: a temporary file beside it
/// gets the old file's permission bits and (best effort) owner, is written and fsynced, then
/// renamed over the old one, and the directory is fsynced. A reader sees the old or the new
/// file, never a partial one.
pub fn write_config(file: &Path, config: &Value) -> std::io::Result<()> {
    let target = file.to_path_buf();
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let old = std::fs::metadata(&target).ok();
    let mut tmp = tempfile::Builder::new()
        .prefix(".config.json.gpushare-")
        .tempfile_in(&dir)?;
    let mode = old
        .as_ref()
        .map_or(0o644, |m| m.permissions().mode() & 0o7777);
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    if let Some(m) = &old {
        // Keeping the owner only matters when it is not us; failing to is not fatal.
        let _ = std::os::unix::fs::fchown(tmp.as_file(), Some(m.uid()), Some(m.gid()));
    }
    let data = serde_json::to_vec(config).map_err(std::io::Error::other)?;
    tmp.write_all(&data)?;
    tmp.as_file().sync_all()?;
    tmp.persist(&target).map_err(|e| e.error)?;
    std::fs::File::open(&dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_keeps_mode_and_unknown_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = config_path(dir.path());
        std::fs::write(
            &path,
            r#"{"ociVersion":"1.0.2","x-vendor":{"a":[1,2]},"process":{"env":[]}}"#,
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut config = read_config(&config_path(dir.path())).unwrap();
        config["process"]["env"] = json!(["A=1"]);
        write_config(&config_path(dir.path()), &config).unwrap();
        let back = read_config(&config_path(dir.path())).unwrap();
        assert_eq!(back, config);
        assert_eq!(back["x-vendor"], json!({"a": [1, 2]}));
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("config.json")]);
    }

    #[test]
    fn read_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_config(&config_path(dir.path())),
            Err(ReadError::Io(_))
        ));
        std::fs::write(config_path(dir.path()), "{broken").unwrap();
        let err = read_config(&config_path(dir.path())).unwrap_err();
        assert!(matches!(err, ReadError::Json(_)));
        assert!(err.to_string().starts_with("not valid JSON"));
    }

    #[test]
    fn writing_into_a_missing_bundle_fails() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write_config(&dir.path().join("missing/config.json"), &json!({})).is_err());
    }
}
