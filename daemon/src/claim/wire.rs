//! The protocol's view of a claim's phase: `gpushare_proto::ClaimState`, converted here and
//! only here, so the lifecycle's phases stay the daemon's own.

use gpushare_proto::ClaimState;

use super::Phase;

impl From<Phase> for ClaimState {
    fn from(p: Phase) -> ClaimState {
        match p {
            Phase::PrepareStarted => ClaimState::PrepareStarted,
            Phase::Prepared => ClaimState::Prepared,
            Phase::Degraded => ClaimState::Degraded,
            Phase::Unpreparing => ClaimState::Unpreparing,
        }
    }
}

impl From<ClaimState> for Phase {
    fn from(s: ClaimState) -> Phase {
        match s {
            ClaimState::PrepareStarted => Phase::PrepareStarted,
            ClaimState::Prepared => Phase::Prepared,
            ClaimState::Degraded => Phase::Degraded,
            ClaimState::Unpreparing => Phase::Unpreparing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_round_trips_through_the_wire() {
        for p in super::super::lifecycle::PHASES {
            assert_eq!(Phase::from(ClaimState::from(p)), p);
        }
    }
}
