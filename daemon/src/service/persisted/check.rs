//! One claim record read back from disk, checked as a request would be before any path is
//! built from it, step by step: its key and UID, its requests and their CDI device IDs, each
//! device group (its devices, MIG slices and MPS control daemon), its attachments.

use std::path::Path;

use crate::claim::{Claim, Group, MigSlice, MpsDaemon, Phase, Request};
use crate::config;

/// Why a claim record read back from disk is refused: one line naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(in crate::service) enum Refused {
    /// Filed under another key than the UID it names.
    #[error("it is filed under {key:?} but names claim {uid:?}")]
    FiledElsewhere {
        /// Its file's name or checkpoint key.
        key: String,
        /// The UID it names.
        uid: String,
    },
    /// Not a valid `metadata.uid`.
    #[error("{0}")]
    Uid(String),
    /// A request name Kubernetes does not allow.
    #[error("request name {0:?} is not a valid one")]
    RequestName(String),
    /// A request listed twice.
    #[error("request {0:?} is listed twice")]
    RequestTwice(String),
    /// A CDI device ID that is neither the claim's own nor the driver's of its devices.
    #[error("request {request}: CDI device ID {id:?} is not the claim's own ({own})")]
    ForeignId {
        /// The request.
        request: String,
        /// The ID.
        id: String,
        /// The claim's own ID for the request.
        own: String,
    },
    /// A device group names a request the claim has not.
    #[error("a device group names request {0:?}, which the claim has not")]
    GroupRequest(String),
    /// A device names a request the claim has not.
    #[error("device {device} names request {request:?}, which the claim has not")]
    DeviceRequest {
        /// The device.
        device: String,
        /// The request it names.
        request: String,
    },
    /// A MIG slice marked as being destroyed on a claim that is not being released.
    #[error("MIG device {device} is marked as being destroyed, which only a release does, but the claim is {phase:?}")]
    DestroyingOutsideRelease {
        /// The MIG device.
        device: String,
        /// The claim's phase.
        phase: Phase,
    },
    /// An MPS control daemon's directories are not the ones this daemon makes for the claim.
    #[error("MPS directories {:?}, {:?}, {:?} are not this claim's ({claim_dir}/mps-<hash>/pipe, log, shm)", dirs[0], dirs[1], dirs[2])]
    MpsDirs {
        /// Its pipe, log and shm directories.
        dirs: [String; 3],
        /// The claim's directory.
        claim_dir: String,
    },
    /// An MPS control daemon's visible device that is none of its group's.
    #[error("MPS control daemon's visible device {0:?} is none of its group's devices")]
    VisibleDevice(String),
    /// An MPS control daemon's pid that is no process id.
    #[error("MPS control daemon pid {0} is not a process id")]
    DaemonPid(i32),
    /// An active thread percentage outside 1 to 100.
    #[error("active thread percentage {0} is outside 1 to 100")]
    Percentage(u32),
    /// An attachment of another claim.
    #[error("attachment of container {container:?} names claim {claim:?}")]
    AttachmentClaim {
        /// The container.
        container: String,
        /// The claim it names.
        claim: String,
    },
    /// An attachment with a pid that is no process id.
    #[error("attachment of container {container:?} has pid {pid}")]
    AttachmentPid {
        /// The container.
        container: String,
        /// Its pid.
        pid: i32,
    },
    /// A device name or UUID of other characters than a record's.
    #[error("{what} {name:?} is not a valid one")]
    Name {
        /// What it names.
        what: &'static str,
        /// The name.
        name: String,
    },
}

/// Longest device, request or UUID string taken from a record.
const MAX_NAME_BYTES: usize = 256;

/// Whether `id` is the driver's CDI device (from the toolkit's spec) of one of the claim's own
/// GPUs or MIG devices: a valid qualified name of another kind than the claim's, whose device
/// name is the UUID of a device the claim's groups hold. Those IDs reach containers too, so
/// an ID naming any other device (`nvidia.com/gpu=all`) is refused.
fn is_driver_device_of(info: &Claim, id: &str) -> bool {
    let Ok(q) = gpushare_cdi::QualifiedName::parse(id) else {
        return false;
    };
    if q.kind() == gpushare_proto::CDI_KIND {
        return false;
    }
    info.groups.iter().any(|g| {
        g.devices.iter().any(|d| d.uuid == q.name)
            || g.slices().iter().any(|m| {
                m.uuid == q.name || (!m.original_uuid.is_empty() && m.original_uuid == q.name)
            })
    })
}

