//! A claim resolved into per-group plans, touching nothing: its devices found on the node,
//! then each group handed to its strategy's planning (`strategy::select::plan`: MPS
//! directories and limits computed, MIG slices resolved).

use std::collections::BTreeSet;

use gpushare_proto::ErrorCode;

use super::Service;
use crate::cdi;
use crate::claim::{Device, Group, PreparedDevice, Request};
use crate::config::{ClaimSpec, DeviceGroup};
use crate::error::ServiceError;
use crate::gpu::Gpu;
use crate::strategy::group::{Applied, GroupStrategy};
use crate::strategy::mps::default_shm_bytes;
use crate::strategy::select::{self, GroupAsk, Planning};

impl Service {
    /// Resolves devices and configs into per-group plans, touching nothing; with the claim's
    /// attach limit (the lowest `replicas` of its configs).
    pub(super) fn plan(
        &self,
        spec: &ClaimSpec,
    ) -> Result<(Vec<GroupPlan>, Option<u32>), ServiceError> {
        let gpus = self.find_gpus(spec)?;
        let claim_dir = self.claim_dir(&spec.uid);
        let planning = Planning {
            backend: self.host.backend.as_ref(),
            claims: self,
            claim_dir: &claim_dir,
            shm_bytes: self.shm_bytes(),
        };
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
            let requests = group_requests(spec, group);
            let group_gpus: Vec<&Gpu> = group.results.iter().map(|&i| gpus[i]).collect();
            let ask = GroupAsk {
                spec,
                results: &group.results,
                gpus: &group_gpus,
                requests: &requests,
                devices: &devices,
            };
            let planned = select::plan(&planning, &ask, &group.sharing)?;
            if let Some(r) = planned.replicas {
                limit = Some(limit.map_or(r, |l| l.min(r)));
            }
            plans.push(GroupPlan {
                requests,
                devices: planned.devices,
                strategy: planned.strategy,
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

/// The requests of `group`'s results, in order of first appearance.
pub(super) fn group_requests(spec: &ClaimSpec, group: &DeviceGroup) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in group.results.iter().filter_map(|&i| spec.results.get(i)) {
        if !names.contains(&r.request) {
            names.push(r.request.clone());
        }
    }
    names
}
