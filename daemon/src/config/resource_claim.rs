//! Whole `ResourceClaim` objects (`resource.k8s.io` v1, v1beta1, v1beta2) as the API server
//! returns them, in JSON or YAML.
//!
//! The claim object is read tolerantly (the API server adds `managedFields` and other fields we
//! do not need); only the opaque sharing parameters of our drivers are decoded strictly. Configs
//! are matched to allocation results the way NVIDIA's DRA driver does it: claim configs rank
//! above class configs, later entries above earlier ones, a config naming the result's request
//! wins, and a config without `requests` applies when its kind fits the device type.
//!
//! Here: the claim object reduced to a [`ClaimSpec`] (its type, allocation results and the
//! configs that apply to them); parsing the document is in `resource_claim/document.rs`, the
//! rules for UIDs and device and request names in `resource_claim/names.rs`, the config
//! entries and their parameters in `resource_claim/entries.rs`.

mod document;
mod entries;
mod names;

use gpushare_proto::ErrorCode;
use serde_json::Value;

use super::value::{index, join, show, show_str, Obj};
use super::{AllocatedDevice, ClaimSpec, ConfigError, DeviceGroup, ParseContext, Sharing};
use entries::config_entries;

pub use document::parse_claim_document;
pub use entries::{parse_parameters, ConfigKind};
pub(crate) use names::is_request_name;
pub use names::{claim_uid_problem, is_mig_device, validate_claim_uid, MAX_CLAIM_UID_BYTES};

/// `apiVersion` values of a `ResourceClaim` that are understood.
pub const CLAIM_API_VERSIONS: &[&str] = &[
    "resource.k8s.io/v1",
    "resource.k8s.io/v1beta1",
    "resource.k8s.io/v1beta2",
];

/// Reduces a `ResourceClaim` (as a JSON value) to what the daemon acts on.
///
/// Refusals: a malformed claim, a bad UID or a claim with no allocation for our drivers →
/// `InvalidRequest`; an allocation result for another pool than `ctx.node_name` → `WrongNode`;
/// a bad sharing config → `InvalidConfig`; a config kind gpushare does not serve →
/// `Unsupported`. Device names are passed through unchecked (the daemon checks they exist).
pub fn parse_claim(claim: &Value, ctx: &ParseContext) -> Result<ClaimSpec, ConfigError> {
    let root = Obj::new(claim, "", ErrorCode::InvalidRequest).map_err(|_| {
        ConfigError::invalid_request(format!(
            "a ResourceClaim must be an object, got {}",
            show(claim)
        ))
    })?;
    check_type(root)?;

    let metadata = root
        .opt_obj("metadata", "metadata")?
        .ok_or_else(|| root.err("metadata.uid", "is required"))?;
    let uid = metadata.req_str("uid")?;
    validate_claim_uid(uid)?;
    let name = metadata.opt_str("name")?.unwrap_or_default();
    let namespace = metadata.opt_str("namespace")?.unwrap_or_default();
    let who = if name.is_empty() {
        format!("claim {uid}")
    } else {
        format!("claim {namespace}/{name} ({uid})")
    };

    let devices = allocation_devices(root, &who)?;
    let results = our_results(devices, ctx, &who)?;
    let entries = config_entries(root, devices, ctx)?;

    // Highest precedence first: claim configs above class configs, later above earlier.
    let mut ranked: Vec<usize> = (0..entries.len()).collect();
    ranked.sort_by_key(|&i| {
        let e = &entries[i];
        std::cmp::Reverse((e.source, e.position))
    });

    // For each result, the index of the entry that applies (None: no config).
    let mut chosen: Vec<Option<usize>> = Vec::with_capacity(results.len());
    for (result_path, result) in &results {
        let mig = is_mig_device(&result.device);
        let mut pick = None;
        for &i in &ranked {
            let entry = &entries[i];
            if entry.names(&result.request) {
                if !entry.kind.fits(mig) {
                    return Err(ConfigError::invalid_config(format!(
                        "{}: cannot apply {} to device {} of type {} (request {}, {result_path})",
                        entry.path,
                        entry.kind.as_str(),
                        result.device,
                        if mig { "mig" } else { "gpu" },
                        show_str(&result.request)
                    )));
                }
                pick = Some(i);
                break;
            }
            if entry.requests.is_empty() && entry.kind.fits(mig) {
                pick = Some(i);
                break;
            }
        }
        chosen.push(pick);
    }

    let mut groups: Vec<(Option<usize>, DeviceGroup)> = Vec::new();
    for (result_index, entry_index) in chosen.iter().enumerate() {
        if let Some((_, group)) = groups.iter_mut().find(|(k, _)| k == entry_index) {
            group.results.push(result_index);
            continue;
        }
        let sharing = entry_index
            .and_then(|i| entries.get(i))
            .map_or(Sharing::Exclusive, |e| e.sharing.clone());
        groups.push((
            *entry_index,
            DeviceGroup {
                results: vec![result_index],
                sharing,
            },
        ));
    }

    Ok(ClaimSpec {
        uid: uid.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        results: results.into_iter().map(|(_, r)| r).collect(),
        groups: groups.into_iter().map(|(_, g)| g).collect(),
    })
}

