//! A claim's lifecycle: one transition function, [`transition`], the only way a claim's phase
//! changes (the registry's `transition` is its only caller that writes one; a transaction that
//! is not committed puts the record it saved back, which is an undo, not a transition).
//!
//! | phase \ event | `Applied` | `DaemonDied` | `RestartFailed` | `SliceLost` | `GpuMissing` | `Healed` | `ReleaseStarted` | `Released` |
//! |---|---|---|---|---|---|---|---|---|
//! | `PrepareStarted` | `Prepared` | – | – | – | – | – | `Unpreparing` | – |
//! | `Prepared` | – | `Degraded` | `Degraded` | `Degraded` | `Degraded` | – | `Unpreparing` | – |
//! | `Degraded` | – | `Degraded` | `Degraded` | `Degraded` | `Degraded` | `Prepared` | `Unpreparing` | – |
//! | `Unpreparing` | – | – | – | – | – | – | `Unpreparing` | gone |
//!
//! A claim enters at `PrepareStarted` (a prepare's first durable write), or in the phase its
//! record read back from disk says. "–" is an [`IllegalTransition`]: the caller's premise
//! about the claim was wrong (say, an MPS daemon's death reported for a claim being
//! released), and nothing changes.

use std::fmt;

/// Where a claim is in its life. The wire form is `gpushare_proto::ClaimState`
/// (`claim::wire`), the record's `PhaseRecord` (`store::record`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Host setup is being applied; nothing may attach. A crash here is rolled back at start.
    PrepareStarted,
    /// Every strategy is applied and verified; containers may attach.
    Prepared,
    /// Prepared, but an MPS control daemon died (being restarted), a MIG slice is lost or a
    /// GPU of it is not on the node; new containers are refused with the reason.
    Degraded,
    /// Being released; a crash here is finished at start.
    Unpreparing,
}

/// What happened to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Every strategy was applied, the CDI spec written and checked.
    Applied,
    /// The supervisor saw one of its MPS control daemons exit.
    DaemonDied,
    /// Starting a dead MPS control daemon again failed (retried with backoff).
    RestartFailed,
    /// A MIG slice vanished and could not be made again.
    SliceLost,
    /// The claim's record, read back at start, names a GPU the node does not have.
    GpuMissing,
    /// Every MPS control daemon runs again and every MIG slice is there.
    Healed,
    /// A release (an unprepare, a rollback, a retry of an interrupted claim) began.
    ReleaseStarted,
    /// Everything the claim held is released: it leaves the registry.
    Released,
}

/// What a legal transition leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The claim is now in this phase.
    Phase(Phase),
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
pub const EVENTS: [Event; 8] = [
    Event::Applied,
    Event::DaemonDied,
    Event::RestartFailed,
    Event::SliceLost,
    Event::GpuMissing,
    Event::Healed,
    Event::ReleaseStarted,
    Event::Released,
];

