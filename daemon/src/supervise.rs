//! Supervision of the per-claim MPS control daemons.
//!
//! One thread holds a pidfd for every MPS control daemon of a prepared claim and sleeps in
//! `poll(2)` on them and on a wake-up socket the service writes to when the set changes. A
//! daemon's exit wakes it at once (no polling of `/proc`); the service then marks the claim
//! `Degraded` (the hook refuses new containers with the reason) and restarts the daemon with
//! exponential backoff (0.5 s doubling up to 30 s), re-applying and reading back its limits.
//! Daemons started before this gpushared (re-adopted ones) are watched the same way: a pidfd
//! does not need the process to be our child. Every effect goes through the service's leaf
//! (`sys::Processes::watch` for the pidfds, `start_time`), so the supervisor runs against the
//! fake host in unit tests.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::service::Service;
use crate::sys::wait_readable;

/// Longest sleep without any event: a safety re-scan, not the detection path.
const RESCAN: Duration = Duration::from_secs(60);

/// Starts the supervisor thread for `service`.
///
/// # Errors
/// The wake-up socket or the thread could not be created.
pub fn spawn(service: Arc<Service>) -> io::Result<std::thread::JoinHandle<()>> {
    let (wake_tx, wake_rx) = UnixStream::pair()?;
    wake_tx.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    service.set_supervisor_wake(wake_tx);
    std::thread::Builder::new()
        .name("mps-supervisor".into())
        .spawn(move || run(&service, wake_rx))
}

fn run(service: &Service, mut wake: UnixStream) {
    let mut watched: BTreeMap<(String, i32), std::os::fd::OwnedFd> = BTreeMap::new();
    let processes = std::sync::Arc::clone(service.processes());
    loop {
        let want = service.supervised();
        watched.retain(|(uid, pid), _| want.iter().any(|d| &d.claim_uid == uid && d.pid == *pid));
        let mut exited = Vec::new();
        for d in &want {
            let key = (d.claim_uid.clone(), d.pid);
            if watched.contains_key(&key) {
                continue;
            }
            match processes.watch(d.pid) {
                // The pidfd now pins this process; if its start time is not the recorded
                // one, the pid was reused and the daemon is gone.
                Ok(fd)
                    if d.start_time == 0 || processes.start_time(d.pid) == Some(d.start_time) =>
                {
                    watched.insert(key, fd);
                }
                Ok(_) => exited.push(key),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => exited.push(key),
                Err(e) => {
                    tracing::error!(pid = d.pid, error = %e, "cannot watch the MPS control daemon");
                }
            }
        }
        for (uid, pid) in exited {
            service.mps_daemon_exited(&uid, pid);
        }
        service.run_due_restarts();

        let keys: Vec<(String, i32)> = watched.keys().cloned().collect();
        let mut fds: Vec<i32> = watched.values().map(AsRawFd::as_raw_fd).collect();
        fds.push(wake.as_raw_fd());
        let timeout = service
            .next_restart()
            .map_or(RESCAN, |due| due.saturating_duration_since(Instant::now()))
            .min(RESCAN);
        let ready = match wait_readable(&fds, Some(timeout)) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "waiting for MPS control daemons");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        for i in ready {
            match keys.get(i) {
                Some((uid, pid)) => {
                    watched.remove(&(uid.clone(), *pid));
                    service.mps_daemon_exited(uid, *pid);
                }
                None => {
                    let mut buf = [0u8; 64];
                    while matches!(wake.read(&mut buf), Ok(n) if n > 0) {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use gpushare_proto::{ClaimState, StrategyInfo};

    use crate::gpu::SimulatedBackend;
    use crate::service::{Service, ServiceConfig};
    use crate::strategy::mps::MpsControl;
    use crate::sys::fake::FakeHost;

    fn mps_pid(service: &Service, uid: &str) -> i32 {
        service
            .get_claim(uid)
            .unwrap()
            .groups
            .iter()
            .find_map(|g| match &g.sharing {
                StrategyInfo::Mps(m) => Some(m.control_daemon_pid),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn a_dead_daemon_is_seen_at_once_and_restarted_with_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let host = FakeHost::default();
        let cfg = ServiceConfig::for_tests(dir.path(), "node-a");
        let backend = Arc::new(
            SimulatedBackend::without_device_nodes("p4d.24xlarge", "node-a", Path::new("/x"))
                .unwrap(),
        );
        let mps = MpsControl::new("/m".into(), host.ops(), Duration::from_millis(200));
        let service = Arc::new(Service::new(cfg, backend, mps).unwrap());
        let claim = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "sup"},
            "spec": {"devices": {"requests": [{"name": "gpus"}]}},
            "status": {"allocation": {"devices": {
                "results": [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}],
                "config": [{"source": "FromClaim", "requests": ["gpus"], "opaque": {"driver": "gpu.nvidia.com",
                    "parameters": {"sharingMode": "mps", "mpsActiveThreadPercentage": 40}}}]}}}
        });
        service.prepare(&claim).unwrap();
        let old = mps_pid(&service, "sup");
        super::spawn(Arc::clone(&service)).unwrap();
        // Killed as a crash would: its (fake) pidfd becomes readable, nothing is polled.
        {
            use crate::sys::Processes;
            host.kill(old);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut saw_degraded = false;
        loop {
            let c = service.get_claim("sup").unwrap();
            saw_degraded |= c.state == ClaimState::Degraded;
            if c.state == ClaimState::Prepared && mps_pid(&service, "sup") != old {
                assert_eq!(c.restarts, 1);
                assert!(
                    c.last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("exited")),
                    "{c:?}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "not restarted: {c:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            saw_degraded,
            "Degraded while the restart waited out its backoff"
        );
        let calls = host.state().calls.clone();
        assert!(
            calls.iter().filter(|c| c.contains(" -d")).count() >= 2,
            "started again: {calls:?}"
        );
    }
}
