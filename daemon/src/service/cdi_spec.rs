//! A claim CDI spec: written from its groups, its device nodes checked against the host, its
//! IDs resolved against the NVIDIA driver spec as the CDI library reads them.

use gpushare_proto::ErrorCode;

use super::plan::GroupPlan;
use super::Service;
use crate::cdi::{self, ContainerEdits};
use crate::claim::{Claim, Group, Phase, PreparedDevice, Request};
use crate::error::ServiceError;
use crate::gpu::nodes::NodeProblem;
use crate::strategy::mig::driver_name_of;

/// Device nodes a claim's CDI spec names that the host lacks ([`Service::check_nodes`]): one
/// line naming every such node, and how the driver creates them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}; containers cannot be given a device node the host lacks (the NVIDIA driver creates them: nvidia-modprobe, or nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules)", listed(problems))]
pub struct MissingNodes {
    /// Every node that failed its check, in order.
    pub problems: Vec<NodeProblem>,
}

fn listed(problems: &[NodeProblem]) -> String {
    let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
    list.join("; ")
}

/// Why a claim's CDI device IDs would not work in its containers ([`Service::verify_cdi`]).
#[derive(Debug, thiserror::Error)]
pub enum CdiCheckError {
    /// The claim's or the driver's spec cannot be loaded as the runtime reads it (or two
    /// specs define one device).
    #[error(transparent)]
    Spec(gpushare_cdi::RegistryError),
    /// A request's IDs do not all resolve against those specs.
    #[error("request {request}: {source}")]
    Unresolved {
        /// The request's name.
        request: String,
        /// The IDs that do not resolve.
        #[source]
        source: gpushare_cdi::ResolveError,
    },
    /// A device node the resolved edits name is missing on the host.
    #[error(transparent)]
    Nodes(#[from] MissingNodes),
}

impl Service {
    pub(super) fn write_cdi(
        &self,
        uid: &str,
        groups: &[Group],
        info: &Claim,
    ) -> Result<(), ServiceError> {
        let mut devices = Vec::new();
        for req in &info.requests {
            let mut edits = cdi::claim_env_edits();
            for node in self.host.backend.control_device_nodes() {
                cdi::merge(&mut edits, crate::strategy::group::node_edit(&node));
            }
            // What each group's strategy gives the request's containers.
            for g in groups {
                let group_edits =
                    crate::strategy::life_of(g).edits(self.host.backend.as_ref(), g, &req.request);
                cdi::merge(&mut edits, group_edits);
            }
            edits.hooks = cdi::claim_hooks(&self.cfg.hook, uid);
            let name = cdi::device_name(uid, &req.request, info.requests.len() == 1);
            devices.push((name, edits));
        }
        let cdi_spec = cdi::build_spec(devices);
        self.check_nodes(cdi_spec.devices.iter().map(|d| &d.container_edits))
            .map_err(|problems| ServiceError::internal(format!("claim {uid}: {problems}")))?;
        cdi::write_spec(&self.cfg.cdi_dir, uid, &cdi_spec).map_err(|e| {
            ServiceError::internal(format!(
                "writing CDI spec for claim {uid} into {}: {e}",
                self.cfg.cdi_dir.display()
            ))
        })?;
        Ok(())
    }

    /// Checks that every device node `edits` name exists on the host as the device the driver
    /// gives it (see [`crate::gpu::nodes`]).
    ///
    /// # Errors
    /// [`MissingNodes`], naming every node that does not.
    pub(super) fn check_nodes<'a>(
        &self,
        edits: impl IntoIterator<Item = &'a ContainerEdits>,
    ) -> Result<(), MissingNodes> {
        let nodes: Vec<cdi::DeviceNode> = edits
            .into_iter()
            .flat_map(|e| e.device_nodes.iter().cloned())
            .collect();
        crate::gpu::nodes::check_device_nodes(
            &nodes,
            self.host.devices.as_ref(),
            &self.host.backend.device_majors(),
        )
        .map_err(|problems| MissingNodes { problems })
    }

    /// Checks, against the claim's spec and the driver's as the runtime will read them, that
    /// every CDI device ID of `requests` resolves and every device node they name exists
    /// (see [`Service::check_nodes`]).
    ///
    /// # Errors
    /// [`CdiCheckError`]: the first thing found wrong, in one line.
    pub(super) fn verify_cdi(&self, uid: &str, requests: &[Request]) -> Result<(), CdiCheckError> {
        let mut files = Vec::new();
        if let Some(d) = &self.cfg.driver_spec {
            files.push(d.spec_path());
        }
        files.push(cdi::spec_path(&self.cfg.cdi_dir, uid));
        let mut registry = gpushare_cdi::Registry::load_files(&files);
        if let Some(e) = registry.take_errors().into_values().flatten().next() {
            return Err(CdiCheckError::Spec(e));
        }
        for x in requests {
            let edits = registry.resolve(&x.cdi_device_ids).map_err(|source| {
                CdiCheckError::Unresolved {
                    request: x.request.clone(),
                    source,
                }
            })?;
            self.check_nodes([&edits])?;
        }
        Ok(())
    }

