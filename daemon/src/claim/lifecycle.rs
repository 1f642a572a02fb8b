//! A claim's lifecycle: one transition function, [`transition`], the only way a claim's phase
//! and the causes of its degradation change ([`take`] writes them: the registry's
//! `transition` and `degrade` for the claims it holds, the start for a record it reads back
//! before the registry holds it; a record read back is taken as it says, and a transaction
//! that is not committed puts the record it saved back, which is an undo, not a
//! transition).
//!
//! A claim is `Degraded` while it has at least one [`Cause`]. An event that reports a fault
//! adds its cause; an event that reports a fault gone clears its causes, and the claim is
//! `Prepared` again once none is left: a restarted MPS control daemon does not heal a claim
//! whose MIG slice is lost or whose GPU is missing.
//!
//! | phase \ event | `Applied` | `DaemonDied` `RestartFailed` `SliceLost` `GpuMissing` | `DaemonsRunning` `SlicesIntact` | `ReleaseStarted` | `Released` |
//! |---|---|---|---|---|---|
//! | `PrepareStarted` | `Prepared` | – | – | `Unpreparing` | – |
//! | `Prepared` | – | `Degraded` (+ its cause) | `Prepared` | `Unpreparing` | – |
//! | `Degraded` | – | `Degraded` (+ its cause) | − its causes: `Prepared` when none is left, else `Degraded` | `Unpreparing` | – |
//! | `Unpreparing` | – | – | – | `Unpreparing` | gone |
//!
//! | event | adds | clears |
//! |---|---|---|
//! | `DaemonDied` | `MpsDaemonDown` | |
//! | `RestartFailed` | `MpsDaemonDown`, `MpsRestartFailed` | |
//! | `SliceLost` | `SliceLost` | |
//! | `GpuMissing` | `GpuMissing` | |
//! | `DaemonsRunning` | | `MpsDaemonDown`, `MpsRestartFailed` |
//! | `SlicesIntact` | | `SliceLost` |
//!
//! Nothing clears `GpuMissing` but a release. A claim enters at `PrepareStarted` (a prepare's
//! first durable write), or in the phase and with the causes its record read back from disk
//! says. "–" is an [`IllegalTransition`]: the caller's premise about the claim was wrong (say,
//! an MPS daemon's death reported for a claim being released), and nothing changes.

use std::collections::BTreeMap;
use std::fmt;

/// Where a claim is in its life. The wire form is `gpushare_proto::ClaimState`
/// (`claim::wire`), the record's `PhaseRecord` (`store::record`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Host setup is being applied; nothing may attach. A crash here is rolled back at start.
    PrepareStarted,
    /// Every strategy is applied and verified; containers may attach.
    Prepared,
    /// Prepared, but with at least one [`Cause`]; new containers are refused with it.
    Degraded,
    /// Being released; a crash here is finished at start.
    Unpreparing,
}

/// Why a claim is `Degraded`, one of a small set, in the order its message lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// An MPS control daemon of the claim exited or was not running (being restarted).
    MpsDaemonDown,
    /// Starting it again failed (retried with backoff).
    MpsRestartFailed,
    /// A MIG slice of the claim vanished and could not be made again.
    SliceLost,
    /// The claim's record names a GPU this node does not have.
    GpuMissing,
}

/// Every cause, for tests and tables.
pub const CAUSES: [Cause; 4] = [
    Cause::MpsDaemonDown,
    Cause::MpsRestartFailed,
    Cause::SliceLost,
    Cause::GpuMissing,
];

/// A set of [`Cause`]s, as the transition function sees it (a copy, no allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Causes(u8);

impl Causes {
    /// No cause.
    pub const NONE: Causes = Causes(0);

    fn bit(c: Cause) -> u8 {
        1 << (c as u8)
    }

    /// Whether `c` is in the set.
    pub fn contains(self, c: Cause) -> bool {
        self.0 & Causes::bit(c) != 0
    }

    /// The set with `c`.
    #[must_use]
    pub fn with(self, c: Cause) -> Causes {
        Causes(self.0 | Causes::bit(c))
    }

