//! `detach`: unties a container from its claim (the hook, at `poststop`). Never fails for a
//! container or claim that is not there: the hook's `poststop` must not fail a container's
//! removal.

use gpushare_proto::{DetachParams, DetachResult};

use super::super::Service;
use crate::config;
use crate::error::ServiceError;

impl Service {
    /// Unties a container from its claim. Idempotent.
    ///
    /// # Errors
    /// `InvalidRequest` for a malformed UID.
    pub fn detach(&self, p: &DetachParams) -> Result<DetachResult, ServiceError> {
        config::validate_claim_uid(&p.claim_uid)?;
        let mut st = self.state();
        let Some(attached) = st.claims.attachments_mut(&p.claim_uid) else {
            return Ok(DetachResult { detached: false });
        };
        let before = attached.len();
        attached.retain(|a| a.container_id != p.container_id);
        let detached = attached.len() != before;
        if detached {
            st.unlock();
            // A record that keeps the container after a crash only holds its slot until the
            // next attach or start sees its process gone.
            if let Err(e) = self.write_host_record(&p.claim_uid) {
                tracing::warn!(claim = %p.claim_uid, error = %e, "recording a detach");
            }
            tracing::info!(claim = %p.claim_uid, container = %p.container_id, "container detached");
        }
        Ok(DetachResult { detached })
    }
}
