//! gpushared over its socket, with the blocking `gpushare-proto` client run on tokio's
//! blocking pool: one connection per call, so calls for different claims run in parallel
//! (gpushared serves one claim's calls one at a time itself).

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpushare_proto::{
    ClaimInfo, Client, ClientError, ErrorBody, ErrorCode, GpuInfo, Method, PrepareParams,
    PrepareResult, UidParams, UnprepareResult,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Why a call to gpushared failed, as a claim's error reads it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpusharedError {
    /// gpushared refused, with its stable code and message.
    #[error("gpushared: {0}")]
    Refused(ErrorBody),
    /// gpushared could not be reached or did not answer.
    #[error("gpushared is unreachable: {0}")]
    Unreachable(String),
}

impl GpusharedError {
    /// gpushared's error code, when it answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            GpusharedError::Refused(b) => Some(b.code),
            GpusharedError::Unreachable(_) => None,
        }
    }
}

impl From<ClientError> for GpusharedError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Remote(body) => GpusharedError::Refused(body),
            other => GpusharedError::Unreachable(other.to_string()),
        }
    }
}

/// A handle on gpushared's socket (cheap to clone).
#[derive(Debug, Clone)]
pub struct Gpushared {
    socket: PathBuf,
    timeout: Duration,
}

impl Gpushared {
    /// gpushared at `socket`; every read and write of a call waits at most `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Gpushared {
        Gpushared {
            socket: socket.into(),
            timeout,
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn call<P, R>(&self, method: Method, params: Option<P>) -> Result<R, GpusharedError>
    where
        P: Serialize + Send + 'static,
        R: DeserializeOwned + Send + 'static,
    {
        let socket = self.socket.clone();
        let timeout = self.timeout;
        tokio::task::spawn_blocking(move || {
            let mut c = Client::connect(&socket, timeout)?;
            c.call::<P, R>(method, params.as_ref())
        })
        .await
        .map_err(|e| GpusharedError::Unreachable(format!("the call's task failed: {e}")))?
        .map_err(GpusharedError::from)
    }

    /// `prepare` of a whole ResourceClaim object.
    ///
    /// # Errors
    /// gpushared's refusal, or why it could not be reached.
    pub async fn prepare(&self, claim: Value) -> Result<PrepareResult, GpusharedError> {
        self.call(Method::Prepare, Some(PrepareParams { claim }))
            .await
    }

    /// `unprepare` by claim UID (an unknown UID is `released: false`, not an error).
    ///
    /// # Errors
    /// As [`Gpushared::prepare`].
    pub async fn unprepare(&self, uid: &str) -> Result<UnprepareResult, GpusharedError> {
        self.call(Method::Unprepare, Some(UidParams { uid: uid.into() }))
            .await
    }

    /// `health`, raw: newer fields (such as `drivers`) are read where present.
    ///
    /// # Errors
    /// As [`Gpushared::prepare`].
    pub async fn health(&self) -> Result<Value, GpusharedError> {
        self.call::<(), Value>(Method::Health, None).await
    }

    /// `list_gpus`.
    ///
    /// # Errors
    /// As [`Gpushared::prepare`].
    pub async fn list_gpus(&self) -> Result<Vec<GpuInfo>, GpusharedError> {
        self.call::<(), Vec<GpuInfo>>(Method::ListGpus, None).await
    }

    /// Every claim, by `list_claims` pages ([`Client::list_claims`]: no answer line is
    /// large, whatever the claim count; the whole list from a gpushared of protocol version 1).
    ///
    /// # Errors
    /// As [`Gpushared::prepare`].
    pub async fn list_claims(&self) -> Result<Vec<ClaimInfo>, GpusharedError> {
        let socket = self.socket.clone();
        let timeout = self.timeout;
        tokio::task::spawn_blocking(move || Client::connect(&socket, timeout)?.list_claims())
            .await
            .map_err(|e| GpusharedError::Unreachable(format!("the call's task failed: {e}")))?
            .map_err(GpusharedError::from)
    }
}

/// What gpushared's `health` says about who it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its node name.
    pub node_name: String,
    /// Its driver names; `None` from a gpushared that does not report them.
    pub drivers: Option<Vec<String>>,
}

impl Identity {
    /// Reads `node_name` and, where present, `drivers` from a `health` result.
    pub fn of_health(h: &Value) -> Identity {
        Identity {
            node_name: h["node_name"].as_str().unwrap_or_default().to_string(),
            drivers: h.get("drivers").and_then(Value::as_array).map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            }),
        }
    }

    /// `Err` with one line naming both values when this plugin's node or driver does not
    /// match gpushared's (a configuration error: restarting cannot fix it).
    ///
    /// # Errors
    /// The mismatch, as one line.
    pub fn check(&self, node_name: &str, driver: &str) -> Result<(), String> {
        if self.node_name != node_name {
            return Err(format!(
                "node name mismatch: gpushare-dra serves node {node_name:?} but gpushared serves \
                 node {:?}; set --node-name (or node_name in /etc/gpushare/dra.toml) to \
                 kubelet's node name, and gpushared's [node] name to the same",
                self.node_name
            ));
        }
        if let Some(drivers) = &self.drivers {
            if !drivers.iter().any(|d| d == driver) {
                return Err(format!(
                    "driver name mismatch: gpushare-dra serves driver {driver:?} but gpushared \
                     serves {drivers:?}; set --driver-name to one of them, or add it to \
                     gpushared's [node] drivers"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_mismatch_names_both_values() {
        let h = serde_json::json!({"node_name": "node-a", "drivers": ["gpu.nvidia.com"]});
        let id = Identity::of_health(&h);
        id.check("node-a", "gpu.nvidia.com").unwrap();
        let e = id.check("node-b", "gpu.nvidia.com").unwrap_err();
        assert!(e.contains("\"node-b\"") && e.contains("\"node-a\""), "{e}");
        assert!(!e.contains('\n'));
        let e = id.check("node-a", "gpu.example.com").unwrap_err();
        assert!(
            e.contains("gpu.example.com") && e.contains("gpu.nvidia.com"),
            "{e}"
        );
        // A gpushared that does not report its drivers is only checked by node.
        let old = Identity::of_health(&serde_json::json!({"node_name": "node-a"}));
        old.check("node-a", "anything.example.com").unwrap();
    }
}
