//! The families gathered at scrape time from the service's read views ([`ServiceCollector`]):
//! per-GPU sharing and compute mode, per-claim strategy, attached containers and degraded
//! state, MPS control daemons (up, restarts), and the service's health. Read at each scrape
//! rather than recorded as things happen, so that nothing inside the service knows about
//! metrics.

use std::fmt;
use std::sync::Arc;

use gpushare_proto::{ComputeMode, GpuInfo, GpuSharing, HealthInfo};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};

use super::Labels;
use crate::claim::{Claim, Phase};
use crate::service::Service;

/// Whether a process runs: the one effect scraping needs (MPS control daemon up), kept behind
/// a function so that tests decide.
pub type PidAlive = Arc<dyn Fn(i32) -> bool + Send + Sync>;

/// Whether `pid` exists, by `kill(pid, 0)` (EPERM still means it exists).
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

/// Families read from the service at each scrape.
pub struct ServiceCollector {
    service: Arc<Service>,
    alive: PidAlive,
}

impl fmt::Debug for ServiceCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceCollector").finish_non_exhaustive()
    }
}

fn compute_mode_str(m: ComputeMode) -> &'static str {
    match m {
        ComputeMode::Default => "Default",
        ComputeMode::Prohibited => "Prohibited",
        ComputeMode::ExclusiveProcess => "ExclusiveProcess",
    }
}

fn sharing_str(s: GpuSharing) -> &'static str {
    match s {
        GpuSharing::Free => "Free",
        GpuSharing::Exclusive => "Exclusive",
        GpuSharing::TimeSlicing => "TimeSlicing",
        GpuSharing::Mps => "MPS",
        GpuSharing::Mig => "MIG",
    }
}

fn encode_family<M: EncodeMetric + prometheus_client::metrics::TypedMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    family: &Family<Labels, M>,
) -> Result<(), fmt::Error>
where
    Family<Labels, M>: EncodeMetric,
{
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}

/// One MPS control daemon as a scrape sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDaemonSeen {
    /// The claim's UID.
    pub claim: String,
    /// Index of the MPS device group in the claim.
    pub group: usize,
    /// The control daemon's pid now.
    pub pid: i32,
    /// Times the service restarted this daemon after it died, as the claim record counts
    /// them (kept in the checkpoint, so across restarts of gpushared too).
    pub restarts: u64,
}

/// Every MPS control daemon of `claims`, with its restart count from the claim record.
pub fn mps_daemons(claims: &[Arc<Claim>]) -> Vec<MpsDaemonSeen> {
    claims
        .iter()
        .flat_map(|c| {
            c.groups.iter().enumerate().filter_map(move |(i, g)| {
                g.mps().map(|m| MpsDaemonSeen {
                    claim: c.uid.clone(),
                    group: i,
                    pid: m.control_daemon_pid,
                    restarts: u64::from(m.restarts),
                })
            })
        })
        .collect()
}

/// Encodes a gauge without labels.
fn encode_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), fmt::Error> {
    let g = ConstGauge::new(value);
    let m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(m)
}

/// The service's health as gauges: degraded claims, the checkpoint's state and the driver's
/// CDI spec's.
pub(super) fn encode_health(
    encoder: &mut DescriptorEncoder,
    health: &HealthInfo,
) -> Result<(), fmt::Error> {
    encode_gauge(
        encoder,
        "gpushare_degraded_claims",
        "Claims whose MPS control daemon died and is being restarted (state Degraded).",
        i64::try_from(health.degraded_claims).unwrap_or(i64::MAX),
    )?;
    encode_gauge(
        encoder,
        "gpushare_checkpoint_quarantined",
        "Whether the checkpoint was corrupt at start and moved aside (1) or not (0); see gpushare status.",
        i64::from(health.checkpoint_quarantined.is_some()),
    )?;
    encode_gauge(
        encoder,
        "gpushare_quarantined_records",
        "Claim records refused at start and kept in quarantine (their claims not re-adopted); see gpushare status.",
        i64::try_from(health.quarantined_records.len()).unwrap_or(i64::MAX),
    )?;
    encode_gauge(
        encoder,
        "gpushare_checkpoint_write_error",
        "Whether the last checkpoint write failed (1: changing requests fail until one succeeds) or not (0).",
        i64::from(health.checkpoint_error.is_some()),
    )?;
    // gpushare_ready keeps its meaning (changing requests are accepted: releases work, and
    // prepares that need no driver spec); this is the gauge that says prepares fail.
    let failing = health.driver_spec.as_ref().filter(|d| !d.ok);
    encode_gauge(
        encoder,
        "gpushare_driver_spec_error",
        "Whether the NVIDIA driver's CDI spec cannot be generated (1: every prepare that needs it is refused; gpushare status says why) or can (0).",
        i64::from(failing.is_some()),
    )?;
    encode_gauge(
        encoder,
        "gpushare_driver_spec_failures",
        "Failed generations of the NVIDIA driver's CDI spec in a row (0 once one succeeds).",
        i64::from(failing.map_or(0, |d| d.failures)),
    )
}

