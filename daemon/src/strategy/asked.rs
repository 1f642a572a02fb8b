//! What a prepare of a group asked of its strategy, as comparable between a prepared record
//! ([`of_group`]) and a retried prepare's config ([`of_config`]): a prepared claim's
//! allocation does not change under it, so the service refuses a retry whose ask differs
//! (`service/asked.rs` compares whole claims). Each strategy's ask is its arm here.

use std::fmt;

use gpushare_proto::TimeSliceInterval;

use crate::claim::{Group, Sharing as Held};
use crate::config::{MpsSettings, Sharing};
use crate::strategy::mps::{percentage_display, pinned_limit_display};

/// The sharing applied to one group, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskedSharing {
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
pub struct AskedMps {
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

/// What recorded group `g` was prepared with. A version 1 record has no `requested` (its
/// shm size is then 0): its MPS limits are known only as the daemon showed them.
pub fn of_group(g: &Group) -> AskedSharing {
    match (&g.sharing, g.mps()) {
        (_, Some(m)) => {
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
    }
}

/// What a group's config `sharing` asks. An MPS group's per-device limits are resolved
/// against the keys of the prepared group of the same requests (`prepared`: that group;
/// `None`: no prepared group has them), as its prepare resolved them.
pub fn of_config(sharing: &Sharing, prepared: Option<&Group>) -> AskedSharing {
    let mps = |settings: &MpsSettings| match prepared.map(group_keys) {
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
        Sharing::TimeSlicing { interval, .. } => AskedSharing::TimeSlicing(*interval),
        Sharing::Mps { settings, .. }
        | Sharing::Mig {
            mps: Some(settings),
            ..
        } => mps(settings),
    }
}
