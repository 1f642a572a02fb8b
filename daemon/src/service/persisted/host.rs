//! The host records (`<run-dir>/claims/<uid>/claim.json`) read back: one claim's attachments,
//! or every claim the store lacks, each checked as input.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::{check_record, normalize, Quarantine, HOST_RECORD, MAX_HOST_RECORD_BYTES};
use crate::claim::Claim;
use crate::fsutil;
use crate::store::{HostRecord, RECORD_FORMAT};

/// The attached containers that claim `uid`'s host record keeps (what an attach wrote before
/// its answer), when the record is there and passes [`check_record`] (none otherwise), and
/// the claim it records when it is in this build's format: the start then tells whether it
/// must write the record again without reading it twice (one in an older format is written
/// again).
pub(in crate::service) fn host_record_read(
    run_dir: &Path,
    uid: &str,
) -> (Vec<crate::claim::Attachment>, Option<Claim>) {
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
pub(in crate::service) fn host_records(
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
            .and_then(|info| {
                check_record(&info, &name, run_dir)
                    .map(|()| info)
                    .map_err(|e| e.to_string())
            });
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