impl ServiceCollector {
    /// A collector over `service`; `alive` tells whether an MPS control daemon's pid runs.
    pub fn new(service: Arc<Service>, alive: PidAlive) -> ServiceCollector {
        ServiceCollector { service, alive }
    }

    fn encode_views(
        &self,
        encoder: &mut DescriptorEncoder,
        gpus: &[GpuInfo],
        claims: &[Arc<Claim>],
    ) -> Result<(), fmt::Error> {
        let sharing: Family<Labels, Gauge> = Family::default();
        let compute: Family<Labels, Gauge> = Family::default();
        for g in gpus {
            let gpu = || vec![("gpu", g.name.clone()), ("uuid", g.uuid.clone())];
            let mut l = gpu();
            l.push(("mode", sharing_str(g.sharing).to_string()));
            sharing.get_or_create(&l).set(1);
            let mut l = gpu();
            l.push(("compute_mode", compute_mode_str(g.compute_mode).to_string()));
            compute.get_or_create(&l).set(1);
        }
        encode_family(
            encoder,
            "gpushare_gpu_sharing_mode",
            "How each GPU is shared (1 for the current mode: Free, Exclusive, TimeSlicing, MPS).",
            &sharing,
        )?;
        encode_family(
            encoder,
            "gpushare_gpu_compute_mode",
            "Each GPU's compute mode as gpushared reads it (1 for the current mode).",
            &compute,
        )?;

        let strategy: Family<Labels, Gauge> = Family::default();
        let attached: Family<Labels, Gauge> = Family::default();
        let degraded: Family<Labels, Gauge> = Family::default();
        let mps_up: Family<Labels, Gauge> = Family::default();
        let mps_restarts: Family<Labels, Counter> = Family::default();
        for c in claims {
            for g in &c.groups {
                let l = vec![
                    ("claim", c.uid.clone()),
                    ("namespace", c.namespace.clone()),
                    ("name", c.name.clone()),
                    ("strategy", g.sharing.name().to_string()),
                ];
                strategy.get_or_create(&l).set(1);
            }
            attached
                .get_or_create(&vec![("claim", c.uid.clone())])
                .set(c.attached.len() as i64);
            degraded
                .get_or_create(&vec![("claim", c.uid.clone())])
                .set(i64::from(c.phase == Phase::Degraded));
        }
        for d in mps_daemons(claims) {
            let l = vec![("claim", d.claim), ("group", d.group.to_string())];
            let up = d.pid > 0 && (self.alive)(d.pid);
            mps_up.get_or_create(&l).set(i64::from(up));
            mps_restarts.get_or_create(&l).inc_by(d.restarts);
        }
        encode_family(
            encoder,
            "gpushare_claim_strategy",
            "Sharing strategy of each prepared claim's device groups: Exclusive, TimeSlicing, MPS or MIG (1 per claim and strategy).",
            &strategy,
        )?;
        encode_family(
            encoder,
            "gpushare_claim_attached_containers",
            "Containers attached to each claim through the OCI hook.",
            &attached,
        )?;
        encode_family(
            encoder,
            "gpushare_claim_degraded",
            "Whether each claim is Degraded (1: its MPS control daemon died and is being restarted) or not (0).",
            &degraded,
        )?;
        encode_family(
            encoder,
            "gpushare_mps_daemon_up",
            "Whether each MPS claim's control daemon runs (1) or not (0).",
            &mps_up,
        )?;
        encode_family(
            encoder,
            "gpushare_mps_daemon_restarts",
            "Times gpushared restarted an MPS claim's control daemon after it died.",
            &mps_restarts,
        )?;
        Ok(())
    }
}

impl Collector for ServiceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let gpus = self.service.list_gpus();
        // Shared with the published view, not copied.
        let claims = self.service.claims();
        let health = self.service.health();
        let ready = ConstGauge::new(i64::from(health.ready));
        let m = encoder.encode_descriptor(
            "gpushare_ready",
            "Whether gpushared accepts changing requests (1) or not (0).",
            None,
            ready.metric_type(),
        )?;
        ready.encode(m)?;
        self.encode_views(&mut encoder, &gpus, &claims)?;
        encode_health(&mut encoder, &health)?;
        let (writes, failures) = crate::checkpoint::write_counts();
        let c = ConstCounter::new(writes);
        let m = encoder.encode_descriptor(
            "gpushare_checkpoint_writes",
            "Checkpoint files written (atomically) since start.",
            None,
            c.metric_type(),
        )?;
        c.encode(m)?;
        let c = ConstCounter::new(failures);
        let m = encoder.encode_descriptor(
            "gpushare_checkpoint_write_failures",
            "Checkpoint writes that failed since start (the previous checkpoint stayed).",
            None,
            c.metric_type(),
        )?;
        c.encode(m)
    }
}
