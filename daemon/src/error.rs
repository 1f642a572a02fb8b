//! The service's error: a stable protocol code plus a message naming what failed.

use gpushare_proto::{ErrorBody, ErrorCode};

use crate::config::ConfigError;

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
