//! Least privilege: the capabilities `gpushared` keeps, and dropping the rest at start.
//!
//! `gpushared` runs as root, but root's full capability set would let any bug in it (or in the
//! programs it starts) do anything on the node. At start, before any other thread exists, it
//! reduces its effective, permitted and bounding sets to [`kept`] and clears its inheritable
//! and ambient sets. Children it starts (the MPS control daemons, `nvidia-smi`) run as root
//! too, so the kernel gives them what the bounding set allows: the same reduced set.
//!
//! Capabilities are per thread: [`drop_to`] must run while the process has a single thread
//! (before the async runtime starts); threads created afterwards inherit the reduced sets.

use caps::{CapSet, Capability, CapsHashSet};

/// The capabilities `gpushared` keeps, each with the reason (docs/node.md lists the same):
///
/// - `CAP_SYS_ADMIN`: mounting and unmounting each MPS claim's `/dev/shm` tmpfs, and giving
///   each MPS control daemon its own mount namespace (`unshare(CLONE_NEWNS)`) whose `/dev/shm`
///   is that tmpfs; NVML's compute-mode and time-slice settings also check it.
/// - `CAP_KILL`: signalling processes of other uids: liveness probes (`kill(pid, 0)`) of the
///   containers' processes on attach and detach, which run as any uid, and MPS servers, which
///   NVIDIA's control daemon runs under their client's uid.
/// - `CAP_SETUID`, `CAP_SETGID`: inherited by NVIDIA's MPS control daemon, which starts each
///   MPS server as the uid and gid of its first client (`start_server -uid`).
/// - `CAP_CHOWN`: giving the socket file its configured group.
/// - `CAP_MKNOD`, only with `--simulate`: creating the simulated GPU device nodes.
///
/// Not kept, among others: `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` (everything gpushared
/// writes is root's own; the end-to-end suite, containers and NVIDIA's daemon included, passes
/// without them), `CAP_SYS_PTRACE` (only world-readable `/proc` files are read),
/// `CAP_SETPCAP` (dropped last, once the bounding set is reduced) and every network
/// capability.
pub fn kept(simulating: bool) -> Vec<Capability> {
    let mut v = vec![
        Capability::CAP_CHOWN,
        Capability::CAP_KILL,
        Capability::CAP_SETGID,
        Capability::CAP_SETUID,
        Capability::CAP_SYS_ADMIN,
    ];
    if simulating {
        v.push(Capability::CAP_MKNOD);
    }
    v.sort_by_key(|c| c.index());
    v
}

/// The bit mask of `caps` as `/proc/<pid>/status` shows it (`CapEff:` and friends, in hex).
pub fn mask(caps: &[Capability]) -> u64 {
    caps.iter().fold(0, |m, c| m | c.bitmask())
}

/// Why the capability sets could not be reduced.
#[derive(Debug, thiserror::Error)]
#[error("reducing the {set} capability set ({what}): {error}")]
pub struct PrivilegeError {
    /// Which set (`bounding`, `effective`...).
    pub set: &'static str,
    /// The capability or operation.
    pub what: String,
    /// The caps crate's error.
    pub error: caps::errors::CapsError,
}

/// What [`drop_to`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The sets are now `keep` (the bounding set at most `keep`: reduced by us, or already by
    /// the service manager).
    Reduced,
    /// The process did not hold `CAP_SETPCAP` (not root, or already reduced by its service
    /// manager): effective and permitted were reduced to what it held of `keep`, the bounding
    /// set was left as the service manager made it.
    NoSetpcap,
}

/// Reduces the calling thread's capability sets to `keep`: inheritable and ambient cleared,
/// bounding reduced (needs `CAP_SETPCAP`, dropped last), then permitted and effective set to
/// `keep` (intersected with what is held, so a non-root run does not fail).
///
/// # Errors
/// A `prctl`/`capset` call failed.
pub fn drop_to(keep: &[Capability]) -> Result<Outcome, PrivilegeError> {
    let err = |set: &'static str, what: &str| {
        let what = what.to_string();
        move |error| PrivilegeError { set, what, error }
    };
    let keep: CapsHashSet = keep.iter().copied().collect();
    caps::clear(None, CapSet::Inheritable).map_err(err("inheritable", "clear"))?;
    // Ambient capabilities need kernel 4.3; without them there is nothing to clear.
    if caps::runtime::ambient_set_supported().is_ok() {
        caps::clear(None, CapSet::Ambient).map_err(err("ambient", "clear"))?;
    }
    let held = caps::read(None, CapSet::Permitted).map_err(err("permitted", "read"))?;
    let outcome = if held.contains(&Capability::CAP_SETPCAP) {
        caps::raise(None, CapSet::Effective, Capability::CAP_SETPCAP)
            .map_err(err("effective", "CAP_SETPCAP"))?;
        let bounding = caps::read(None, CapSet::Bounding).map_err(err("bounding", "read"))?;
        let mut drop: Vec<Capability> = bounding.difference(&keep).copied().collect();
        // CAP_SETPCAP is what allows dropping the others: it goes last.
        drop.sort_by_key(|c| (*c == Capability::CAP_SETPCAP, c.index()));
        for cap in drop {
            caps::drop(None, CapSet::Bounding, cap).map_err(err("bounding", &cap.to_string()))?;
        }
        Outcome::Reduced
    } else if caps::read(None, CapSet::Bounding)
        .map_err(err("bounding", "read"))?
        .is_subset(&keep)
    {
        // The service manager already reduced the bounding set (systemd's
        // CapabilityBoundingSet=): nothing is left for us to drop there.
        Outcome::Reduced
    } else {
        Outcome::NoSetpcap
    };
    let now: CapsHashSet = held.intersection(&keep).copied().collect();
    // Effective first: it must stay a subset of permitted at every step.
    caps::set(None, CapSet::Effective, &now).map_err(err("effective", "set"))?;
    caps::set(None, CapSet::Permitted, &now).map_err(err("permitted", "set"))?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_sets_and_masks() {
        let base = kept(false);
        assert!(!base.contains(&Capability::CAP_MKNOD));
        assert!(kept(true).contains(&Capability::CAP_MKNOD));
        assert!(!base.contains(&Capability::CAP_SETPCAP));
        assert!(!base.contains(&Capability::CAP_SYS_PTRACE));
        // CAP_CHOWN is bit 0, CAP_SYS_ADMIN bit 21.
        assert_eq!(
            mask(&[Capability::CAP_CHOWN, Capability::CAP_SYS_ADMIN]),
            1 | 1 << 21
        );
    }

    #[test]
    fn drop_in_a_thread_of_its_own() {
        // Capabilities are per thread: a scratch thread keeps the test process unharmed.
        std::thread::spawn(|| {
            let keep = [Capability::CAP_KILL];
            let outcome = drop_to(&keep).unwrap();
            let eff = caps::read(None, CapSet::Effective).unwrap();
            assert!(eff.iter().all(|c| keep.contains(c)), "{eff:?}");
            assert!(caps::read(None, CapSet::Inheritable).unwrap().is_empty());
            if outcome == Outcome::Reduced {
                let bounding = caps::read(None, CapSet::Bounding).unwrap();
                assert_eq!(bounding, keep.iter().copied().collect::<CapsHashSet>());
            }
        })
        .join()
        .unwrap();
    }
}