    /// The set without `c`.
    #[must_use]
    pub fn without(self, c: Cause) -> Causes {
        Causes(self.0 & !Causes::bit(c))
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The causes in the set, in order.
    pub fn iter(self) -> impl Iterator<Item = Cause> {
        CAUSES.into_iter().filter(move |c| self.contains(*c))
    }

    /// The set of the keys of `details`.
    pub fn of<V>(details: &BTreeMap<Cause, V>) -> Causes {
        details.keys().fold(Causes::NONE, |s, c| s.with(*c))
    }
}

/// What happened to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Every strategy was applied, the CDI spec written and checked.
    Applied,
    /// An MPS control daemon of the claim exited (the supervisor saw it, or a start found it
    /// dead).
    DaemonDied,
    /// Starting a dead MPS control daemon again failed (retried with backoff).
    RestartFailed,
    /// A MIG slice vanished and could not be made again.
    SliceLost,
    /// The claim's record, read back at start, names a GPU the node does not have.
    GpuMissing,
    /// Every MPS control daemon of the claim runs.
    DaemonsRunning,
    /// Every MIG slice of the claim is there as recorded.
    SlicesIntact,
    /// A release (an unprepare, a rollback, a retry of an interrupted claim) began.
    ReleaseStarted,
    /// Everything the claim held is released: it leaves the registry.
    Released,
}

/// What a legal transition leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The claim is now in this phase, with these causes.
    Phase(Phase, Causes),
    /// The claim is gone (released).
    Gone,
}

/// `event` cannot happen to a claim in `from`; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a claim in phase {from:?} cannot take event {event:?}")]
pub struct IllegalTransition {
    /// The claim's phase.
    pub from: Phase,
    /// What was reported.
    pub event: Event,
}

/// Every phase, for tests and tables.
pub const PHASES: [Phase; 4] = [
    Phase::PrepareStarted,
    Phase::Prepared,
    Phase::Degraded,
    Phase::Unpreparing,
];

/// Every event, for tests and tables.
pub const EVENTS: [Event; 9] = [
    Event::Applied,
    Event::DaemonDied,
    Event::RestartFailed,
    Event::SliceLost,
    Event::GpuMissing,
    Event::DaemonsRunning,
    Event::SlicesIntact,
    Event::ReleaseStarted,
    Event::Released,
];

impl Event {
    /// The causes this event adds, and those it clears (the second table of the module docs).
    pub fn effect(self, causes: Causes) -> Causes {
        use Cause as C;
        match self {
            Event::DaemonDied => causes.with(C::MpsDaemonDown),
            Event::RestartFailed => causes.with(C::MpsDaemonDown).with(C::MpsRestartFailed),
            Event::SliceLost => causes.with(C::SliceLost),
            Event::GpuMissing => causes.with(C::GpuMissing),
            Event::DaemonsRunning => causes
                .without(C::MpsDaemonDown)
                .without(C::MpsRestartFailed),
            Event::SlicesIntact => causes.without(C::SliceLost),
            Event::Applied | Event::ReleaseStarted | Event::Released => causes,
        }
    }
}