    /// The CDI device IDs of each prepared device of `requests`: the driver spec's device of
    /// its GPU (`GPU-<uuid>`) or MIG device (`MIG-<uuid>`, from the group's MIG records, in
    /// allocation order) first, when there is a driver spec, and on the request's last device
    /// the claim's device; `cdi_device_ids` is the same, flattened.
    ///
    /// # Errors
    /// The driver spec cannot be had, or lacks a device.
    pub(super) fn prepared_requests(
        &self,
        uid: &str,
        groups: &[Group],
        requests: &[Request],
    ) -> Result<Vec<Request>, crate::driver_spec::DriverSpecError> {
        self.prepared_requests_with(uid, groups, requests, DriverLookup::MayGenerate)
    }

    /// [`Service::prepared_requests`], with the driver spec's devices looked up as `lookup`
    /// says.
    pub(super) fn prepared_requests_with(
        &self,
        uid: &str,
        groups: &[Group],
        requests: &[Request],
        lookup: DriverLookup,
    ) -> Result<Vec<Request>, crate::driver_spec::DriverSpecError> {
        let mut out = self.bare_requests(requests);
        if let Some(driver) = &self.cfg.driver_spec {
            let (wanted, slots) = self.driver_devices_wanted(groups, &out)?;
            let ids = match lookup {
                DriverLookup::MayGenerate => driver.device_ids(&wanted)?,
                DriverLookup::InstalledOnly => driver.installed_ids(&wanted)?,
            };
            for ((ri, di), id) in slots.into_iter().zip(ids) {
                out[ri].per_device[di].cdi_device_ids.push(id);
            }
        }
        let single = requests.len() == 1;
        for x in &mut out {
            let claim_device = cdi::qualified_name(&cdi::device_name(uid, &x.request, single));
            // The claim device serves the whole request: on its last device only.
            if let Some(last) = x.per_device.last_mut() {
                last.cdi_device_ids.push(claim_device);
            }
            x.cdi_device_ids = x
                .per_device
                .iter()
                .flat_map(|d| d.cdi_device_ids.iter().cloned())
                .collect();
        }
        Ok(out)
    }

    /// `requests` with every prepared device listed (records of daemons older than
    /// `per_device` have only the device names) and no CDI device ID yet.
    fn bare_requests(&self, requests: &[Request]) -> Vec<Request> {
        let mut out = requests.to_vec();
        for x in &mut out {
            if x.per_device.is_empty() {
                x.per_device = x
                    .devices
                    .iter()
                    .map(|d| PreparedDevice {
                        device: d.clone(),
                        pool: self.cfg.node_name.clone(),
                        cdi_device_ids: Vec::new(),
                    })
                    .collect();
            }
            for d in &mut x.per_device {
                d.cdi_device_ids.clear();
            }
        }
        out
    }

    /// The driver spec's device (name, UUID) of each prepared device of `requests`, with
    /// where its ID goes (request, device): a whole GPU's, or the MIG device the group's
    /// slices record in allocation order.
    ///
    /// # Errors
    /// A device that is no GPU or MIG device of this node.
    #[allow(clippy::type_complexity)]
    fn driver_devices_wanted(
        &self,
        groups: &[Group],
        requests: &[Request],
    ) -> Result<(Vec<(String, String)>, Vec<(usize, usize)>), crate::driver_spec::DriverSpecError>
    {
        let mut wanted: Vec<(String, String)> = Vec::new();
        let mut slots: Vec<(usize, usize)> = Vec::new();
        for (ri, x) in requests.iter().enumerate() {
            let migs: Vec<&crate::claim::MigSlice> = groups
                .iter()
                .flat_map(|g| g.slices())
                .filter(|m| m.request == x.request)
                .collect();
            for (di, d) in x.per_device.iter().enumerate() {
                let device = if migs.is_empty() {
                    self.host
                        .backend
                        .find(&d.device)
                        .map(|g| (g.device_name(), g.uuid.clone()))
                } else {
                    // A slice made again keeps the name its claim's IDs were handed out
                    // with: the driver's spec has it as an alias of the new device.
                    migs.get(di)
                        .filter(|m| !m.uuid.is_empty())
                        .map(|m| (m.device.clone(), driver_name_of(m).to_string()))
                };
                let device = device.ok_or_else(|| {
                    crate::driver_spec::DriverSpecError::Failed(format!(
                        "no GPU or MIG device of this node is device {} of request {}",
                        d.device, x.request
                    ))
                })?;
                wanted.push(device);
                slots.push((ri, di));
            }
        }
        Ok((wanted, slots))
    }

