//! What a claim asked for (its allocation and the configuration of each request), so that a
//! prepare of a claim that is already prepared can be compared with what was prepared: a
//! claim's allocation does not change under it, so a retry that asks for other devices or
//! another configuration is a `Conflict` naming both, never "already prepared" with the old
//! devices.

use std::collections::BTreeMap;
use std::fmt;

use gpushare_proto::TimeSliceInterval;

use crate::claim::{Claim, Group, Sharing as Held};

use crate::config::{ClaimSpec, MpsSettings, Sharing};
use crate::strategy::mps::{percentage_display, pinned_limit_display};

/// A claim's allocation and configuration, as comparable between a prepared record and a
/// request: per request, its devices (in allocation order) and the sharing of the group(s) it
/// is in; and the claim's attach limit (`replicas`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Asked {
    requests: BTreeMap<String, (Vec<String>, Vec<AskedSharing>)>,
    replicas: Option<u32>,
}

/// The sharing applied to one group, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AskedSharing {
    /// The devices alone (a whole GPU, or a MIG slice without MPS).
    Exclusive,
    /// Time-slicing with this interval.
    TimeSlicing(TimeSliceInterval),
    /// An MPS control daemon with these limits.
    Mps(AskedMps),
    /// A configuration that does not fit the prepared devices at all (say, a per-device key
    /// naming a GPU the group does not have).
    Unfit(String),
}

/// MPS limits as asked. Compared exactly when both sides know what was asked (every record
/// since checkpoint version 2 does); a version 1 record only knows the limits as read back,
/// which are compared as the daemon shows them.
#[derive(Debug, Clone, Eq)]
struct AskedMps {
    /// Active thread percentage as the daemon shows it (`"50.0"`).
    atp_shown: String,
    /// Pinned device memory limit per CUDA ordinal as the daemon shows it (`"8G"`, `""`).
    pinned_shown: Vec<String>,
    /// What was asked exactly: (active thread percentage, pinned MiB per ordinal, multi-user);
    /// `None` for a version 1 record.
    exact: Option<(Option<u32>, Vec<Option<u64>>, bool)>,
}

impl PartialEq for AskedMps {
    fn eq(&self, other: &AskedMps) -> bool {
        match (&self.exact, &other.exact) {
            (Some(a), Some(b)) => a == b,
            _ => self.atp_shown == other.atp_shown && self.pinned_shown == other.pinned_shown,
        }
    }
}

impl AskedMps {
    fn asked(atp: Option<u32>, pinned: Vec<Option<u64>>, multi_user: bool) -> AskedMps {
        AskedMps {
            atp_shown: percentage_display(atp),
            pinned_shown: pinned.iter().map(|m| pinned_limit_display(*m)).collect(),
            exact: Some((atp, pinned, multi_user)),
        }
    }
}

impl fmt::Display for AskedSharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AskedSharing::Exclusive => f.write_str("exclusive"),
            AskedSharing::TimeSlicing(i) => write!(f, "time-slicing {}", i.as_str()),
            AskedSharing::Unfit(why) => write!(f, "a configuration that does not fit ({why})"),
            AskedSharing::Mps(m) => {
                let mut parts = Vec::new();
                match &m.exact {
                    Some((atp, pinned, multi_user)) => {
                        parts.push(match atp {
                            Some(p) => format!("active thread percentage {p}"),
                            None => "default active thread percentage".to_string(),
                        });
                        let limits: Vec<String> = pinned
                            .iter()
                            .enumerate()
                            .filter_map(|(i, m)| m.map(|m| format!("{i}: {m} MiB")))
                            .collect();
                        if !limits.is_empty() {
                            parts
                                .push(format!("pinned device memory limits {}", limits.join(", ")));
                        }
                        if *multi_user {
                            parts.push("multi-user".into());
                        }
                    }
                    None => {
                        parts.push(format!("active thread percentage {}", m.atp_shown));
                        let limits: Vec<String> = m
                            .pinned_shown
                            .iter()
                            .enumerate()
                            .filter(|(_, v)| !v.is_empty())
                            .map(|(i, v)| format!("{i}: {v}"))
                            .collect();
                        if !limits.is_empty() {
                            parts
                                .push(format!("pinned device memory limits {}", limits.join(", ")));
                        }
                    }
                }
                write!(f, "MPS ({})", parts.join(", "))
            }
        }
    }
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

