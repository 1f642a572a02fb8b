//! A claim resolved into per-group plans, touching nothing: devices found, configurations
//! checked, each group's config mapped onto its strategy (`strategy::group`: MPS directories
//! and limits computed, MIG slices resolved).

use std::collections::BTreeSet;

use gpushare_proto::ErrorCode;

use super::Service;
use crate::cdi;
use crate::claim::{Device, Group, PreparedDevice, Request};
use crate::config::Sharing;
use crate::config::{self, ClaimSpec};
use crate::error::ServiceError;
use crate::gpu::Gpu;
use crate::strategy::group::{Applied, GroupStrategy};
use crate::strategy::mps::default_shm_bytes;
use crate::strategy::mps::{self, MpsGroup};
use crate::strategy::{Exclusive, TimeSlicing};

impl Service {
    /// Resolves devices and configs into per-group plans, touching nothing; with the claim's
    /// attach limit (the lowest `replicas` of its configs).
    pub(super) fn plan(
        &self,
        spec: &ClaimSpec,
    ) -> Result<(Vec<GroupPlan>, Option<u32>), ServiceError> {
        let gpus = self.find_gpus(spec)?;
        let mut plans = Vec::new();
        let mut limit: Option<u32> = None;
        for group in &spec.groups {
            let mut devices: Vec<Device> = group
                .results
                .iter()
                .map(|&i| Device {
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
            let (sharing, replicas) = group_sharing(spec, group, &requests)?;
            if let Some(r) = replicas {
                limit = Some(limit.map_or(r, |l| l.min(r)));
            }
            let strategy =
                self.group_strategy(spec, group, &gpus, &sharing, &requests, &mut devices)?;
            plans.push(GroupPlan {
                requests,
                devices,
                strategy,
            });
        }
        Ok((plans, limit))
    }

    /// The GPU of each of the claim's results, in order: whole GPUs by device name, a MIG
    /// device's parent by its minor.
    ///
    /// # Errors
    /// A static MIG device by UUID (`Unsupported`), a device allocated twice
    /// (`InvalidRequest`), one the node does not have (`UnknownDevice`).
    fn find_gpus(&self, spec: &ClaimSpec) -> Result<Vec<&Gpu>, ServiceError> {
        let mut gpus: Vec<&Gpu> = Vec::with_capacity(spec.results.len());
        let mut seen = BTreeSet::new();
        let mut seen_names = BTreeSet::new();
        for r in &spec.results {
            let mig_name = crate::mig::MigDeviceName::parse(&r.device);
            if mig_name.is_none() && crate::strategy::mig::names_a_mig_device(&r.device) {
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
            let gpu = self.host.backend.find(&lookup).ok_or_else(|| {
                let known: Vec<String> = self
                    .host
                    .backend
                    .gpus()
                    .iter()
                    .map(Gpu::device_name)
                    .collect();
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

        Ok(gpus)
    }

    /// The plan of a group whose config is `sharing`, mapped onto its strategy (its GPUs
    /// checked first: whole GPUs for a whole-GPU strategy, MPS support for an MPS daemon). A
    /// MIG group's `devices` become its MIG devices, named canonically.
    fn group_strategy(
        &self,
        spec: &ClaimSpec,
        group: &config::DeviceGroup,
        gpus: &[&Gpu],
        sharing: &Sharing,
        requests: &[String],
        devices: &mut Vec<Device>,
    ) -> Result<Box<dyn GroupStrategy>, ServiceError> {
        if !matches!(sharing, Sharing::Mig { .. }) {
            for &i in &group.results {
                self.check_whole_gpu(gpus[i])?;
            }
        }
        let mps_settings = match sharing {
            Sharing::Mps { settings, .. } => Some(settings),
            Sharing::Mig { mps, .. } => mps.as_ref(),
            _ => None,
        };
        if let Some(settings) = mps_settings {
            for &i in &group.results {
                self.check_mps_support(gpus[i], settings)?;
            }
        }
        let strategy: Box<dyn GroupStrategy> = match sharing {
            Sharing::Exclusive => Box::new(Exclusive),
            Sharing::TimeSlicing { interval, .. } => Box::new(TimeSlicing {
                interval: *interval,
            }),
            Sharing::Mps { settings, .. } => {
                let uuids: Vec<String> = devices.iter().map(|d| d.uuid.clone()).collect();
                let launch = mps::plan_launch(
                    &spec.uid,
                    &self.claim_dir(&spec.uid),
                    &uuids,
                    requests,
                    settings,
                    self.shm_bytes(),
                )?;
                Box::new(MpsGroup { launch })
            }
            Sharing::Mig { profile, mps } => {
                let mig = self.plan_mig(
                    spec,
                    &group.results,
                    profile.as_deref(),
                    mps.as_ref(),
                    requests,
                )?;
                *devices = mig
                    .targets
                    .iter()
                    .map(|t| Device {
                        request: t.request.clone(),
                        device: t.device.clone(),
                        uuid: t.gpu_uuid.clone(),
                        minor: t.gpu_minor,
                    })
                    .collect();
                Box::new(mig)
            }
        };
        Ok(strategy)
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
            .map_err(|e| ServiceError::new(ErrorCode::Unsupported, e.to_string()))
    }

    /// The size of each MPS group's shm tmpfs, in bytes: `[mps] shm_size_mib` or half the host's
    /// memory.
    pub(super) fn shm_bytes(&self) -> u64 {
        self.cfg
            .shm_bytes
            .unwrap_or_else(|| default_shm_bytes(self.host.mps.ops().machine.mem_total_kib()))
    }

    pub(super) fn request_devices(&self, spec: &ClaimSpec) -> Vec<Request> {
        let mut out: Vec<Request> = Vec::new();
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
                None => out.push(Request {
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
    pub(super) devices: Vec<Device>,
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

/// A group's config as it applies to its devices, with its `replicas`: MIG devices get MIG
/// whatever the config says (no config: the slice alone; MPS: a daemon on the slice).
///
/// # Errors
/// MIG devices and whole GPUs under one config (`InvalidRequest`), time-slicing of MIG
/// devices (`InvalidConfig`).
fn group_sharing(
    spec: &ClaimSpec,
    group: &config::DeviceGroup,
    requests: &[String],
) -> Result<(Sharing, Option<u32>), ServiceError> {
    let migs = group
        .results
        .iter()
        .filter(|&&i| crate::mig::MigDeviceName::parse(&spec.results[i].device).is_some())
        .count();
    let replicas = match &group.sharing {
        Sharing::TimeSlicing { replicas, .. } | Sharing::Mps { replicas, .. } => *replicas,
        Sharing::Exclusive | Sharing::Mig { .. } => None,
    };
    if migs == 0 {
        return Ok((group.sharing.clone(), replicas));
    }
    if migs != group.results.len() {
        return Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!(
                "request(s) {} mix MIG devices and whole GPUs under one config",
                requests.join(", ")
            ),
        ));
    }
    let sharing = match &group.sharing {
        Sharing::Exclusive => Sharing::Mig {
            profile: None,
            mps: None,
        },
        Sharing::Mps { settings, .. } => Sharing::Mig {
            profile: None,
            mps: Some(settings.clone()),
        },
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
    };
    Ok((sharing, replicas))
}
