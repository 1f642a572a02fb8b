//! What a claim asked for (its allocation and the configuration of each request), so that a
//! prepare of a claim that is already prepared can be compared with what was prepared: a
//! claim's allocation does not change under it, so a retry that asks for other devices or
//! another configuration is a `Conflict` naming both, never "already prepared" with the old
//! devices. What each group asked of its strategy is the strategy's
//! (`crate::strategy::asked`); this compares whole claims.

use std::collections::BTreeMap;
use std::fmt;

use super::plan::group_requests;
use crate::claim::Claim;
use crate::config::ClaimSpec;
use crate::strategy::asked::{self, AskedSharing};

/// A claim's allocation and configuration, as comparable between a prepared record and a
/// request: per request, its devices (in allocation order) and the sharing of the group(s) it
/// is in; and the claim's attach limit (`replicas`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Asked {
    requests: BTreeMap<String, (Vec<String>, Vec<AskedSharing>)>,
    replicas: Option<u32>,
}

impl fmt::Display for Asked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let requests: Vec<String> = self
            .requests
            .iter()
            .map(|(name, (devices, sharing))| {
                let sharing: Vec<String> = sharing.iter().map(ToString::to_string).collect();
                format!(
                    "request {name}: {} [{}]",
                    devices.join(", "),
                    sharing.join(" + ")
                )
            })
            .collect();
        f.write_str(&requests.join("; "))?;
        if let Some(r) = self.replicas {
            write!(f, "; replicas {r}")?;
        }
        Ok(())
    }
}

fn push_sharing(
    requests: &mut BTreeMap<String, (Vec<String>, Vec<AskedSharing>)>,
    names: &[String],
    sharing: &AskedSharing,
) {
    for r in names {
        if let Some((_, list)) = requests.get_mut(r) {
            if !list.contains(sharing) {
                list.push(sharing.clone());
            }
        }
    }
}

fn sorted(mut a: Asked) -> Asked {
    for (_, list) in a.requests.values_mut() {
        list.sort_by_key(ToString::to_string);
    }
    a
}

impl Asked {
    /// What the prepared claim `info` was prepared with.
    pub(super) fn of_record(info: &Claim) -> Asked {
        let mut requests: BTreeMap<String, (Vec<String>, Vec<AskedSharing>)> = info
            .requests
            .iter()
            .map(|r| (r.request.clone(), (r.devices.clone(), Vec::new())))
            .collect();
        for g in &info.groups {
            push_sharing(&mut requests, &g.requests, &asked::of_group(g));
        }
        sorted(Asked {
            requests,
            replicas: info.attach_limit,
        })
    }

    /// What `spec` asks of the claim prepared as `info`. Per-device MPS limits are resolved
    /// against the prepared group of the same requests (the devices themselves are compared
    /// apart), so that equal asks compare equal.
    pub(super) fn of_spec(spec: &ClaimSpec, info: &Claim) -> Asked {
        let mut requests: BTreeMap<String, (Vec<String>, Vec<AskedSharing>)> = BTreeMap::new();
        for r in &spec.results {
            requests
                .entry(r.request.clone())
                .or_default()
                .0
                .push(r.device.clone());
        }
        let mut replicas: Option<u32> = None;
        for group in &spec.groups {
            if let Some(r) = group.sharing.replicas() {
                replicas = Some(replicas.map_or(r, |l| l.min(r)));
            }
            let names = group_requests(spec, group);
            let mut want = names.clone();
            want.sort();
            let prepared = info.groups.iter().find(|g| {
                let mut have = g.requests.clone();
                have.sort();
                have == want
            });
            let sharing = asked::of_config(&group.sharing, prepared);
            push_sharing(&mut requests, &names, &sharing);
        }
        sorted(Asked { requests, replicas })
    }
}

/// Refuses a prepare of the prepared (or degraded) claim `existing` that asks for another
/// allocation or configuration than it was prepared with.
///
/// # Errors
/// `Conflict` naming what is prepared and what this prepare asks; nothing is changed.
pub(super) fn refuse_changed(
    spec: &ClaimSpec,
    existing: &Claim,
) -> Result<(), crate::error::ServiceError> {
    let prepared = Asked::of_record(existing);
    let asked = Asked::of_spec(spec, existing);
    if prepared == asked {
        return Ok(());
    }
    tracing::warn!(claim = %spec.uid, %prepared, %asked, "refusing a prepare that changes a prepared claim's allocation");
    Err(crate::error::ServiceError::new(
        gpushare_proto::ErrorCode::Conflict,
        format!(
            "claim {} is prepared with {prepared}; this prepare asks {asked}: a prepared claim's allocation does not change under it (unprepare it first); nothing was changed",
            existing.uid
        ),
    ))
}