/// Checks a claim record read back from disk, as it is keyed there (`key`: its checkpoint
/// entry's key or its host record's directory name), against what a request would be allowed
/// to make: the UID as `metadata.uid` is validated; request names as Kubernetes allows them;
/// device names and UUIDs of safe characters; each MPS control daemon's directories exactly
/// `<run-dir>/claims/<uid>/mps-<5 hex digits>/{pipe,log,shm}` and its visible devices among
/// the group's; attachments of this claim with positive pids; CDI device IDs exactly the
/// claim's own; a MIG slice marked as being destroyed only on a claim being released
/// (`Unpreparing`). The CDI spec path is derived from the UID, never taken from the record:
/// [`normalize`] sets it.
///
/// # Errors
/// What is wrong, in one line naming the field.
pub(in crate::service) fn check_record(
    info: &Claim,
    key: &str,
    run_dir: &Path,
) -> Result<(), Refused> {
    if info.uid != key {
        return Err(Refused::FiledElsewhere {
            key: key.to_string(),
            uid: info.uid.clone(),
        });
    }
    config::validate_claim_uid(&info.uid).map_err(|e| Refused::Uid(e.message))?;
    let names = check_requests(info)?;
    let claim_dir = run_dir.join("claims").join(&info.uid);
    for g in &info.groups {
        check_group(info, g, &names, &claim_dir)?;
    }
    check_attachments(info)
}

/// The requests: valid names, each once, CDI device IDs the claim's own (or the driver's of
/// its devices), device names of safe characters. Returns the request names.
fn check_requests(info: &Claim) -> Result<Vec<&str>, Refused> {
    let single = info.requests.len() == 1;
    let mut names: Vec<&str> = Vec::with_capacity(info.requests.len());
    for r in &info.requests {
        if !config::is_request_name(&r.request) {
            return Err(Refused::RequestName(r.request.clone()));
        }
        if names.contains(&r.request.as_str()) {
            return Err(Refused::RequestTwice(r.request.clone()));
        }
        names.push(&r.request);
        check_request_ids(info, r, single)?;
        for d in r
            .devices
            .iter()
            .chain(r.per_device.iter().map(|d| &d.device))
        {
            safe_name("device name", d)?;
        }
    }
    Ok(names)
}

/// A request's CDI device IDs: the claim's own device, or the driver's device of one of the
/// claim's own GPUs or MIG devices.
fn check_request_ids(info: &Claim, r: &Request, single: bool) -> Result<(), Refused> {
    let own = crate::cdi::qualified_name(&crate::cdi::device_name(&info.uid, &r.request, single));
    let ids = r
        .cdi_device_ids
        .iter()
        .chain(r.per_device.iter().flat_map(|d| d.cdi_device_ids.iter()));
    if let Some(id) = ids
        .into_iter()
        .find(|id| **id != own && !is_driver_device_of(info, id))
    {
        return Err(Refused::ForeignId {
            request: r.request.clone(),
            id: id.clone(),
            own,
        });
    }
    Ok(())
}

/// One device group: requests and devices the claim's, its MIG slices and its MPS control
/// daemon as [`check_slice`] and [`check_mps`] say.
fn check_group(info: &Claim, g: &Group, names: &[&str], claim_dir: &Path) -> Result<(), Refused> {
    if let Some(r) = g.requests.iter().find(|r| !names.contains(&r.as_str())) {
        return Err(Refused::GroupRequest(r.clone()));
    }
    for d in &g.devices {
        safe_name("device name", &d.device)?;
        safe_name("GPU UUID", &d.uuid)?;
        if !names.contains(&d.request.as_str()) {
            return Err(Refused::DeviceRequest {
                device: d.device.clone(),
                request: d.request.clone(),
            });
        }
    }
    for m in g.slices() {
        check_slice(m, info.phase)?;
    }
    match g.mps() {
        Some(m) => check_mps(g, m, claim_dir),
        None => Ok(()),
    }
}

