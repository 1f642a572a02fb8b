//! The systemd watchdog's pings, sent only while the claim registry answers.

use std::sync::Arc;
use std::time::Duration;

use gpushare::notify;
use gpushare::service::Service;

/// Pings the watchdog only while the path that changes take answers: a probe that takes the
/// claim registry's lock ([`gpushare::service::registry_answers`]), bounded by the ping
/// interval. A registry wedged by a stuck change stops the pings and systemd restarts the
/// daemon (the MPS control daemons stay: `KillMode=process`). `health` alone would not do:
/// it reads the published view and answers whatever the registry does.
pub(crate) async fn watchdog_loop(service: Arc<Service>, every: Duration) {
    loop {
        let probe = Arc::clone(&service);
        let answered =
            tokio::task::spawn_blocking(move || gpushare::service::registry_answers(&probe, every))
                .await;
        match answered {
            Ok(true) => notify::watchdog(),
            _ => tracing::error!(
                "the claim registry did not answer in time; not pinging the watchdog"
            ),
        }
        tokio::time::sleep(every).await;
    }
}
