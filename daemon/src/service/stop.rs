//! The graceful stop (SIGTERM): changing requests are counted while under way, refused once
//! the stop begins, and waited for (bounded); then the records are written and the downgrade
//! export (see `crate::store`). Also the watchdog's probe: whether the registry, which every
//! change takes, answers at all.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare_proto::ErrorCode;

use super::{now_secs, Service};
use crate::error::ServiceError;

/// Counts a prepare or unprepare under way until dropped.
pub(super) struct InFlight<'a>(&'a Service);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let (count, done) = &self.0.in_flight;
        let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        done.notify_all();
    }
}

impl Service {
    /// Registers a changing request, or refuses it while the daemon stops.
    pub(super) fn begin_change(&self) -> Result<InFlight<'_>, ServiceError> {
        let (count, _) = &self.in_flight;
        let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
        if self.state().stopping {
            return Err(ServiceError::new(
                ErrorCode::NotReady,
                "gpushared is stopping; retry when it is back",
            ));
        }
        *n += 1;
        Ok(InFlight(self))
    }

    /// Whether a graceful stop has begun.
    pub fn is_stopping(&self) -> bool {
        self.state().stopping
    }

    /// Graceful stop: refuses new prepares and unprepares, waits at most `bound` for those
    /// under way, then writes the checkpoint. MPS control daemons are left running.
    /// Returns whether everything under way finished within the bound.
    ///
    /// # Errors
    /// The checkpoint cannot be written (the previous one stays).
    pub fn stop(&self, bound: Duration) -> Result<bool, ServiceError> {
        self.state().stopping = true;
        let (count, done) = &self.in_flight;
        let deadline = Instant::now() + bound;
        let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            n = done
                .wait_timeout(n, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let finished = *n == 0;
        drop(n);
        if !finished {
            tracing::warn!(
                bound_s = bound.as_secs(),
                "requests still under way at the stop bound; the next start reconciles them"
            );
        }
        // Whatever is still queued is written; then the whole node as a version 2 checkpoint,
        // which is what a previous release reads after a downgrade (the next start of this
        // one knows it for its own export and removes it).
        let mut st = self.state();
        st.stopping = true;
        // What is queued is written, and the records missing from disk (an operator's `rm`,
        // a lost volume: the next start after a reboot would have no host record to rebuild
        // them from). The others are not written again: they are on disk in this build's
        // format already (the start wrote again those that were not), and a flush each took a
        // stop with 10,000 claims past systemd's stop timeout. A directory that cannot be
        // listed gets every record.
        let on_disk = self.records.store.claims_on_disk().unwrap_or_default();
        let missing: Vec<String> = st
            .claims
            .keys()
            .filter(|uid| !on_disk.contains(*uid))
            .cloned()
            .collect();
        for uid in &missing {
            st.claims.mark_durable(uid);
        }
        let mut export = crate::checkpoint::Checkpoint {
            boot_id: st.boot_id.clone(),
            generation: st.claim_generation,
            claims: st
                .claims
                .iter()
                .map(|(k, c)| (k.clone(), crate::claim::wire::claim_info(c)))
                .collect(),
            tombstones: BTreeMap::clone(&st.tombstones),
            ..crate::checkpoint::Checkpoint::default()
        };
        export.prune_tombstones(now_secs());
        self.commit(st)?;
        self.records.store.export(&export).map_err(|e| {
            ServiceError::internal(format!(
                "writing checkpoint {} for a downgrade: {e}",
                self.cfg.checkpoint.display()
            ))
        })?;
        Ok(finished)
    }
}

/// Whether the registry answers within `bound`: a probe thread takes and drops its lock,
/// the path every change takes (readers use the published view and would answer even with a
/// change stuck in the registry). What `gpushared` pings the systemd watchdog on: a wedged
/// registry stops the pings, and systemd restarts the daemon (MPS control daemons stay).
pub fn registry_answers(service: &Arc<Service>, bound: Duration) -> bool {
    let (tx, rx) = mpsc::channel();
    let probe = Arc::clone(service);
    let spawned = std::thread::Builder::new()
        .name("watchdog-probe".into())
        .spawn(move || {
            drop(probe.state());
            let _ = tx.send(());
        });
    spawned.is_ok() && rx.recv_timeout(bound).is_ok()
}
