//! A claim as it is kept on disk: one versioned record per claim
//! (`<state-dir>/records/<uid>.json`, see `crate::store`), and one per released claim's
//! tombstone (`<state-dir>/tombstones/<uid>.json`).
//!
//! The record is not the protocol's `ClaimInfo`: it has a format number of its own, and it
//! leaves out what is not the claim's durable state: the CDI spec path (derived from the UID
//! and the CDI directory at load) and the attached containers, which live in the claim's
//! run-directory record (they die with the boot, see `docs/crash-safety.md`). The nested
//! parts (device groups, MPS and MIG records, CDI device IDs per request) are the protocol's
//! types: their fields are the same facts, and a record is checked as input when read
//! (`service::persisted`).

use serde::{Deserialize, Serialize};

use gpushare_proto::{ClaimInfo, ClaimState, GroupInfo, RequestDevices};

use crate::checkpoint::Tombstone;

/// The record format this build writes. Format 2 was the whole-node checkpoint file
/// (`checkpoint.json`); records of format 3 and later are per claim. A record of a newer
/// format is read as far as its fields are known (unknown fields are ignored).
pub const RECORD_FORMAT: u32 = 3;

/// One claim's durable record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// [`RECORD_FORMAT`] of the build that wrote it.
    pub format: u32,
    /// `metadata.uid`; the record's file is named after it.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// Lifecycle phase, as the protocol spells it.
    pub state: ClaimState,
    /// Device groups with their strategies and what each owns on the host.
    pub groups: Vec<GroupInfo>,
    /// CDI device IDs per request.
    pub requests: Vec<RequestDevices>,
    /// Most containers attached at once (`replicas`).
    #[serde(default)]
    pub attach_limit: Option<u32>,
    /// Why the claim is `Degraded`, or what happened last.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Restarts of its MPS control daemons after they died.
    #[serde(default)]
    pub restarts: u32,
    /// `metadata.resourceVersion` of the prepared object, for its tombstone.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// Generation handed out when it was prepared (see tombstones).
    #[serde(default)]
    pub generation: u64,
}

impl ClaimRecord {
    /// The durable part of `info`.
    pub fn of(info: &ClaimInfo) -> ClaimRecord {
        ClaimRecord {
            format: RECORD_FORMAT,
            uid: info.uid.clone(),
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            state: info.state,
            groups: info.groups.clone(),
            requests: info.requests.clone(),
            attach_limit: info.attach_limit,
            last_error: info.last_error.clone(),
            restarts: info.restarts,
            resource_version: info.resource_version.clone(),
            generation: info.generation,
        }
    }

    /// The claim this record describes, without containers, its CDI spec at `cdi_spec`.
    pub fn into_claim(self, cdi_spec: String) -> ClaimInfo {
        ClaimInfo {
            uid: self.uid,
            namespace: self.namespace,
            name: self.name,
            state: self.state,
            groups: self.groups,
            requests: self.requests,
            cdi_spec,
            attach_limit: self.attach_limit,
            attached: Vec::new(),
            last_error: self.last_error,
            restarts: self.restarts,
            resource_version: self.resource_version,
            generation: self.generation,
        }
    }
}

/// A released claim's tombstone as kept on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TombstoneRecord {
    /// [`RECORD_FORMAT`] of the build that wrote it.
    pub format: u32,
    /// The tombstone.
    #[serde(flatten)]
    pub tombstone: Tombstone,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_leaves_out_containers_and_the_spec_path_and_gives_the_rest_back() {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/checkpoint-v2.json")).unwrap();
        let info: ClaimInfo =
            serde_json::from_value(v["claims"]["3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01"].clone())
                .unwrap();
        assert_eq!(
            info.attached.len(),
            1,
            "the fixture's MPS claim has a container"
        );
        let rec = ClaimRecord::of(&info);
        let text = serde_json::to_string(&rec).unwrap();
        assert!(
            !text.contains("attached") && !text.contains("cdi_spec"),
            "{text}"
        );
        assert!(text.starts_with("{\"format\":3,"), "{text}");
        let back: ClaimRecord = serde_json::from_str(&text).unwrap();
        let again = back.into_claim(info.cdi_spec.clone());
        assert_eq!(
            ClaimInfo {
                attached: info.attached.clone(),
                ..again
            },
            info
        );
    }
}
