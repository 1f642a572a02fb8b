//! One claim record read back from disk, checked as a request would be before any path is
//! built from it, step by step: its key and UID, its requests and their CDI device IDs, each
//! device group (its devices, MIG slices and MPS control daemon), its attachments.

use std::fs;
use std::path::Path;

use gpushare_proto::{MigInstanceInfo, MpsInfo, RequestDevices};

use crate::claim::{Claim, Group, Phase};
use crate::config;

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
) -> Result<(), String> {
    if info.uid != key {
        return Err(format!(
            "it is filed under {key:?} but names claim {:?}",
            info.uid
        ));
    }
    config::validate_claim_uid(&info.uid).map_err(|e| e.message)?;
    let names = check_requests(info)?;
    let claim_dir = run_dir.join("claims").join(&info.uid);
    for g in &info.groups {
        check_group(info, g, &names, &claim_dir)?;
    }
    check_attachments(info)
}

/// The requests: valid names, each once, CDI device IDs the claim's own (or the driver's of
/// its devices), device names of safe characters. Returns the request names.
fn check_requests(info: &Claim) -> Result<Vec<&str>, String> {
    let single = info.requests.len() == 1;
    let mut names: Vec<&str> = Vec::with_capacity(info.requests.len());
    for r in &info.requests {
        if !config::is_request_name(&r.request) {
            return Err(format!("request name {:?} is not a valid one", r.request));
        }
        if names.contains(&r.request.as_str()) {
            return Err(format!("request {:?} is listed twice", r.request));
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
fn check_request_ids(info: &Claim, r: &RequestDevices, single: bool) -> Result<(), String> {
    let own = crate::cdi::qualified_name(&crate::cdi::device_name(&info.uid, &r.request, single));
    let ids = r
        .cdi_device_ids
        .iter()
        .chain(r.per_device.iter().flat_map(|d| d.cdi_device_ids.iter()));
    if let Some(id) = ids
        .into_iter()
        .find(|id| **id != own && !is_driver_device_of(info, id))
    {
        return Err(format!(
            "request {}: CDI device ID {id:?} is not the claim's own ({own})",
            r.request
        ));
    }
    Ok(())
}

/// One device group: requests and devices the claim's, its MIG slices and its MPS control
/// daemon as [`check_slice`] and [`check_mps`] say.
fn check_group(info: &Claim, g: &Group, names: &[&str], claim_dir: &Path) -> Result<(), String> {
    if let Some(r) = g.requests.iter().find(|r| !names.contains(&r.as_str())) {
        return Err(format!(
            "a device group names request {r:?}, which the claim has not"
        ));
    }
    for d in &g.devices {
        safe_name("device name", &d.device)?;
        safe_name("GPU UUID", &d.uuid)?;
        if !names.contains(&d.request.as_str()) {
            return Err(format!(
                "device {} names request {:?}, which the claim has not",
                d.device, d.request
            ));
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
fn check_slice(m: &MigInstanceInfo, phase: Phase) -> Result<(), String> {
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
        return Err(format!(
            "MIG device {} is marked as being destroyed, which only a release does, but the claim is {phase:?}",
            m.device
        ));
    }
    Ok(())
}

/// A group's MPS control daemon: its directories this claim's, its visible devices among the
/// group's, a process id, an active thread percentage from 1 to 100.
fn check_mps(g: &Group, m: &MpsInfo, claim_dir: &Path) -> Result<(), String> {
    check_mps_dirs(claim_dir, m)?;
    let known = |v: &String| {
        g.devices.iter().any(|d| &d.uuid == v) || g.slices().iter().any(|x| &x.uuid == v)
    };
    if let Some(v) = m.visible_devices.iter().find(|v| !known(v)) {
        return Err(format!(
            "MPS control daemon's visible device {v:?} is none of its group's devices"
        ));
    }
    if m.control_daemon_pid < 0 {
        return Err(format!(
            "MPS control daemon pid {} is not a process id",
            m.control_daemon_pid
        ));
    }
    if let Some(p) = m
        .requested
        .active_thread_percentage
        .filter(|p| !(1..=100).contains(p))
    {
        return Err(format!("active thread percentage {p} is outside 1 to 100"));
    }
    Ok(())
}

/// Attachments: of this claim, with positive pids.
fn check_attachments(info: &Claim) -> Result<(), String> {
    for a in &info.attached {
        if a.claim_uid != info.uid {
            return Err(format!(
                "attachment of container {:?} names claim {:?}",
                a.container_id, a.claim_uid
            ));
        }
        if let Some(pid) = a.pid.filter(|p| *p <= 0) {
            return Err(format!(
                "attachment of container {:?} has pid {pid}",
                a.container_id
            ));
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
fn safe_name(what: &str, s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(format!("{what} {s:?} is not a valid one"))
    }
}

/// The MPS directories a record names must be exactly the ones this daemon makes for the
/// claim: `<claim-dir>/mps-<5 hex digits>/{pipe,log,shm}`.
fn check_mps_dirs(claim_dir: &Path, m: &MpsInfo) -> Result<(), String> {
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
        return Err(format!(
            "MPS directories {:?}, {:?}, {:?} are not this claim's ({}/mps-<hash>/pipe, log, shm)",
            m.pipe_dir,
            m.log_dir,
            m.shm_dir,
            claim_dir.display()
        ));
    }
    Ok(())
}

/// Whether `pipe` (read from another process's environment, so input) is exactly the pipe
/// directory of an MPS group this daemon would make: `<claims_dir>/<uid>/mps-<5 hex>/pipe`
/// with a valid claim UID, no `.` or `..` anywhere below `claims_dir`, and neither the
/// claim's nor the group's directory a symbolic link. Only such a path may lead a stop of a
/// stray MPS process and the removal of its group.
pub(in crate::service) fn is_our_mps_pipe(claims_dir: &Path, pipe: &Path) -> bool {
    use std::path::Component;
    let Ok(rest) = pipe.strip_prefix(claims_dir) else {
        return false;
    };
    let parts: Vec<&std::ffi::OsStr> = rest
        .components()
        .map_while(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let [uid, group, leaf] = parts.as_slice() else {
        return false;
    };
    if rest.components().count() != 3 || *leaf != "pipe" {
        return false;
    }
    let group_ok = group
        .to_str()
        .and_then(|n| n.strip_prefix("mps-"))
        .is_some_and(|h| h.len() == 5 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    let uid_ok = uid
        .to_str()
        .is_some_and(|u| config::validate_claim_uid(u).is_ok());
    let not_a_link = |p: &Path| !fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    group_ok
        && uid_ok
        && not_a_link(&claims_dir.join(uid))
        && not_a_link(&claims_dir.join(uid).join(group))
        && not_a_link(pipe)
}
