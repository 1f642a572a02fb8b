//! The service's error: a stable protocol code plus a message naming what failed.

use gpushare_proto::{ErrorBody, ErrorCode};

use crate::config::ConfigError;
use crate::gpu::GpuError;

/// A refused or failed request, as the socket reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ServiceError {
    /// Stable code.
    pub code: ErrorCode,
    /// One line naming the field, value or host operation at fault.
    pub message: String,
}

impl ServiceError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ServiceError {
        ServiceError {
            code,
            message: message.into(),
        }
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
        ServiceError::new(gpu_code(e), format!("{what}: {e}"))
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
