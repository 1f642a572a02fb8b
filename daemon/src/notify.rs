//! systemd notifications (`sd_notify(3)`, through the `sd-notify` crate) for
//! `gpushared.service`'s `Type=notify`: `READY=1` once the socket is bound and the start-up
//! reconcile is done, `WATCHDOG=1` pings, and `RELOADING=1` … `READY=1` around a reload (AL2023
//! has systemd 252, which has no `Type=notify-reload`: `ExecReload` sends SIGHUP instead).
//!
//! Without `NOTIFY_SOCKET` (not started by systemd, or by a unit that is not `Type=notify`)
//! every call does nothing. A failed notification is logged, never fatal: the service is no
//! less able to serve because systemd's socket went away.

use std::time::Duration;

use sd_notify::NotifyState;

fn send(what: &str, states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, notification = what, "notifying systemd failed");
    }
}

/// `READY=1` with a `STATUS=` line shown by `systemctl status`.
pub fn ready(status: &str) {
    send(
        "READY=1",
        &[NotifyState::Ready, NotifyState::Status(status)],
    );
}

/// `RELOADING=1` with `MONOTONIC_USEC` (systemd ≥ 253 wants it; 252 ignores it).
pub fn reloading() {
    let mut states = vec![NotifyState::Reloading];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send("RELOADING=1", &states);
}

/// `STOPPING=1`.
pub fn stopping() {
    send("STOPPING=1", &[NotifyState::Stopping]);
}

/// `WATCHDOG=1`.
pub fn watchdog() {
    send("WATCHDOG=1", &[NotifyState::Watchdog]);
}

/// `STATUS=…` alone.
pub fn status(status: &str) {
    send("STATUS", &[NotifyState::Status(status)]);
}

/// The interval at which to ping the watchdog: half of `WATCHDOG_USEC` (as `sd_watchdog_enabled(3)`
/// advises), or `None` when systemd set no watchdog for this process.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0u64;
    sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec / 2))
}