/// The keys a group's per-device MPS limits are resolved against, as the prepare did: the
/// MIG device names of a MIG group (in allocation order), else the GPU UUIDs (sorted).
fn group_keys(g: &Group) -> Vec<String> {
    if !g.is_mig() {
        let mut uuids: Vec<String> = g.devices.iter().map(|d| d.uuid.clone()).collect();
        uuids.sort();
        uuids
    } else {
        g.devices.iter().map(|d| d.device.clone()).collect()
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
            let sharing = match (&g.sharing, g.mps()) {
                (_, Some(m)) => {
                    // Version 1 records have no `requested` (its shm size is then 0).
                    let exact = (m.requested.shm_bytes != 0).then(|| {
                        let mut pinned = m.requested.pinned_limits_mib.clone();
                        pinned.resize(g.devices.len().max(pinned.len()), None);
                        (
                            m.requested.active_thread_percentage,
                            pinned,
                            m.requested.multi_user,
                        )
                    });
                    let pinned_shown = (0..g.devices.len())
                        .map(|i| {
                            m.pinned_device_memory_limits
                                .get(&i.to_string())
                                .cloned()
                                .unwrap_or_default()
                        })
                        .collect();
                    AskedSharing::Mps(AskedMps {
                        atp_shown: m.active_thread_percentage.clone(),
                        pinned_shown,
                        exact,
                    })
                }
                (Held::TimeSlicing { interval }, None) => AskedSharing::TimeSlicing(*interval),
                (Held::Exclusive | Held::Mps(_) | Held::Mig(_), None) => AskedSharing::Exclusive,
            };
            push_sharing(&mut requests, &g.requests, &sharing);
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
        let mut cap = |r: &Option<u32>| {
            if let Some(r) = *r {
                replicas = Some(replicas.map_or(r, |l| l.min(r)));
            }
        };
        for group in &spec.groups {
            let names = group_requests(spec, group);
            let sharing = asked_sharing(&group.sharing, &mut cap, || {
                let mut want = names.clone();
                want.sort();
                info.groups
                    .iter()
                    .find(|g| {
                        let mut have = g.requests.clone();
                        have.sort();
                        have == want
                    })
                    .map(group_keys)
            });
            for r in &names {
                let list = &mut requests.entry(r.clone()).or_default().1;
                if !list.contains(&sharing) {
                    list.push(sharing.clone());
                }
            }
        }
        sorted(Asked { requests, replicas })
    }
}

/// The requests of `group`'s results, in order of first appearance.
fn group_requests(spec: &ClaimSpec, group: &crate::config::DeviceGroup) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for &i in &group.results {
        if let Some(r) = spec.results.get(i) {
            if !names.contains(&r.request) {
                names.push(r.request.clone());
            }
        }
    }
    names
}

/// What a group's config asks: its sharing, its `replicas` given to `cap`. An MPS group's
/// per-device limits are resolved against the keys of the prepared group of the same
/// requests (`keys`; `None`: no prepared group has them).
fn asked_sharing(
    sharing: &Sharing,
    cap: &mut impl FnMut(&Option<u32>),
    keys: impl Fn() -> Option<Vec<String>>,
) -> AskedSharing {
    let mps = |settings: &MpsSettings| match keys() {
        None => AskedSharing::Unfit("no prepared group has these requests".into()),
        Some(keys) => match settings.resolve_pinned_limits(&keys) {
            Ok(pinned) => AskedSharing::Mps(AskedMps::asked(
                settings.active_thread_percentage,
                pinned,
                settings.multi_user,
            )),
            Err(e) => AskedSharing::Unfit(e.message),
        },
    };
    match sharing {
        Sharing::Exclusive | Sharing::Mig { mps: None, .. } => AskedSharing::Exclusive,
        Sharing::TimeSlicing { interval, replicas } => {
            cap(replicas);
            AskedSharing::TimeSlicing(*interval)
        }
        Sharing::Mps { settings, replicas } => {
            cap(replicas);
            mps(settings)
        }
        Sharing::Mig {
            mps: Some(settings),
            ..
        } => mps(settings),
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