    /// Refuses, before anything is changed, a claim whose whole GPUs the driver's spec has
    /// no device for, or any claim on a node without the toolkit.
    pub(super) fn check_driver_devices(
        &self,
        uid: &str,
        plans: &[GroupPlan],
    ) -> Result<(), ServiceError> {
        let Some(driver) = &self.cfg.driver_spec else {
            return Ok(());
        };
        let mut wanted: Vec<(String, String)> = Vec::new();
        for p in plans {
            // MIG devices are checked once they exist.
            if p.strategy.whole_gpu().is_none() {
                continue;
            }
            for d in &p.devices {
                if let Some(gpu) = self.host.backend.find(&d.uuid) {
                    wanted.push((gpu.device_name(), gpu.uuid.clone()));
                }
            }
        }
        if wanted.is_empty() {
            // A MIG-only claim still needs the toolkit; its slice's device is looked up, with
            // a generation, once the slice exists: this check runs none (a prepare waits on
            // one generation at most).
            driver.usable()
        } else {
            driver.device_ids(&wanted).map(|_| ())
        }
        .map_err(|e| driver_spec_error(uid, e))
    }

    /// Generates the driver's CDI spec again (after a MIG change, at start), with the names
    /// recreated slices keep; a failure is logged (by the driver spec, once per attempt), and
    /// claims that need the spec are refused until it works.
    pub(crate) fn regenerate_driver_spec(&self, when: &str) {
        if let Some(d) = &self.cfg.driver_spec {
            self.sync_driver_aliases();
            if let Err(e) = d.refresh() {
                tracing::debug!(error = %e, when, "the NVIDIA driver's CDI spec was not generated");
            }
        }
    }

    /// Gives the driver's spec the names the claims' recreated MIG slices keep: for each
    /// slice of a prepared (or degraded) claim that was made again, its first MIG UUID as an
    /// alias of its device now. A released claim's (`Unpreparing`) go with the next install.
    pub(super) fn sync_driver_aliases(&self) {
        let Some(d) = &self.cfg.driver_spec else {
            return;
        };
        let aliases = driver_aliases(self.state().claims.values());
        if let Err(e) = d.set_aliases(aliases) {
            tracing::error!(error = %e, "installing the driver's CDI spec with the names of recreated MIG slices");
        }
    }

    /// Records `requests` as a prepared claim's CDI device IDs (they changed under it: its MIG
    /// device was made again with a new UUID).
    pub(super) fn record_requests(
        &self,
        uid: &str,
        requests: &[Request],
    ) -> Result<(), ServiceError> {
        let mut st = self.state();
        if let Some(c) = st.claims.get_mut(uid) {
            c.requests = requests.to_vec();
        }
        self.commit(st)
    }
}

/// How [`Service::prepared_requests_with`] looks up the driver spec's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DriverLookup {
    /// A device the installed spec lacks makes it generate once
    /// ([`crate::driver_spec::DriverSpecs::device_ids`]): a prepare's.
    MayGenerate,
    /// In the installed spec only ([`crate::driver_spec::DriverSpecs::installed_ids`]): the
    /// start's, which generated it once after making every slice again.
    InstalledOnly,
}

/// The aliases (old name → device now) the driver's spec needs for `claims`: every slice of
/// a prepared or degraded claim that was made again and exists now.
pub(super) fn driver_aliases<'a>(
    claims: impl IntoIterator<Item = &'a Claim>,
) -> std::collections::BTreeMap<String, String> {
    claims
        .into_iter()
        .filter(|c| matches!(c.phase, Phase::Prepared | Phase::Degraded))
        .flat_map(|c| c.groups.iter().flat_map(|g| g.slices()))
        .filter(|m| !m.original_uuid.is_empty() && !m.uuid.is_empty() && m.original_uuid != m.uuid)
        .map(|m| (m.original_uuid.clone(), m.uuid.clone()))
        .collect()
}

/// A driver-spec failure as a prepare's answer: `Unsupported` on a node without the toolkit,
/// `Internal` otherwise; one line.
pub(super) fn driver_spec_error(uid: &str, e: crate::driver_spec::DriverSpecError) -> ServiceError {
    let code = match e {
        crate::driver_spec::DriverSpecError::NotInstalled(_) => ErrorCode::Unsupported,
        _ => ErrorCode::Internal,
    };
    ServiceError::new(code, format!("claim {uid}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one line a claim's error carries: every node, then how the driver creates them;
    /// an unresolved request keeps the CDI library's error as its source.
    #[test]
    fn check_errors_say_every_node_and_keep_the_cdi_error() {
        let node = |path: &str, problem: &str| NodeProblem {
            path: path.into(),
            host_path: path.into(),
            problem: problem.into(),
        };
        let e = MissingNodes {
            problems: vec![
                node("/dev/nvidia3", "does not exist"),
                node(
                    "/dev/nvidiactl",
                    "is a regular file, not a character device",
                ),
            ],
        };
        assert_eq!(
            e.to_string(),
            "device node /dev/nvidia3 does not exist; device node /dev/nvidiactl is a regular file, not a character device; containers cannot be given a device node the host lacks (the NVIDIA driver creates them: nvidia-modprobe, or nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules)"
        );
        let e = CdiCheckError::Unresolved {
            request: "gpu".into(),
            source: gpushare_cdi::ResolveError {
                unresolved: vec!["gpushare.io/gpu=GPU-x".into()],
            },
        };
        assert_eq!(
            e.to_string(),
            "request gpu: unresolvable CDI devices gpushare.io/gpu=GPU-x"
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
