//! A claim resolved into per-group plans, touching nothing: devices found, configurations
//! checked, each group's config mapped onto its strategy (`strategy::group`: MPS directories
//! and limits computed, MIG slices resolved).

use super::*;
use crate::config::Sharing;
use crate::strategy::group::{Applied, GroupStrategy};
use crate::strategy::mps::{self, MpsGroup};
use crate::strategy::{Exclusive, TimeSlicing};

impl Service {
    /// Resolves devices and configs into per-group plans, touching nothing.
    pub(super) fn plan(
        &self,
        spec: &ClaimSpec,
    ) -> Result<(Vec<GroupPlan>, Option<u32>), ServiceError> {
        let mut gpus: Vec<&Gpu> = Vec::with_capacity(spec.results.len());
        let mut seen = BTreeSet::new();
        let mut seen_names = BTreeSet::new();
        for r in &spec.results {
            let mig_name = crate::mig::MigDeviceName::parse(&r.device);
            if mig_name.is_none() && is_mig_device_name(&r.device) {
                return Err(ServiceError::new(
                    ErrorCode::Unsupported,
                    format!(
                        "device {} (request {}) is a static MIG device by UUID; gpushare creates MIG devices itself and takes them by name (gpu-<minor>-mig-<profile>-<GI profile ID>-<placement start>)",
                        r.device, r.request
                    ),
                ));
            }
            if !seen_names.insert(r.device.clone()) {
                return Err(ServiceError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "device {} is allocated twice in claim {}",
                        r.device, spec.uid
                    ),
                ));
            }
            let lookup = mig_name
                .as_ref()
                .map_or_else(|| r.device.clone(), |n| format!("gpu-{}", n.minor));
            let gpu = self.backend.find(&lookup).ok_or_else(|| {
                let known: Vec<String> = self.backend.gpus().iter().map(Gpu::device_name).collect();
                ServiceError::new(
                    ErrorCode::UnknownDevice,
                    format!(
                        "device {:?} (request {}) does not exist on node {}; it has {}",
                        r.device,
                        r.request,
                        self.cfg.node_name,
                        known.join(", ")
                    ),
                )
            })?;
            // Several MIG devices of one GPU may share a claim; whole GPUs may not repeat.
            if mig_name.is_none() && !seen.insert(gpu.uuid.clone()) {
                return Err(ServiceError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "device {} is allocated twice in claim {}",
                        r.device, spec.uid
                    ),
                ));
            }
            gpus.push(gpu);
        }

        let mut plans = Vec::new();
        let mut limit: Option<u32> = None;
        for group in &spec.groups {
            let mut devices: Vec<ClaimDevice> = group
                .results
                .iter()
                .map(|&i| ClaimDevice {
                    request: spec.results[i].request.clone(),
                    device: spec.results[i].device.clone(),
                    uuid: gpus[i].uuid.clone(),
                    minor: gpus[i].minor,
                })
                .collect();
            devices.sort_by(|a, b| a.uuid.cmp(&b.uuid));
            let mut requests: Vec<String> = Vec::new();
            for &i in &group.results {
                if !requests.contains(&spec.results[i].request) {
                    requests.push(spec.results[i].request.clone());
                }
            }
            let mut cap = |r: Option<u32>| {
                if let Some(r) = r {
                    limit = Some(limit.map_or(r, |l| l.min(r)));
                }
            };
            // MIG devices get MIG whatever the config says: no config means the slice alone,
            // MPS means a daemon on the slice.
            let migs = group
                .results
                .iter()
                .filter(|&&i| crate::mig::MigDeviceName::parse(&spec.results[i].device).is_some())
                .count();
            let sharing = if migs == 0 {
                group.sharing.clone()
            } else if migs != group.results.len() {
                return Err(ServiceError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "request(s) {} mix MIG devices and whole GPUs under one config",
                        requests.join(", ")
                    ),
                ));
            } else {
                match &group.sharing {
                    Sharing::Exclusive => Sharing::Mig {
                        profile: None,
                        mps: None,
                    },
                    Sharing::Mps { settings, replicas } => {
                        cap(*replicas);
                        Sharing::Mig {
                            profile: None,
                            mps: Some(settings.clone()),
                        }
                    }
                    Sharing::TimeSlicing { .. } => {
                        return Err(ServiceError::new(
                            ErrorCode::InvalidConfig,
                            format!(
                                "request(s) {}: time-slicing applies to whole GPUs, not MIG devices (use MPS or no sharing)",
                                requests.join(", ")
                            ),
                        ))
                    }
                    m @ Sharing::Mig { .. } => m.clone(),
                }
            };
            if !matches!(sharing, Sharing::Mig { .. }) {
                for &i in &group.results {
                    self.check_whole_gpu(gpus[i])?;
                }
            }
            let strategy: Box<dyn GroupStrategy> = match &sharing {
                Sharing::Exclusive => Box::new(Exclusive),
                Sharing::TimeSlicing { interval, replicas } => {
                    cap(*replicas);
                    Box::new(TimeSlicing {
                        interval: *interval,
                    })
                }
                Sharing::Mps { settings, replicas } => {
                    cap(*replicas);
                    let uuids: Vec<String> = devices.iter().map(|d| d.uuid.clone()).collect();
                    for &i in &group.results {
                        self.check_mps_support(gpus[i], settings)?;
                    }
                    let launch = mps::plan_launch(
                        &spec.uid,
                        &self.claim_dir(&spec.uid),
                        &uuids,
                        &requests,
                        settings,
                        self.shm_bytes(),
                    )?;
                    Box::new(MpsGroup { launch })
                }
                Sharing::Mig { profile, mps } => {
                    if let Some(settings) = mps {
                        for &i in &group.results {
                            self.check_mps_support(gpus[i], settings)?;
                        }
                    }
                    let mig = self.plan_mig(
                        spec,
                        &group.results,
                        profile.as_deref(),
                        mps.as_ref(),
                        &requests,
                    )?;
                    // The group's devices are the MIG devices, named canonically.
                    devices = mig
                        .targets
                        .iter()
                        .map(|t| ClaimDevice {
                            request: t.request.clone(),
                            device: t.device.clone(),
                            uuid: t.gpu_uuid.clone(),
                            minor: t.gpu_minor,
                        })
                        .collect();
                    Box::new(mig)
                }
            };
            plans.push(GroupPlan {
                requests,
                devices,
                strategy,
            });
        }
        Ok((plans, limit))
    }

    /// Refuses (`Unsupported`) an MPS group on a GPU whose MPS cannot keep the claim's
    /// settings (see [`crate::strategy::mps_support`]).
    pub(super) fn check_mps_support(
        &self,
        gpu: &Gpu,
        settings: &config::MpsSettings,
    ) -> Result<(), ServiceError> {
        let pinned = settings.default_pinned_limit_mib.is_some()
            || !settings.per_device_pinned_limit_mib.is_empty();
        crate::strategy::mps_support::check(gpu, pinned)
            .map_err(|m| ServiceError::new(ErrorCode::Unsupported, m))
    }

    /// The size of each MPS group's shm tmpfs, in bytes: `[mps] shm_size_mib` or half the host's
    /// memory.
    pub(super) fn shm_bytes(&self) -> u64 {
        self.cfg
            .shm_bytes
            .unwrap_or_else(|| default_shm_bytes(self.mps.ops().machine.mem_total_kib()))
    }

    pub(super) fn request_devices(&self, spec: &ClaimSpec) -> Vec<RequestDevices> {
        let mut out: Vec<RequestDevices> = Vec::new();
        for r in &spec.results {
            let device = PreparedDevice {
                device: r.device.clone(),
                pool: r.pool.clone(),
                cdi_device_ids: Vec::new(),
            };
            match out.iter_mut().find(|x| x.request == r.request) {
                Some(x) => {
                    x.devices.push(r.device.clone());
                    x.per_device.push(device);
                }
                None => out.push(RequestDevices {
                    request: r.request.clone(),
                    cdi_device_ids: vec![],
                    devices: vec![r.device.clone()],
                    per_device: vec![device],
                }),
            }
        }
        let single = out.len() == 1;
        for x in &mut out {
            let claim_device =
                cdi::qualified_name(&cdi::device_name(&spec.uid, &x.request, single));
            // The claim device serves the whole request: on its last device only.
            if let Some(last) = x.per_device.last_mut() {
                last.cdi_device_ids.push(claim_device.clone());
            }
            x.cdi_device_ids = vec![claim_device];
        }
        out
    }
}

/// The plan for one device group, before anything is applied.
#[derive(Debug)]
pub(super) struct GroupPlan {
    pub(super) requests: Vec<String>,
    pub(super) devices: Vec<ClaimDevice>,
    /// What its strategy needs of the group's GPUs, makes for it and records.
    pub(super) strategy: Box<dyn GroupStrategy>,
}

impl GroupPlan {
    /// The group as its claim records it before anything is made.
    pub(super) fn planned(&self) -> Group {
        self.info(Applied {
            sharing: self.strategy.planned(),
        })
    }

    /// The group as its claim records it once `applied`.
    pub(super) fn info(&self, applied: Applied) -> Group {
        Group {
            requests: self.requests.clone(),
            devices: self.devices.clone(),
            sharing: applied.sharing,
        }
    }
}
