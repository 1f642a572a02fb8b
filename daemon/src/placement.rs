//! Which claims hold which GPU, and the rules for sharing one (pure).
//!
//! A GPU is free, held whole by one claim, time-sliced by claims that all asked the same
//! interval, or run by one claim's MPS control daemon. Anything else is a conflict: MPS wants
//! EXCLUSIVE_PROCESS compute mode, in which only one process — the one MPS server — may hold
//! the GPU, so a second claim's MPS server could never start there; time-slicing wants DEFAULT;
//! and one interval applies to the whole GPU. (Many pods share an MPS GPU by sharing its one
//! claim.)

use std::collections::{BTreeMap, BTreeSet};

use gpushare_proto::{GpuSharing, TimeSliceInterval};

/// What a claim wants of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The whole GPU, unshared.
    Exclusive,
    /// Time-slicing at this interval.
    TimeSlicing(TimeSliceInterval),
    /// An MPS control daemon over it.
    Mps,
    /// MIG instances of it (any number of MIG claims, each on its own slices).
    Mig,
}

/// How a GPU is held now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// One claim holds it whole.
    Exclusive(String),
    /// Claims time-slice it at one interval.
    TimeSliced {
        /// The interval all holders asked.
        interval: TimeSliceInterval,
        /// Holders' claim UIDs.
        claims: BTreeSet<String>,
    },
    /// One claim's MPS control daemon runs over it.
    Mps(String),
    /// Claims hold MIG instances of it.
    Mig(BTreeSet<String>),
}

impl Hold {
    /// UIDs of the claims holding the GPU.
    pub fn claims(&self) -> Vec<String> {
        match self {
            Hold::Exclusive(c) | Hold::Mps(c) => vec![c.clone()],
            Hold::TimeSliced { claims, .. } | Hold::Mig(claims) => claims.iter().cloned().collect(),
        }
    }

    /// The sharing mode as the protocol reports it.
    pub fn sharing(&self) -> GpuSharing {
        match self {
            Hold::Exclusive(_) => GpuSharing::Exclusive,
            Hold::TimeSliced { .. } => GpuSharing::TimeSlicing,
            Hold::Mps(_) => GpuSharing::Mps,
            Hold::Mig(_) => GpuSharing::Mig,
        }
    }

    /// What holds the GPU, for error messages ("held exclusively by claim a", …).
    pub fn describe(&self) -> String {
        let claims = self.claims().join(", ");
        match self {
            Hold::Exclusive(_) => format!("held exclusively by claim {claims}"),
            Hold::TimeSliced { interval, .. } => {
                format!("time-sliced at {} by claim(s) {claims}", interval.as_str())
            }
            Hold::Mps(_) => format!("run by the MPS control daemon of claim {claims}"),
            Hold::Mig(_) => format!("partitioned into MIG instances by claim(s) {claims}"),
        }
    }
}

/// What a claim asks of a GPU, for error messages ("time-slicing at Long", …).
pub fn describe_want(want: Want) -> String {
    match want {
        Want::Exclusive => "it exclusively".into(),
        Want::TimeSlicing(i) => format!("time-slicing at {}", i.as_str()),
        Want::Mps => "MPS".into(),
        Want::Mig => "a MIG instance".into(),
    }
}

/// What releasing a claim left behind on a GPU, so the caller can restore its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// The last time-slicing holder left: restore interval Default.
    pub last_time_sliced: bool,
    /// The last MPS holder left: restore compute mode DEFAULT.
    pub last_mps: bool,
}

/// GPU holds by GPU UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    holds: BTreeMap<String, Hold>,
}

/// A refused reservation: the message names the GPU, what holds it and what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Conflict(pub String);

impl Placement {
    /// The hold on a GPU, if any.
    pub fn hold(&self, uuid: &str) -> Option<&Hold> {
        self.holds.get(uuid)
    }

    /// Every held GPU's UUID with its hold.
    pub fn holds(&self) -> impl Iterator<Item = (&String, &Hold)> {
        self.holds.iter()
    }

