//! A blocking client: one connection, one request at a time, every wait bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{ErrorBody, Method, Request, Response, PROTOCOL_VERSION};

/// Largest response line the client accepts (a `list_claims` of thousands of claims fits).
const MAX_RESPONSE_BYTES: u64 = 64 * 1024 * 1024;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached (daemon down, wrong path, no permission).
    // The I/O error is part of the message, not a `source`, so that error chains
    // (`anyhow`'s `{:#}`) do not print it twice.
    #[error("cannot connect to gpushared at {}: {error}", path.display())]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Underlying error.
        error: std::io::Error,
    },
    /// Reading or writing failed, or the timeout passed.
    #[error("talking to gpushared at {}: {error}", path.display())]
    Io {
        /// Socket path.
        path: PathBuf,
        /// Underlying error (`WouldBlock`/`TimedOut` when the timeout passed).
        error: std::io::Error,
    },
    /// The daemon's answer was not a valid response.
    #[error("bad response from gpushared: {0}")]
    Protocol(String),
    /// The daemon refused the request.
    #[error("{0}")]
    Remote(ErrorBody),
}

impl ClientError {
    /// The daemon's error, if the daemon answered with one.
    pub fn remote(&self) -> Option<&ErrorBody> {
        match self {
            ClientError::Remote(body) => Some(body),
            _ => None,
        }
    }
}

/// A connection to `gpushared`.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    next_id: u64,
}

impl Client {
    /// Connects to the socket at `path`; every later read and write waits at most `timeout`.
    ///
    /// # Errors
    /// [`ClientError::Connect`] when the socket cannot be reached.
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Client, ClientError> {
        let path = path.as_ref().to_path_buf();
        let stream = UnixStream::connect(&path).map_err(|error| ClientError::Connect {
            path: path.clone(),
            error,
        })?;
        let io = |error| ClientError::Io {
            path: path.clone(),
            error,
        };
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        Ok(Client {
            path,
            reader: BufReader::new(stream),
            next_id: 1,
        })
    }

    /// Sends one request and waits for its response.
    ///
    /// # Errors
    /// [`ClientError::Remote`] when the daemon refused; the other variants when the exchange
    /// itself failed.
    pub fn call<P: Serialize, R: DeserializeOwned>(
        &mut self,
        method: Method,
        params: Option<&P>,
    ) -> Result<R, ClientError> {
        let value = self.call_value(method, params)?;
        serde_json::from_value(value)
            .map_err(|e| ClientError::Protocol(format!("{method} result: {e}")))
    }

    /// Like [`Client::call`], returning the raw JSON result.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub fn call_value<P: Serialize>(
        &mut self,
        method: Method,
        params: Option<&P>,
    ) -> Result<serde_json::Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let params = params
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| ClientError::Protocol(format!("encoding params: {e}")))?;
        let request = Request {
            version: PROTOCOL_VERSION,
            id,
            method: method.as_str().to_string(),
            params,
        };
        let mut line = serde_json::to_vec(&request)
            .map_err(|e| ClientError::Protocol(format!("encoding request: {e}")))?;
        line.push(b'\n');
        let path = self.path.clone();
        let io = |error| ClientError::Io {
            path: path.clone(),
            error,
        };
        self.reader.get_mut().write_all(&line).map_err(io)?;

        let mut buf = String::new();
        let n = (&mut self.reader)
            .take(MAX_RESPONSE_BYTES)
            .read_line(&mut buf)
            .map_err(io)?;
        if n == 0 {
            return Err(ClientError::Protocol(
                "connection closed before a response".into(),
            ));
        }
        let response: Response = serde_json::from_str(buf.trim_end())
            .map_err(|e| ClientError::Protocol(format!("{e}")))?;
        if response.id != id {
            return Err(ClientError::Protocol(format!(
                "response id {} does not match request id {id}",
                response.id
            )));
        }
        match (response.result, response.error) {
            (_, Some(error)) => Err(ClientError::Remote(error)),
            (Some(result), None) => Ok(result),
            (None, None) => Err(ClientError::Protocol(
                "response has neither result nor error".into(),
            )),
        }
    }
}
