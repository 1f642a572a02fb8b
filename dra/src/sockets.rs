//! kubelet's socket directories: our sockets' stale leftovers, and other plugins that
//! registered the same driver name (NVIDIA's included, whose rolling-update sockets are
//! `<driver>-<uid>-reg.sock`), found by asking every live socket for `GetInfo`.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::grpc::registration::{registration_client::RegistrationClient, InfoRequest, PluginInfo};

/// A gRPC channel to a Unix socket (`unix:<absolute path>`).
///
/// # Errors
/// The socket does not accept a connection within `timeout`.
pub async fn channel(path: &Path, timeout: Duration) -> Result<tonic::transport::Channel, String> {
    let endpoint = tonic::transport::Endpoint::try_from(format!("unix:{}", path.display()))
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout)
        .timeout(timeout);
    match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!(
            "{e}: {}",
            std::error::Error::source(&e)
                .map(ToString::to_string)
                .unwrap_or_default()
        )),
        Err(_) => Err(format!("no connection within {} ms", timeout.as_millis())),
    }
}

/// Asks the registration socket at `path` for its `PluginInfo` (kubelet allows 1 s).
///
/// # Errors
/// No connection, or no answer within `timeout`.
pub async fn get_info(path: &Path, timeout: Duration) -> Result<PluginInfo, String> {
    let ch = channel(path, timeout).await?;
    let mut c = RegistrationClient::new(ch);
    match tokio::time::timeout(timeout, c.get_info(InfoRequest {})).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("GetInfo: {}", s.message())),
        Err(_) => Err(format!(
            "GetInfo: no answer within {} ms",
            timeout.as_millis()
        )),
    }
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Every live plugin in `registry_dir` registered for `driver`: (socket, its info).
/// Names starting with `.` are skipped, as kubelet skips them; sockets that do not answer
/// are stale and ignored.
pub async fn plugins_for_driver(registry_dir: &Path, driver: &str) -> Vec<(PathBuf, PluginInfo)> {
    let Ok(entries) = std::fs::read_dir(registry_dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if e.file_name().to_string_lossy().starts_with('.') || !is_socket(&path) {
            continue;
        }
        if let Ok(info) = get_info(&path, Duration::from_secs(1)).await {
            if info.name == driver {
                found.push((path, info));
            }
        }
    }
    found
}

/// Why a socket path cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something answers on it: another instance is running.
    #[error("{0} is in use by a running process (another gpushare-dra for this driver?)")]
    InUse(PathBuf),
    /// It is not a socket; we never remove what is not ours.
    #[error("{0} exists and is not a socket; remove it by hand if it is not needed")]
    NotASocket(PathBuf),
    /// Removing or creating failed.
    #[error("{path}: {error}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

/// Makes `path` free for binding: removes a stale socket of ours (one nothing answers on,
/// left by a crash or `kill -9`) and creates the parent directory.
///
/// # Errors
/// [`SocketError`]: something answers on it, it is not a socket, or I/O failed.
pub async fn clear_stale(path: &Path) -> Result<(), SocketError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|error| SocketError::Io {
            path: parent.to_path_buf(),
            error,
        })?;
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(SocketError::Io {
                path: path.to_path_buf(),
                error,
            })
        }
        Ok(m) if !m.file_type().is_socket() => return Err(SocketError::NotASocket(path.into())),
        Ok(_) => {}
    }
    if tokio::net::UnixStream::connect(path).await.is_ok() {
        return Err(SocketError::InUse(path.into()));
    }
    tracing::info!(socket = %path.display(), "removing a stale socket left by an earlier run");
    std::fs::remove_file(path).map_err(|error| SocketError::Io {
        path: path.to_path_buf(),
        error,
    })
}
