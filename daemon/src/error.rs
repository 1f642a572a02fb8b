//! The service's error: a stable protocol code plus a message naming what failed, with the
//! error of the leaf that failed (a GPU backend's, an MPS control daemon's) kept as its
//! source, so that a log of it walks the chain while the socket answers code and message.

use std::error::Error;
use std::sync::Arc;

use gpushare_proto::{ErrorBody, ErrorCode};

use crate::config::ConfigError;
use crate::gpu::GpuError;

/// A refused or failed request, as the socket reports it. Two are equal when their code and
/// message are (the source is the message's detail, already in it).
#[derive(Debug, Clone)]
pub struct ServiceError {
    /// Stable code.
    pub code: ErrorCode,
    /// One line naming the field, value or host operation at fault.
    pub message: String,
    /// The leaf's error behind it, if one failed.
    pub source: Option<Arc<dyn Error + Send + Sync>>,
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

// By hand rather than thiserror's `#[source]`: the source is the leaf's error itself (a
// `GpuError` downcasts as one), not the `Arc` that shares it.
impl Error for ServiceError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

impl PartialEq for ServiceError {
    fn eq(&self, other: &ServiceError) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl Eq for ServiceError {}

impl ServiceError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ServiceError {
        ServiceError {
            code,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, with `source` as the leaf error behind it.
    #[must_use]
    pub fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> ServiceError {
        self.source = Some(Arc::new(source));
        self
    }

    /// An [`ErrorCode::Internal`] error: something on the host failed.
    pub fn internal(message: impl Into<String>) -> ServiceError {
        ServiceError::new(ErrorCode::Internal, message)
    }
}

impl ServiceError {
    /// A backend's refusal as a request's answer, `what` naming the operation and the
    /// device: the one mapping of GPU errors onto protocol codes. A setting or profile the
    /// GPU cannot take is `Unsupported`; one taken by others (processes on the GPU, an
    /// occupied placement) `Conflict`; an argument the driver refuses `InvalidConfig`; a GPU
    /// the node does not have `UnknownDevice`; anything else `Internal`.
    pub fn gpu(what: impl std::fmt::Display, e: &GpuError) -> ServiceError {
        ServiceError::new(gpu_code(e), format!("{what}: {e}")).with_source(e.clone())
    }
}

/// The protocol code of a backend error (see [`ServiceError::gpu`]).
pub fn gpu_code(e: &GpuError) -> ErrorCode {
    match e {
        GpuError::Unsupported(_) => ErrorCode::Unsupported,
        GpuError::Busy(_) | GpuError::InsufficientResources(_) => ErrorCode::Conflict,
        GpuError::InvalidArgument(_) => ErrorCode::InvalidConfig,
        GpuError::NoSuchGpu(_) => ErrorCode::UnknownDevice,
        GpuError::Failed(_) | GpuError::NotFound(_) => ErrorCode::Internal,
    }
}

impl From<ConfigError> for ServiceError {
    fn from(e: ConfigError) -> ServiceError {
        ServiceError::new(e.code, e.message)
    }
}

impl From<ServiceError> for ErrorBody {
    fn from(e: ServiceError) -> ErrorBody {
        ErrorBody {
            code: e.code,
            message: e.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_error_keeps_the_backends_error_as_its_source() {
        let e = ServiceError::gpu(
            "setting compute mode on gpu-0",
            &GpuError::Busy("2 processes".into()),
        );
        assert_eq!(e.code, ErrorCode::Conflict);
        assert_eq!(e.message, "setting compute mode on gpu-0: 2 processes");
        let source = e.source().expect("the backend's error");
        assert_eq!(source.to_string(), "2 processes");
        assert!(source.downcast_ref::<GpuError>().is_some());
        // The source is the message's detail: equality is code and message.
        assert_eq!(e, ServiceError::new(ErrorCode::Conflict, e.message.clone()));
    }
}
