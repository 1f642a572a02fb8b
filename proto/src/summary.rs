//! Short text views of wire types that both the daemon's log lines and the operators' CLI
//! print, so that a log line and `gpushare claims` say a claim's strategy the same way.

use crate::{ClaimInfo, GroupInfo, StrategyInfo};

impl ClaimInfo {
    /// Short description of the claim's strategies, one per device group joined by `+`, e.g.
    /// `MPS(50.0%)+TimeSlicing(Short)`: `Exclusive`, `TimeSlicing(<interval>)`,
    /// `MPS(<active thread percentage as read back>%)` (`MPS(starting)` before it was read
    /// back), and for MIG slices `MIG(<profiles>)` or `MIG(<profiles>)+MPS(<percentage>%)`.
    /// Empty for a claim without groups.
    pub fn strategy_summary(&self) -> String {
        self.groups
            .iter()
            .map(group_summary)
            .collect::<Vec<_>>()
            .join("+")
    }
}

impl GroupInfo {
    /// One group's part of [`ClaimInfo::strategy_summary`]: the CLI's narrow table fits a
    /// claim's strategy group by group, and cannot split the joined text (`+` joins MIG and
    /// MPS within a group too).
    pub fn strategy_summary(&self) -> String {
        group_summary(self)
    }
}

fn group_summary(g: &GroupInfo) -> String {
    match &g.sharing {
        _ if !g.mig.is_empty() => {
            let profiles: Vec<&str> = g.mig.iter().map(|m| m.profile.as_str()).collect();
            match &g.sharing {
                StrategyInfo::Mps(m) => {
                    format!(
                        "MIG({})+MPS({}%)",
                        profiles.join(","),
                        m.active_thread_percentage
                    )
                }
                _ => format!("MIG({})", profiles.join(",")),
            }
        }
        StrategyInfo::Exclusive => "Exclusive".to_string(),
        StrategyInfo::TimeSlicing { interval } => format!("TimeSlicing({})", interval.as_str()),
        StrategyInfo::Mps(m) if m.active_thread_percentage.is_empty() => {
            "MPS(starting)".to_string()
        }
        StrategyInfo::Mps(m) => format!("MPS({}%)", m.active_thread_percentage),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is the failure report

    use serde_json::{json, Value};

    use crate::ClaimInfo;

    fn mps(percentage: &str) -> Value {
        json!({"strategy": "Mps", "control_daemon_pid": 7, "pipe_dir": "/p", "log_dir": "/l",
            "shm_dir": "/s", "visible_devices": [], "active_thread_percentage": percentage,
            "pinned_device_memory_limits": {}})
    }

    fn mig(profile: &str) -> Value {
        json!({"request": "r", "device": "gpu-0-mig", "gpu_uuid": "GPU-0", "gpu_minor": 0,
            "profile": profile, "gi_profile_id": 9, "placement_start": 0, "memory_slices": 4,
            "gi_id": 1, "ci_id": 0, "uuid": "MIG-0"})
    }

    fn claim(groups: Vec<(Value, Vec<Value>)>) -> ClaimInfo {
        let groups: Vec<Value> = groups
            .into_iter()
            .map(|(sharing, mig)| {
                json!({"requests": ["r"], "devices": [], "sharing": sharing, "mig": mig})
            })
            .collect();
        serde_json::from_value(json!({"uid": "u", "namespace": "n", "name": "c",
            "state": "Prepared", "groups": groups, "requests": [], "cdi_spec": "",
            "attach_limit": null, "attached": []}))
        .unwrap()
    }

    #[test]
    fn each_group_is_named_by_its_strategy_and_joined_in_order() {
        let c = claim(vec![
            (mps("50.0"), vec![]),
            (
                json!({"strategy": "TimeSlicing", "interval": "Short"}),
                vec![],
            ),
            (json!({"strategy": "Exclusive"}), vec![]),
        ]);
        assert_eq!(
            c.strategy_summary(),
            "MPS(50.0%)+TimeSlicing(Short)+Exclusive"
        );
    }

    #[test]
    fn an_mps_daemon_not_read_back_yet_is_starting() {
        assert_eq!(
            claim(vec![(mps(""), vec![])]).strategy_summary(),
            "MPS(starting)"
        );
    }

    #[test]
    fn mig_slices_name_their_profiles_and_mps_on_them() {
        let alone = claim(vec![(
            json!({"strategy": "Exclusive"}),
            vec![mig("3g.20gb"), mig("1g.5gb")],
        )]);
        assert_eq!(alone.strategy_summary(), "MIG(3g.20gb,1g.5gb)");
        let shared = claim(vec![(mps("25.0"), vec![mig("2g.20gb")])]);
        assert_eq!(shared.strategy_summary(), "MIG(2g.20gb)+MPS(25.0%)");
        assert_eq!(claim(vec![]).strategy_summary(), "");
    }
}