/// The phase and causes a claim in `from` with `causes` has after `event` (the tables in this
/// module's docs).
///
/// # Errors
/// [`IllegalTransition`] for every pair the table leaves empty.
pub fn transition(from: Phase, causes: Causes, event: Event) -> Result<Next, IllegalTransition> {
    use Event as E;
    use Phase as P;
    let next = match (from, event) {
        (P::PrepareStarted, E::Applied) => Next::Phase(P::Prepared, Causes::NONE),
        (
            P::Prepared | P::Degraded,
            E::DaemonDied
            | E::RestartFailed
            | E::SliceLost
            | E::GpuMissing
            | E::DaemonsRunning
            | E::SlicesIntact,
        ) => {
            let left = event.effect(causes);
            let phase = if left.is_empty() {
                P::Prepared
            } else {
                P::Degraded
            };
            Next::Phase(phase, left)
        }
        (_, E::ReleaseStarted) => Next::Phase(P::Unpreparing, causes),
        (P::Unpreparing, E::Released) => Next::Gone,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(next)
}

/// `claim` takes `event`: the one place a claim's phase and causes are written (the
/// registry calls it for the claims it holds). `details` say what happened, per cause the
/// event adds (a cause added without one says its name); the claim's `last_error` is then
/// rendered from its causes' details, while any is left. Cleared causes take their details
/// with them; once none is left `last_error` stays as it was (history). `Gone` leaves `claim` as it was: its holder drops
/// it.
///
/// # Errors
/// [`IllegalTransition`]; `claim` is unchanged.
pub fn take(
    claim: &mut super::Claim,
    event: Event,
    details: Vec<(Cause, String)>,
) -> Result<Next, IllegalTransition> {
    let before = claim.causes();
    let next = transition(claim.phase, before, event)?;
    if let Next::Phase(phase, causes) = next {
        claim.phase = phase;
        claim.degraded.retain(|c, _| causes.contains(*c));
        let mut reported = false;
        for (c, d) in details {
            if causes.contains(c) {
                claim.degraded.insert(c, d);
                reported = true;
            }
        }
        for c in causes.iter() {
            if let std::collections::btree_map::Entry::Vacant(e) = claim.degraded.entry(c) {
                e.insert(c.to_string());
                reported = true;
            }
        }
        // The message follows the causes while any is left (one cleared takes its words with
        // it); once none is, the last one stays as history.
        if reported || (causes != before && !causes.is_empty()) {
            claim.last_error = Some(render(&claim.degraded));
        }
    }
    Ok(next)
}

/// A `Degraded` claim's message: its causes' details, in the order of [`Cause`], joined by
/// `"; "`.
pub fn render(details: &BTreeMap<Cause, String>) -> String {
    details.values().cloned().collect::<Vec<_>>().join("; ")
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cause::MpsDaemonDown => "an MPS control daemon is not running",
            Cause::MpsRestartFailed => "restarting the MPS control daemon failed",
            Cause::SliceLost => "a MIG slice is lost",
            Cause::GpuMissing => "a GPU of the claim is not on this node",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Cause as C;
    use Event as E;
    use Phase as P;

    /// Every legal (phase, event) pair, from no cause: where it leads.
    const LEGAL: [(Phase, Event, Phase); 17] = [
        (P::PrepareStarted, E::Applied, P::Prepared),
        (P::PrepareStarted, E::ReleaseStarted, P::Unpreparing),
        (P::Prepared, E::DaemonDied, P::Degraded),
        (P::Prepared, E::RestartFailed, P::Degraded),
        (P::Prepared, E::SliceLost, P::Degraded),
        (P::Prepared, E::GpuMissing, P::Degraded),
        (P::Prepared, E::DaemonsRunning, P::Prepared),
        (P::Prepared, E::SlicesIntact, P::Prepared),
        (P::Prepared, E::ReleaseStarted, P::Unpreparing),
        (P::Degraded, E::DaemonDied, P::Degraded),
        (P::Degraded, E::RestartFailed, P::Degraded),
        (P::Degraded, E::SliceLost, P::Degraded),
        (P::Degraded, E::GpuMissing, P::Degraded),
        (P::Degraded, E::DaemonsRunning, P::Prepared),
        (P::Degraded, E::SlicesIntact, P::Prepared),
        (P::Degraded, E::ReleaseStarted, P::Unpreparing),
        (P::Unpreparing, E::ReleaseStarted, P::Unpreparing),
    ];

    #[test]
    fn every_legal_transition_leads_where_the_table_says() {
        for (from, event, to) in LEGAL {
            match transition(from, Causes::NONE, event) {
                Ok(Next::Phase(p, _)) => assert_eq!(p, to, "{from:?} × {event:?}"),
                other => panic!("{from:?} × {event:?}: {other:?}"),
            }
        }
        assert_eq!(
            transition(P::Unpreparing, Causes::NONE, E::Released),
            Ok(Next::Gone)
        );
    }

    #[test]
    fn every_other_pair_is_illegal_and_says_which() {
        let mut illegal = 0;
        for from in PHASES {
            for event in EVENTS {
                let legal = LEGAL.iter().any(|(f, e, _)| *f == from && *e == event)
                    || (from, event) == (P::Unpreparing, E::Released);
                if legal {
                    continue;
                }
                assert_eq!(
                    transition(from, Causes::NONE, event),
                    Err(IllegalTransition { from, event }),
                    "{from:?} × {event:?}"
                );
                illegal += 1;
            }
        }
        // 4 phases × 9 events = 36 pairs, 18 of them legal.
        assert_eq!(illegal, 36 - 18);
        let e = transition(P::Unpreparing, Causes::NONE, E::DaemonDied).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a claim in phase Unpreparing cannot take event DaemonDied"
        );
    }

    /// Over every set of causes: a fault adds its cause and leaves the claim Degraded; a
    /// clearing event removes only its own, and the claim is Prepared exactly when none is
    /// left; a release keeps them; the set never changes the legality of a pair.
    #[test]
    fn causes_come_and_go_as_the_second_table_says() {
        let all_sets: Vec<Causes> = (0u8..16).map(Causes).collect();
        for causes in all_sets {
            for from in [P::Prepared, P::Degraded] {
                for event in EVENTS {
                    let Ok(next) = transition(from, causes, event) else {
                        assert!(matches!(event, E::Applied | E::Released));
                        continue;
                    };
                    let Next::Phase(phase, left) = next else {
                        panic!("{next:?}")
                    };
                    match event {
                        E::DaemonDied => assert!(left.contains(C::MpsDaemonDown)),
                        E::RestartFailed => assert!(
                            left.contains(C::MpsDaemonDown) && left.contains(C::MpsRestartFailed)
                        ),
                        E::SliceLost => assert!(left.contains(C::SliceLost)),
                        E::GpuMissing => assert!(left.contains(C::GpuMissing)),
                        E::DaemonsRunning => {
                            assert_eq!(
                                left,
                                causes
                                    .without(C::MpsDaemonDown)
                                    .without(C::MpsRestartFailed)
                            );
                        }
                        E::SlicesIntact => assert_eq!(left, causes.without(C::SliceLost)),
                        E::ReleaseStarted => {
                            assert_eq!((phase, left), (P::Unpreparing, causes));
                            continue;
                        }
                        E::Applied | E::Released => unreachable!(),
                    }
                    assert_eq!(phase == P::Prepared, left.is_empty(), "{event:?} {left:?}");
                    // Only a release clears a missing GPU.
                    if causes.contains(C::GpuMissing) {
                        assert!(left.contains(C::GpuMissing));
                    }
                }
            }
        }
    }

    #[test]
    fn only_a_release_leaves_and_only_from_unpreparing() {
        for from in PHASES {
            for event in EVENTS {
                if transition(from, Causes::NONE, event) == Ok(Next::Gone) {
                    assert_eq!((from, event), (P::Unpreparing, E::Released));
                }
            }
        }
    }

    #[test]
    fn the_message_is_rendered_from_the_causes_and_survives_the_heal() {
        let mut c = crate::claim::wire::claim_of(gpushare_proto::ClaimInfo {
            uid: "u".into(),
            namespace: "n".into(),
            name: "c".into(),
            state: gpushare_proto::ClaimState::Prepared,
            groups: vec![],
            requests: vec![],
            cdi_spec: String::new(),
            attach_limit: None,
            attached: vec![],
            last_error: None,
            restarts: 0,
            resource_version: None,
            generation: 1,
        });
        take(
            &mut c,
            E::DaemonDied,
            vec![(C::MpsDaemonDown, "daemon 7 exited".into())],
        )
        .unwrap();
        take(
            &mut c,
            E::RestartFailed,
            vec![(
                C::MpsRestartFailed,
                "restarting the MPS control daemon failed (attempt 1): no".into(),
            )],
        )
        .unwrap();
        take(&mut c, E::SliceLost, vec![]).unwrap();
        assert_eq!(c.phase, P::Degraded);
        assert_eq!(
            c.last_error.as_deref(),
            Some("daemon 7 exited; restarting the MPS control daemon failed (attempt 1): no; a MIG slice is lost")
        );
        take(&mut c, E::DaemonsRunning, vec![]).unwrap();
        assert_eq!(c.phase, P::Degraded, "the slice is still lost");
        assert_eq!(c.causes(), Causes::NONE.with(C::SliceLost));
        // The message follows the causes left (review finding: it kept the daemon's words).
        assert_eq!(c.last_error.as_deref(), Some("a MIG slice is lost"));
        take(&mut c, E::SlicesIntact, vec![]).unwrap();
        assert_eq!(c.phase, P::Prepared);
        assert!(c.degraded.is_empty());
        assert!(c.last_error.is_some(), "kept as history");
    }
}
