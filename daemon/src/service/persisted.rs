//! Claim records read back from disk are input: the checkpoint's entries and the host records
//! (`<run-dir>/claims/<uid>/claim.json`) are checked as a request's would be before any path
//! is built from them, and a record that fails is moved to the state directory's quarantine
//! alone, so that the other claims go on and nothing outside the run, state and CDI
//! directories is ever touched because a file said so.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::claim::{Claim, Phase};
use crate::store::{HostRecord, RECORD_FORMAT};

use super::now_secs;
use crate::config;
use crate::fsutil;

/// File name of the copy of a claim's record kept in its run directory
/// (`<run-dir>/claims/<uid>/claim.json`): what the claims are rebuilt from when the checkpoint
/// is missing or corrupt, or lacks them.
pub(super) const HOST_RECORD: &str = "claim.json";

/// Largest host record read, in bytes. A record is a few KiB (a claim with many containers
/// attached some tens); anything larger is not one this daemon wrote.
pub(super) const MAX_HOST_RECORD_BYTES: u64 = 4 << 20;

/// Directory under the state directory where refused records are kept as evidence.
pub(super) const QUARANTINE_DIR: &str = "quarantine";

/// Most files kept in the quarantine directory (the oldest go first), so that a node whose
/// records keep being refused cannot fill its disk with evidence.
const MAX_QUARANTINED: usize = 256;

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
pub(super) fn check_record(info: &Claim, key: &str, run_dir: &Path) -> Result<(), String> {
    if info.uid != key {
        return Err(format!(
            "it is filed under {key:?} but names claim {:?}",
            info.uid
        ));
    }
    config::validate_claim_uid(&info.uid).map_err(|e| e.message)?;
    let uid = &info.uid;
    let claim_dir = run_dir.join("claims").join(uid);
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
        let own = crate::cdi::qualified_name(&crate::cdi::device_name(uid, &r.request, single));
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
        for d in r
            .devices
            .iter()
            .chain(r.per_device.iter().map(|d| &d.device))
        {
            safe_name("device name", d)?;
        }
    }
    for g in &info.groups {
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
            safe_name("MIG device name", &m.device)?;
            safe_name("GPU UUID", &m.gpu_uuid)?;
            if !m.uuid.is_empty() {
                safe_name("MIG UUID", &m.uuid)?;
            }
            if !m.original_uuid.is_empty() {
                safe_name("first MIG UUID", &m.original_uuid)?;
            }
            // Only a release marks a slice so, with the claim `Unpreparing` on disk first;
            // the mark makes the record match a GPU instance without its compute instance,
            // which another's may be (a bare instance an administrator made at the reused GI
            // ID): on a record that is not a release's, it could have that one destroyed.
            if m.destroying && info.phase != Phase::Unpreparing {
                return Err(format!(
                    "MIG device {} is marked as being destroyed, which only a release does, but the claim is {:?}",
                    m.device, info.phase
                ));
            }
        }
        if let Some(m) = g.mps() {
            check_mps_dirs(&claim_dir, m)?;
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
        }
    }
    for a in &info.attached {
        if a.claim_uid != *uid {
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
pub(super) fn normalize(info: &mut Claim, cdi_dir: &Path) -> bool {
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
fn check_mps_dirs(claim_dir: &Path, m: &gpushare_proto::MpsInfo) -> Result<(), String> {
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

/// The records to refuse because a MIG slice they name is another record's: two records
/// whose slices on one GPU overlap in placement (or name one MIG UUID, as the slice's now or
/// the first one a recreated slice keeps) cannot both be true, as
/// admission never grants a placement twice. `claims` pairs each record with whether it was
/// rebuilt from a host record alone (the store did not have it). The one kept is the prepared
/// (or degraded) one over one a crash left half-done, then the one the store has, then the
/// older (lower generation), then the lower UID;
/// each refused one comes with why, naming the claim it collides with. Pure: nothing is
/// released because of a refused record (its release would destroy the other's slice).
pub(super) fn mig_collisions<'a>(
    claims: impl IntoIterator<Item = (&'a Claim, bool)>,
) -> Vec<(String, String)> {
    let mut order: Vec<(&Claim, bool)> = claims.into_iter().collect();
    order.sort_by_key(|(c, rebuilt)| {
        let settled = matches!(c.phase, Phase::Prepared | Phase::Degraded);
        (!settled, *rebuilt, c.generation, c.uid.clone())
    });
    let mut held: Vec<(&str, &gpushare_proto::MigInstanceInfo)> = Vec::new();
    let mut refused = Vec::new();
    for (c, _) in order {
        let mine: Vec<&gpushare_proto::MigInstanceInfo> =
            c.groups.iter().flat_map(|g| g.slices()).collect();
        let hit = mine.iter().find_map(|m| {
            held.iter()
                .find(|(_, h)| {
                    let overlap = h.gpu_uuid == m.gpu_uuid
                        && m.placement_start < h.placement_start + h.memory_slices
                        && h.placement_start < m.placement_start + m.memory_slices;
                    // A name the driver's spec gives the slice (its MIG UUID, or the
                    // first one it keeps after being made again) names one device only.
                    let names = |x: &'a gpushare_proto::MigInstanceInfo| {
                        [x.uuid.as_str(), x.original_uuid.as_str()]
                            .into_iter()
                            .filter(|n| !n.is_empty())
                    };
                    overlap || names(m).any(|n| names(h).any(|o| o == n))
                })
                .map(|(owner, h)| (m, *owner, *h))
        });
        match hit {
            Some((m, owner, h)) => refused.push((
                c.uid.clone(),
                format!(
                    "its MIG device {} (placement {}:{}) is claim {owner:?}'s {} too; only one claim can hold a slice",
                    m.device, m.placement_start, m.memory_slices, h.device
                ),
            )),
            None => held.extend(mine.into_iter().map(|m| (c.uid.as_str(), m))),
        }
    }
    refused
}

/// Whether `pipe` (read from another process's environment, so input) is exactly the pipe
/// directory of an MPS group this daemon would make: `<claims_dir>/<uid>/mps-<5 hex>/pipe`
/// with a valid claim UID, no `.` or `..` anywhere below `claims_dir`, and neither the
/// claim's nor the group's directory a symbolic link. Only such a path may lead a stop of a
/// stray MPS process and the removal of its group.
pub(super) fn is_our_mps_pipe(claims_dir: &Path, pipe: &Path) -> bool {
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

/// Where refused records are kept, and how many went there this start.
#[derive(Debug)]
pub(super) struct Quarantine {
    dir: PathBuf,
    /// One line per record refused through this quarantine: what `health` shows.
    refused: std::sync::Mutex<Vec<String>>,
    /// The keys (claim UIDs, as filed) of the records refused through it.
    refused_claims: std::sync::Mutex<BTreeSet<String>>,
}

/// Distinguishes quarantine files written within one second.
static QUARANTINED: AtomicU64 = AtomicU64::new(0);

impl Quarantine {
    /// Where the evidence goes.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The quarantine beside the checkpoint (`<state-dir>/quarantine`).
    pub(super) fn beside(checkpoint: &Path) -> Quarantine {
        Quarantine {
            dir: checkpoint
                .parent()
                .unwrap_or(Path::new("."))
                .join(QUARANTINE_DIR),
            refused: std::sync::Mutex::new(Vec::new()),
            refused_claims: std::sync::Mutex::new(BTreeSet::new()),
        }
    }

    /// The claims (as their records were filed) whose records were refused through this
    /// quarantine so far. One of them may still be a claim, rebuilt from a good host record.
    pub(super) fn refused_claims(&self) -> BTreeSet<String> {
        self.refused_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What was refused through this quarantine so far, one line per record: the claim it
    /// was filed under, where it was read, why, and where it is kept.
    pub(super) fn refused(&self) -> Vec<String> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Logs why a record was refused and keeps it as
    /// `<state-dir>/quarantine/<source>-<unix seconds>-<pid>-<n>.json`: a JSON object with
    /// where it was read (`from`), under which key or directory (`filed_under`), why it was
    /// refused (`reason`) and the record itself (`record`: as read, or its bytes as text when
    /// they are not JSON; absent when nothing could be read). Never fails: evidence that
    /// cannot be written is only logged.
    pub(super) fn keep(
        &self,
        source: &str,
        origin: &Path,
        filed_under: &str,
        bytes: Option<&[u8]>,
        why: &str,
    ) {
        let record = bytes.map(|b| {
            serde_json::from_slice::<serde_json::Value>(b)
                .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(b).into()))
        });
        let evidence = serde_json::json!({
            "from": origin.display().to_string(),
            "filed_under": filed_under,
            "reason": why,
            "record": record,
        });
        debug_assert!(
            super::quarantine_name::SOURCES.contains(&source),
            "{source}"
        );
        let n = QUARANTINED.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!(
            "{source}-{}-{}-{n}.json",
            now_secs(),
            std::process::id()
        ));
        let kept = serde_json::to_vec_pretty(&evidence)
            .map_err(std::io::Error::other)
            .and_then(|text| {
                fsutil::create_dir_if_missing(&self.dir, 0o700)?;
                fsutil::write_atomic(&path, &text, 0o600)
            });
        let line = format!(
            "claim {filed_under:?} (from {}): {why}; {}",
            origin.display(),
            match &kept {
                Ok(()) => format!("kept at {}", path.display()),
                Err(e) => format!("keeping a copy failed: {e}"),
            }
        );
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
        self.refused_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(filed_under.to_string());
        match kept {
            Ok(()) => {
                tracing::error!(record = %origin.display(), filed_under, reason = %why, kept_at = %path.display(), "refused a claim record read back from disk and kept it in quarantine; the claim is not re-adopted from it");
                self.prune();
            }
            Err(e) => {
                tracing::error!(record = %origin.display(), filed_under, reason = %why, error = %e, "refused a claim record read back from disk (keeping a copy failed); the claim is not re-adopted from it");
            }
        }
    }

    /// Removes the oldest quarantine files beyond [`MAX_QUARANTINED`]: only regular files
    /// named as [`Quarantine::keep`] names them count and go, never anything else there.
    fn prune(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .filter(|e| super::quarantine_name::is_ours(&e.file_name().to_string_lossy()))
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if files.len() <= MAX_QUARANTINED {
            return;
        }
        files.sort();
        let excess = files.len() - MAX_QUARANTINED;
        for (_, p) in files.into_iter().take(excess) {
            let _ = fsutil::remove_file_if_exists(&p);
        }
    }
}

/// The attached containers that claim `uid`'s host record keeps (what an attach wrote before
/// its answer), when the record is there and passes [`check_record`] (none otherwise), and
/// the claim it records when it is in this build's format: the start then tells whether it
/// must write the record again without reading it twice (one in an older format is written
/// again).
pub(super) fn host_record_read(
    run_dir: &Path,
    uid: &str,
) -> (Vec<gpushare_proto::Attachment>, Option<Claim>) {
    let path = run_dir.join("claims").join(uid).join(HOST_RECORD);
    let record = fsutil::read_own_file(&path, MAX_HOST_RECORD_BYTES)
        .ok()
        .and_then(|b| serde_json::from_slice::<HostRecord>(&b).ok())
        .map(|r| (r.record.format, r.into_claim()))
        .filter(|(_, info)| check_record(info, uid, run_dir).is_ok());
    let attached = record
        .as_ref()
        .map(|(_, r)| r.attached.clone())
        .unwrap_or_default();
    let current = record.and_then(|(format, r)| (format == RECORD_FORMAT).then_some(r));
    (attached, current)
}

/// Claims rebuilt from the host records in `<run-dir>/claims/`, except those `skip` says are
/// known already; every record read as input ([`fsutil::read_own_file`]: a regular file, not
/// through a link, bounded) and checked ([`check_record`]). Refused records go to
/// `quarantine`.
pub(super) fn host_records(
    run_dir: &Path,
    cdi_dir: &Path,
    quarantine: &Quarantine,
    skip: impl Fn(&str) -> bool,
) -> BTreeMap<String, Claim> {
    let mut out = BTreeMap::new();
    let Ok(entries) = fs::read_dir(run_dir.join("claims")) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if skip(&name) {
            continue;
        }
        // A link or a file where a claim directory should be is nobody's claim (the sweep
        // removes the link itself); nothing is read through it.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path().join(HOST_RECORD);
        let bytes = match fsutil::read_own_file(&path, MAX_HOST_RECORD_BYTES) {
            Ok(b) => b,
            // A claim directory without a record: a prepare a crash interrupted before it
            // was ready (the kubelet retries it), swept as no claim's.
            Err(fsutil::ReadRefusal::Missing) => continue,
            Err(why) => {
                quarantine.keep("host-record", &path, &name, None, &why.to_string());
                continue;
            }
        };
        let checked = serde_json::from_slice::<HostRecord>(&bytes)
            .map(HostRecord::into_claim)
            .map_err(|e| format!("not a claim record: {e}"))
            .and_then(|info| check_record(&info, &name, run_dir).map(|()| info));
        match checked {
            Ok(mut info) => {
                normalize(&mut info, cdi_dir);
                tracing::warn!(claim = %info.uid, state = ?info.phase, "rebuilt the claim from its host record");
                out.insert(info.uid.clone(), info);
            }
            Err(why) => quarantine.keep("host-record", &path, &name, Some(&bytes), &why),
        }
    }
    out
}