/// A MIG slice: names of safe characters, marked as being destroyed only on a claim being
/// released.
fn check_slice(m: &MigSlice, phase: Phase) -> Result<(), Refused> {
    safe_name("MIG device name", &m.device)?;
    safe_name("GPU UUID", &m.gpu_uuid)?;
    if !m.uuid.is_empty() {
        safe_name("MIG UUID", &m.uuid)?;
    }
    if !m.original_uuid.is_empty() {
        safe_name("first MIG UUID", &m.original_uuid)?;
    }
    // Only a release marks a slice so, with the claim `Unpreparing` on disk first; the mark
    // makes the record match a GPU instance without its compute instance, which another's
    // may be (a bare instance an administrator made at the reused GI ID): on a record that
    // is not a release's, it could have that one destroyed.
    if m.destroying && phase != Phase::Unpreparing {
        return Err(Refused::DestroyingOutsideRelease {
            device: m.device.clone(),
            phase,
        });
    }
    Ok(())
}

/// A group's MPS control daemon: its directories this claim's, its visible devices among the
/// group's, a process id, an active thread percentage from 1 to 100.
fn check_mps(g: &Group, m: &MpsDaemon, claim_dir: &Path) -> Result<(), Refused> {
    check_mps_dirs(claim_dir, m)?;
    let known = |v: &String| {
        g.devices.iter().any(|d| &d.uuid == v) || g.slices().iter().any(|x| &x.uuid == v)
    };
    if let Some(v) = m.visible_devices.iter().find(|v| !known(v)) {
        return Err(Refused::VisibleDevice(v.clone()));
    }
    if m.control_daemon_pid < 0 {
        return Err(Refused::DaemonPid(m.control_daemon_pid));
    }
    if let Some(p) = m
        .requested
        .active_thread_percentage
        .filter(|p| !(1..=100).contains(p))
    {
        return Err(Refused::Percentage(p));
    }
    Ok(())
}

/// Attachments: of this claim, with positive pids.
fn check_attachments(info: &Claim) -> Result<(), Refused> {
    for a in &info.attached {
        if a.claim_uid != info.uid {
            return Err(Refused::AttachmentClaim {
                container: a.container_id.clone(),
                claim: a.claim_uid.clone(),
            });
        }
        if let Some(pid) = a.pid.filter(|p| *p <= 0) {
            return Err(Refused::AttachmentPid {
                container: a.container_id.clone(),
                pid,
            });
        }
    }
    Ok(())
}

/// Sets what a record holds that is derived from its UID and this daemon's configuration,
/// rather than trusting it: the CDI spec path (`<cdi-dir>/gpushare.io-claim_<uid>.json`; a
/// changed CDI directory moves it). Returns whether anything changed.
pub(in crate::service) fn normalize(info: &mut Claim, cdi_dir: &Path) -> bool {
    let spec = crate::cdi::spec_path(cdi_dir, &info.uid)
        .display()
        .to_string();
    if info.cdi_spec == spec {
        return false;
    }
    if info.cdi_spec.is_empty() {
        // A record of the store, which derives it.
        info.cdi_spec = spec;
        return false;
    }
    tracing::warn!(claim = %info.uid, recorded = %info.cdi_spec, now = %spec, "the recorded CDI spec path is not this daemon's; using its own");
    info.cdi_spec = spec;
    true
}

/// A device name or UUID from a record: 1 to 256 ASCII letters, digits, `-`, `_`, `.`, `:`.
fn safe_name(what: &'static str, s: &str) -> Result<(), Refused> {
    let ok = !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(Refused::Name {
            what,
            name: s.to_string(),
        })
    }
}

/// The MPS directories a record names must be exactly the ones this daemon makes for the
/// claim: `<claim-dir>/mps-<5 hex digits>/{pipe,log,shm}`.
fn check_mps_dirs(claim_dir: &Path, m: &MpsDaemon) -> Result<(), Refused> {
    let pipe = Path::new(&m.pipe_dir);
    let root = pipe.parent().unwrap_or(pipe);
    let group_ok = root.parent() == Some(claim_dir)
        && root
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("mps-"))
            .is_some_and(|h| h.len() == 5 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    let exact = |p: &str, leaf: &str| Path::new(p) == root.join(leaf);
    if !group_ok
        || !exact(&m.pipe_dir, "pipe")
        || !exact(&m.log_dir, "log")
        || !exact(&m.shm_dir, "shm")
    {
        return Err(Refused::MpsDirs {
            dirs: [m.pipe_dir.clone(), m.log_dir.clone(), m.shm_dir.clone()],
            claim_dir: claim_dir.display().to_string(),
        });
    }
    Ok(())
}
