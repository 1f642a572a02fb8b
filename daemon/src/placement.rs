//! Which claims hold which GPU (pure): the registry's record of the holds that admission
//! ([`crate::admission`], over each GPU's mode word) granted, for listings, error messages
//! and the start-up reconcile. The sharing rules themselves live only in
//! `gpushare_core::mode` (a GPU is free, held whole by one claim, time-sliced by claims that
//! all asked one interval, run by one claim's MPS control daemon, or partitioned into MIG
//! instances held by any number of MIG claims); nothing here decides whether a claim may
//! join a GPU.

use std::collections::BTreeMap;

use imbl::OrdSet;

use gpushare_core::Want;
use gpushare_proto::{GpuSharing, TimeSliceInterval};

/// How a GPU is held now. The holders of a shared GPU are a persistent set, so cloning a
/// placement (each change publishes one, [`crate::service`]'s view) costs O(GPUs), not
/// O(claims), however many claims time-slice a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// One claim holds it whole.
    Exclusive(String),
    /// Claims time-slice it at one interval.
    TimeSliced {
        /// The interval all holders asked.
        interval: TimeSliceInterval,
        /// Holders' claim UIDs.
        claims: OrdSet<String>,
    },
    /// One claim's MPS control daemon runs over it.
    Mps(String),
    /// Claims hold MIG instances of it.
    Mig(OrdSet<String>),
}

impl Hold {
    /// UIDs of the claims holding the GPU.
    pub fn claims(&self) -> Vec<String> {
        match self {
            Hold::Exclusive(c) | Hold::Mps(c) => vec![c.clone()],
            Hold::TimeSliced { claims, .. } | Hold::Mig(claims) => claims.iter().cloned().collect(),
        }
    }

    /// The strategy that holds the GPU, for its GPU setting.
    pub fn strategy(&self) -> Box<dyn crate::strategy::Strategy> {
        crate::strategy::of_want(self.want())
    }

    /// How the GPU is held, in admission's word.
    pub fn want(&self) -> Want {
        match self {
            Hold::Exclusive(_) => Want::Exclusive,
            Hold::TimeSliced { interval, .. } => Want::TimeSliced(interval.as_int()),
            Hold::Mps(_) => Want::Mps,
            Hold::Mig(_) => Want::Mig,
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

/// GPU holds by GPU UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    holds: BTreeMap<String, Hold>,
}

impl Placement {
    /// The hold on a GPU, if any.
    pub fn hold(&self, uuid: &str) -> Option<&Hold> {
        self.holds.get(uuid)
    }

    /// Every held GPU's UUID with its hold.
    pub fn holds(&self) -> impl Iterator<Item = (&String, &Hold)> {
        self.holds.iter()
    }

    /// Records that `claim` holds every `(gpu uuid, display name, want)`, as admission
    /// granted it (the mode words decided; this only remembers who).
    pub fn record(&mut self, claim: &str, wants: &[(String, String, Want)]) {
        for (uuid, _, want) in wants {
            let c = claim.to_string();
            match (self.holds.get_mut(uuid), *want) {
                (Some(Hold::Mig(claims)), Want::Mig)
                | (Some(Hold::TimeSliced { claims, .. }), Want::TimeSliced(_)) => {
                    claims.insert(c);
                }
                (_, Want::Exclusive) => {
                    self.holds.insert(uuid.clone(), Hold::Exclusive(c));
                }
                (_, Want::TimeSliced(interval)) => {
                    self.holds.insert(
                        uuid.clone(),
                        Hold::TimeSliced {
                            interval: TimeSliceInterval::from_int(interval).unwrap_or_default(),
                            claims: OrdSet::unit(c),
                        },
                    );
                }
                (_, Want::Mps) => {
                    self.holds.insert(uuid.clone(), Hold::Mps(c));
                }
                (_, Want::Mig) => {
                    self.holds.insert(uuid.clone(), Hold::Mig(OrdSet::unit(c)));
                }
            }
        }
    }

    /// Forgets `claim`'s hold on `uuid`.
    pub fn release(&mut self, claim: &str, uuid: &str) {
        let Some(hold) = self.holds.get_mut(uuid) else {
            return;
        };
        let empty = match hold {
            Hold::Exclusive(c) | Hold::Mps(c) => c == claim,
            Hold::TimeSliced { claims, .. } | Hold::Mig(claims) => {
                claims.remove(claim);
                claims.is_empty()
            }
        };
        if empty {
            self.holds.remove(uuid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(uuid: &str, want: Want) -> (String, String, Want) {
        (uuid.to_string(), format!("gpu-{uuid}"), want)
    }

    #[test]
    fn records_who_holds_what_and_forgets_the_last_holder() {
        let mut p = Placement::default();
        p.record("a", &[w("1", Want::TimeSliced(1))]);
        p.record("b", &[w("1", Want::TimeSliced(1)), w("2", Want::Mps)]);
        assert_eq!(p.hold("1").unwrap().claims(), ["a", "b"]);
        assert_eq!(
            p.hold("1").unwrap().describe(),
            "time-sliced at Short by claim(s) a, b"
        );
        assert_eq!(p.hold("2").unwrap().sharing(), GpuSharing::Mps);
        p.release("a", "1");
        assert_eq!(p.hold("1").unwrap().claims(), ["b"]);
        p.release("b", "1");
        p.release("b", "2");
        assert_eq!(p, Placement::default());
        // Forgetting a claim that holds nothing changes nothing.
        p.release("z", "3");
        assert_eq!(p, Placement::default());
    }
}