/// The phase a claim in `from` is in after `event` (the table in this module's docs).
///
/// # Errors
/// [`IllegalTransition`] for every pair the table leaves empty.
pub fn transition(from: Phase, event: Event) -> Result<Next, IllegalTransition> {
    use Event as E;
    use Phase as P;
    let next = match (from, event) {
        (P::PrepareStarted, E::Applied) => Next::Phase(P::Prepared),
        (
            P::Prepared | P::Degraded,
            E::DaemonDied | E::RestartFailed | E::SliceLost | E::GpuMissing,
        ) => Next::Phase(P::Degraded),
        (P::Degraded, E::Healed) => Next::Phase(P::Prepared),
        (_, E::ReleaseStarted) => Next::Phase(P::Unpreparing),
        (P::Unpreparing, E::Released) => Next::Gone,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(next)
}

/// Applies `event` to `claim`'s phase: the one place a claim's phase is written (the
/// registry's `Claims::transition` calls it for the claims it holds). `Gone` leaves `claim`
/// as it was: its holder drops it.
///
/// # Errors
/// [`IllegalTransition`]; `claim` is unchanged.
pub fn apply(claim: &mut super::Claim, event: Event) -> Result<Next, IllegalTransition> {
    let next = transition(claim.phase, event)?;
    if let Next::Phase(p) = next {
        claim.phase = p;
    }
    Ok(next)
}

impl Phase {
    /// Whether containers may be attached now.
    pub fn serves_containers(self) -> bool {
        self == Phase::Prepared
    }

    /// Prepared or Degraded: set up on the host, its MPS daemons supervised.
    pub fn is_set_up(self) -> bool {
        matches!(self, Phase::Prepared | Phase::Degraded)
    }

    /// Left half-done by a crash: rolled back (or its release finished) at start.
    pub fn is_interrupted(self) -> bool {
        matches!(self, Phase::PrepareStarted | Phase::Unpreparing)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Event as E;
    use Phase as P;

    /// The table of the module docs, row by row: every legal pair and where it leads.
    const LEGAL: [(Phase, Event, Next); 15] = [
        (P::PrepareStarted, E::Applied, Next::Phase(P::Prepared)),
        (
            P::PrepareStarted,
            E::ReleaseStarted,
            Next::Phase(P::Unpreparing),
        ),
        (P::Prepared, E::DaemonDied, Next::Phase(P::Degraded)),
        (P::Prepared, E::RestartFailed, Next::Phase(P::Degraded)),
        (P::Prepared, E::SliceLost, Next::Phase(P::Degraded)),
        (P::Prepared, E::GpuMissing, Next::Phase(P::Degraded)),
        (P::Prepared, E::ReleaseStarted, Next::Phase(P::Unpreparing)),
        (P::Degraded, E::DaemonDied, Next::Phase(P::Degraded)),
        (P::Degraded, E::RestartFailed, Next::Phase(P::Degraded)),
        (P::Degraded, E::SliceLost, Next::Phase(P::Degraded)),
        (P::Degraded, E::GpuMissing, Next::Phase(P::Degraded)),
        (P::Degraded, E::Healed, Next::Phase(P::Prepared)),
        (P::Degraded, E::ReleaseStarted, Next::Phase(P::Unpreparing)),
        (
            P::Unpreparing,
            E::ReleaseStarted,
            Next::Phase(P::Unpreparing),
        ),
        (P::Unpreparing, E::Released, Next::Gone),
    ];

    #[test]
    fn every_legal_transition_leads_where_the_table_says() {
        for (from, event, to) in LEGAL {
            assert_eq!(transition(from, event), Ok(to), "{from:?} × {event:?}");
        }
    }

    #[test]
    fn every_other_pair_is_illegal_and_says_which() {
        let mut illegal = 0;
        for from in PHASES {
            for event in EVENTS {
                if LEGAL.iter().any(|(f, e, _)| *f == from && *e == event) {
                    continue;
                }
                assert_eq!(
                    transition(from, event),
                    Err(IllegalTransition { from, event }),
                    "{from:?} × {event:?}"
                );
                illegal += 1;
            }
        }
        // 4 phases × 8 events = 32 pairs, 15 of them legal.
        assert_eq!(illegal, 32 - 15);
        let e = transition(P::Unpreparing, E::DaemonDied).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a claim in phase Unpreparing cannot take event DaemonDied"
        );
    }

    #[test]
    fn only_a_release_leaves_and_only_from_unpreparing() {
        for from in PHASES {
            for event in EVENTS {
                if transition(from, event) == Ok(Next::Gone) {
                    assert_eq!((from, event), (P::Unpreparing, E::Released));
                }
            }
        }
    }

    #[test]
    fn phase_predicates() {
        assert!(P::Prepared.serves_containers());
        assert!(!P::Degraded.serves_containers());
        assert!(P::Degraded.is_set_up() && P::Prepared.is_set_up());
        assert!(P::PrepareStarted.is_interrupted() && P::Unpreparing.is_interrupted());
        assert!(!P::Prepared.is_interrupted());
    }
}