    /// Reserves every `(gpu uuid, display name, want)` for `claim`, all or nothing.
    ///
    /// # Errors
    /// [`Conflict`] naming the first GPU that cannot be shared that way; nothing is changed.
    pub fn reserve(
        &mut self,
        claim: &str,
        wants: &[(String, String, Want)],
    ) -> Result<(), Conflict> {
        // Checked first, changed after: only the GPUs asked are looked at, and a refusal
        // changes nothing (no copy of every hold, whose claim sets grow with the node).
        for (i, (uuid, name, want)) in wants.iter().enumerate() {
            // A GPU named twice in one ask is checked as the earlier ask leaves it.
            let earlier = wants[..i]
                .iter()
                .find(|(u, _, _)| u == uuid)
                .map(|(_, _, w)| *w);
            let fits = match (self.holds.get(uuid), earlier, *want) {
                (_, Some(Want::Mig), Want::Mig) => true,
                (_, Some(Want::TimeSlicing(a)), Want::TimeSlicing(b)) => a == b,
                (_, Some(_), _) => false,
                (None, None, _) => true,
                (Some(Hold::Mig(_)), None, Want::Mig) => true,
                (Some(Hold::TimeSliced { interval, .. }), None, Want::TimeSlicing(asked)) => {
                    *interval == asked
                }
                (Some(_), None, _) => false,
            };
            if !fits {
                let hold = match (self.holds.get(uuid), earlier) {
                    (Some(h), _) => h.describe(),
                    (None, Some(w)) => format!("asked {} by the same claim", describe_want(w)),
                    (None, None) => "free".into(),
                };
                return Err(Conflict(format!(
                    "{name} ({uuid}) is {hold}; claim {claim} asks {}",
                    describe_want(*want)
                )));
            }
        }
        for (uuid, _, want) in wants {
            let c = claim.to_string();
            match (self.holds.get_mut(uuid), *want) {
                (Some(Hold::Mig(claims)), _) | (Some(Hold::TimeSliced { claims, .. }), _) => {
                    claims.insert(c);
                }
                (Some(_), _) => {}
                (None, Want::Exclusive) => {
                    self.holds.insert(uuid.clone(), Hold::Exclusive(c));
                }
                (None, Want::TimeSlicing(interval)) => {
                    self.holds.insert(
                        uuid.clone(),
                        Hold::TimeSliced {
                            interval,
                            claims: BTreeSet::from([c]),
                        },
                    );
                }
                (None, Want::Mps) => {
                    self.holds.insert(uuid.clone(), Hold::Mps(c));
                }
                (None, Want::Mig) => {
                    self.holds
                        .insert(uuid.clone(), Hold::Mig(BTreeSet::from([c])));
                }
            }
        }
        Ok(())
    }

    /// Releases `claim`'s hold on `uuid`; says which settings the caller must restore.
    pub fn release(&mut self, claim: &str, uuid: &str) -> Released {
        let mut released = Released {
            last_time_sliced: false,
            last_mps: false,
        };
        let Some(hold) = self.holds.get_mut(uuid) else {
            return released;
        };
        let empty = match hold {
            Hold::Exclusive(c) => c == claim,
            Hold::Mps(c) => {
                released.last_mps = c == claim;
                c == claim
            }
            Hold::TimeSliced { claims, .. } => {
                claims.remove(claim);
                released.last_time_sliced = claims.is_empty();
                claims.is_empty()
            }
            Hold::Mig(claims) => {
                claims.remove(claim);
                claims.is_empty()
            }
        };
        if empty {
            self.holds.remove(uuid);
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TimeSliceInterval::*;

    fn w(uuid: &str, want: Want) -> (String, String, Want) {
        (uuid.to_string(), format!("gpu-{uuid}"), want)
    }

    #[test]
    fn exclusive_excludes_everything() {
        let mut p = Placement::default();
        p.reserve("a", &[w("0", Want::Exclusive)]).unwrap();
        for want in [Want::Exclusive, Want::Mps, Want::TimeSlicing(Default)] {
            let err = p.reserve("b", &[w("0", want)]).unwrap_err();
            assert!(err.0.contains("held exclusively by claim a"), "{err}");
        }
    }

    #[test]
    fn time_slicing_shares_one_interval_only() {
        let mut p = Placement::default();
        p.reserve("a", &[w("1", Want::TimeSlicing(Short))]).unwrap();
        p.reserve("b", &[w("1", Want::TimeSlicing(Short))]).unwrap();
        let err = p
            .reserve("c", &[w("1", Want::TimeSlicing(Long))])
            .unwrap_err();
        assert!(err.0.contains("time-sliced at Short"), "{err}");
        assert!(err.0.contains("asks time-slicing at Long"), "{err}");
        assert!(p.reserve("c", &[w("1", Want::Mps)]).is_err());
        assert_eq!(
            p.release("a", "1"),
            Released {
                last_time_sliced: false,
                last_mps: false
            }
        );
        assert_eq!(
            p.release("b", "1"),
            Released {
                last_time_sliced: true,
                last_mps: false
            }
        );
        assert_eq!(p.hold("1"), None);
    }

    #[test]
    fn one_mps_claim_per_gpu_and_reserve_is_all_or_nothing() {
        let mut p = Placement::default();
        p.reserve("a", &[w("4", Want::Mps)]).unwrap();
        let err = p.reserve("b", &[w("4", Want::Mps)]).unwrap_err();
        assert!(err.0.contains("MPS control daemon of claim a"), "{err}");
        let before = p.clone();
        let err = p
            .reserve(
                "c",
                &[w("5", Want::Mps), w("4", Want::TimeSlicing(Default))],
            )
            .unwrap_err();
        assert!(err.0.contains("gpu-4"), "{err}");
        assert_eq!(p, before, "a refused reservation changes nothing");
        assert!(!p.release("b", "4").last_mps, "b never held it");
        assert!(p.release("a", "4").last_mps);
        assert_eq!(p.hold("4"), None);
    }
}
