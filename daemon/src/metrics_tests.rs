//! Unit tests of `metrics.rs`.

use std::collections::BTreeMap;

use gpushare_proto::{ClaimInfo, ClaimState, GroupInfo, HealthInfo, MpsInfo, StrategyInfo};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::collector::encode_health;
use super::*;

fn claim(uid: &str, daemons: &[(i32, u32)]) -> ClaimInfo {
    ClaimInfo {
        uid: uid.into(),
        namespace: "ns".into(),
        name: "n".into(),
        state: ClaimState::Prepared,
        groups: daemons
            .iter()
            .map(|&(pid, restarts)| GroupInfo {
                requests: vec!["gpu".into()],
                devices: vec![],
                sharing: StrategyInfo::Mps(MpsInfo {
                    control_daemon_pid: pid,
                    pipe_dir: String::new(),
                    log_dir: String::new(),
                    shm_dir: String::new(),
                    visible_devices: vec![],
                    active_thread_percentage: "50".into(),
                    pinned_device_memory_limits: BTreeMap::new(),
                    control_daemon_start_time: 0,
                    requested: gpushare_proto::MpsRequested::default(),
                    restarts,
                }),
                mig: vec![],
            })
            .collect(),
        requests: vec![],
        cdi_spec: String::new(),
        attach_limit: None,
        attached: vec![],
        last_error: None,
        restarts: daemons.iter().map(|&(_, r)| r).sum(),
        resource_version: None,
        generation: 1,
    }
}

#[test]
fn mps_restarts_come_from_the_claim_records() {
    let seen = mps_daemons(&[
        Arc::new(crate::claim::wire::claim_of(claim(
            "a",
            &[(10, 0), (20, 3)],
        ))),
        Arc::new(crate::claim::wire::claim_of(claim("b", &[(30, 1)]))),
    ]);
    let restarts: Vec<(String, usize, i32, u64)> = seen
        .into_iter()
        .map(|d| (d.claim, d.group, d.pid, d.restarts))
        .collect();
    assert_eq!(
        restarts,
        vec![
            ("a".into(), 0, 10, 0),
            ("a".into(), 1, 20, 3),
            ("b".into(), 0, 30, 1)
        ]
    );
}

#[test]
fn health_gauges_show_degraded_claims_and_the_checkpoint_state() {
    struct Health(HealthInfo);
    impl fmt::Debug for Health {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Health")
        }
    }
    impl Collector for Health {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
            encode_health(&mut encoder, &self.0)
        }
    }
    let health = |degraded, quarantined: Option<&str>, error: Option<&str>| HealthInfo {
        ready: true,
        node_name: "n".into(),
        gpus: 1,
        claims: 2,
        backend: "sim".into(),
        mps_control: "/bin/true".into(),
        checkpoint_quarantined: quarantined.map(str::to_string),
        checkpoint_error: error.map(str::to_string),
        quarantined_records: (0..degraded).map(|i| format!("claim {i}")).collect(),
        degraded_claims: degraded,
        stopping: false,
        drivers: vec!["gpu.nvidia.com".into()],
        // The driver's CDI spec fails along with the checkpoint here.
        driver_spec: Some(gpushare_proto::DriverSpecHealth {
            path: "/var/run/cdi/gpushare.io-gpu.json".into(),
            generator: "/usr/bin/nvidia-ctk cdi generate (driver root /)".into(),
            ok: error.is_none(),
            error: error
                .map(|_| "Failed to initialize NVML: Driver/library version mismatch".into()),
            failures: if error.is_some() { 3 } else { 0 },
            retry_in_seconds: error.map(|_| 40),
            generate_timeout_seconds: Some(15),
        }),
    };
    let text = |h: HealthInfo| {
        let mut r = Registry::default();
        r.register_collector(Box::new(Health(h)));
        render(&r).unwrap()
    };
    let ok = text(health(0, None, None));
    for line in [
        "gpushare_degraded_claims 0",
        "gpushare_checkpoint_quarantined 0",
        "gpushare_quarantined_records 0",
        "gpushare_checkpoint_write_error 0",
        "gpushare_driver_spec_error 0",
        "gpushare_driver_spec_failures 0",
    ] {
        assert!(ok.lines().any(|l| l == line), "{line}: {ok}");
    }
    let bad = text(health(2, Some("moved to x: bad json"), Some("disk full")));
    let mut none = health(0, None, None);
    none.driver_spec = None;
    let none = text(none);
    assert!(
        none.lines().any(|l| l == "gpushare_driver_spec_error 0"),
        "[cdi] driver_spec = \"none\" has nothing to fail: {none}"
    );
    for line in [
        "gpushare_degraded_claims 2",
        "gpushare_checkpoint_quarantined 1",
        "gpushare_quarantined_records 2",
        "gpushare_checkpoint_write_error 1",
        "gpushare_driver_spec_error 1",
        "gpushare_driver_spec_failures 3",
    ] {
        assert!(bad.lines().any(|l| l == line), "{line}: {bad}");
    }
}

#[test]
fn request_metrics_record_latency_by_outcome_and_errors_by_code() {
    let requests = Arc::new(RequestMetrics::default());
    requests.observe(
        gpushare_proto::Method::Prepare,
        None,
        Duration::from_millis(30),
    );
    requests.observe(
        gpushare_proto::Method::Prepare,
        Some(ErrorCode::Conflict),
        Duration::from_millis(2),
    );
    requests.observe(
        gpushare_proto::Method::Attach,
        Some(ErrorCode::NotFound),
        Duration::from_millis(1),
    );
    let mut r = Registry::default();
    r.register("t_prepare_seconds", "h", requests.prepare_seconds.clone());
    r.register("t_errors", "h", requests.errors.clone());
    let text = render(&r).unwrap();
    assert!(
        text.contains("t_prepare_seconds_count{outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("t_prepare_seconds_bucket{le=\"0.05\",outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("t_prepare_seconds_bucket{le=\"0.025\",outcome=\"ok\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("t_prepare_seconds_count{outcome=\"Conflict\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("t_errors_total{method=\"prepare\",code=\"Conflict\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("t_errors_total{method=\"attach\",code=\"NotFound\"} 1"),
        "{text}"
    );
}