/// Checks `apiVersion` and `kind` of the claim object.
fn check_type(root: Obj<'_>) -> Result<(), ConfigError> {
    let api_version = root.opt_str("apiVersion")?;
    if !api_version.is_some_and(|v| CLAIM_API_VERSIONS.contains(&v)) {
        return Err(root.err(
            "apiVersion",
            format!(
                "expected one of {} for a ResourceClaim, got {}",
                CLAIM_API_VERSIONS.join(", "),
                api_version.map_or_else(|| "nothing".to_owned(), show_str)
            ),
        ));
    }
    match root.opt_str("kind")? {
        Some("ResourceClaim") => Ok(()),
        other => Err(root.err(
            "kind",
            format!(
                "expected \"ResourceClaim\", got {}",
                other.map_or_else(|| "nothing".to_owned(), show_str)
            ),
        )),
    }
}

/// `status.allocation.devices`, or "not allocated".
fn allocation_devices<'a>(root: Obj<'a>, who: &str) -> Result<Obj<'a>, ConfigError> {
    let not_allocated = |missing: &str| {
        ConfigError::invalid_request(format!("{who} is not allocated ({missing} is missing)"))
    };
    let status = root
        .opt_obj("status", "status")?
        .ok_or_else(|| not_allocated("status"))?;
    let allocation = status
        .opt_obj("allocation", "status.allocation")?
        .ok_or_else(|| not_allocated("status.allocation"))?;
    allocation
        .opt_obj("devices", "status.allocation.devices")?
        .ok_or_else(|| not_allocated("status.allocation.devices"))
}

/// Allocation results of our drivers with their JSON paths, in allocation order.
fn our_results(
    devices: Obj<'_>,
    ctx: &ParseContext,
    who: &str,
) -> Result<Vec<(String, AllocatedDevice)>, ConfigError> {
    let Some(results) = devices.opt_list("results")? else {
        return Err(ConfigError::invalid_request(format!(
            "{who} is not allocated (status.allocation.devices.results is missing)"
        )));
    };
    let list_path = join(devices.path, "results");
    let mut ours = Vec::new();
    for (i, value) in results.iter().enumerate() {
        let path = index(&list_path, i);
        let result = Obj::new(value, &path, ErrorCode::InvalidRequest)?;
        let driver = result.req_str("driver")?;
        if !ctx.drivers.iter().any(|d| d == driver) {
            continue;
        }
        let field = |name: &str| -> Result<String, ConfigError> {
            let v = result.req_str(name)?;
            if v.is_empty() {
                return Err(result.err(name, "must not be empty"));
            }
            Ok(v.to_owned())
        };
        let device = AllocatedDevice {
            request: field("request")?,
            driver: driver.to_owned(),
            pool: field("pool")?,
            device: field("device")?,
        };
        if !is_request_name(&device.request) {
            return Err(result.err(
                "request",
                "must be a DNS label (lower-case letters, digits, '-', at most 63) or <request>/<subrequest>",
            ));
        }
        if device.pool != ctx.node_name {
            return Err(ConfigError::new(
                ErrorCode::WrongNode,
                format!(
                    "{}: device {} is allocated from pool {}, but this node is {}",
                    join(&path, "pool"),
                    device.device,
                    show_str(&device.pool),
                    show_str(&ctx.node_name)
                ),
            ));
        }
        ours.push((path, device));
    }
    if ours.is_empty() {
        return Err(ConfigError::invalid_request(format!(
            "{who}: no device allocated by driver {} in status.allocation.devices.results",
            ctx.drivers.join(" or ")
        )));
    }
    Ok(ours)
}
