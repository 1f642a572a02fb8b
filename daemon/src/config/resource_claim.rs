//! Whole `ResourceClaim` objects (`resource.k8s.io` v1, v1beta1, v1beta2) as the API server
//! returns them, in JSON or YAML.
//!
//! The claim object is read tolerantly (the API server adds `managedFields` and other fields we
//! do not need); only the opaque sharing parameters of our drivers are decoded strictly. Configs
//! are matched to allocation results the way NVIDIA's DRA driver does it: claim configs rank
//! above class configs, later entries above earlier ones, a config naming the result's request
//! wins, and a config without `requests` applies when its kind fits the device type.

use gpushare_proto::ErrorCode;
use serde_json::Value;

use super::nvidia::{parse_nvidia, NvidiaKind};
use super::short::parse_short;
use super::value::{index, join, show, show_str, Obj};
use super::{AllocatedDevice, ClaimSpec, ConfigError, DeviceGroup, ParseContext, Sharing};

/// `apiVersion` values of a `ResourceClaim` that are understood.
pub const CLAIM_API_VERSIONS: &[&str] = &[
    "resource.k8s.io/v1",
    "resource.k8s.io/v1beta1",
    "resource.k8s.io/v1beta2",
];

/// Longest claim UID accepted, in bytes.
pub const MAX_CLAIM_UID_BYTES: usize = 128;

/// Parses a claim document that is JSON or YAML into a JSON value.
///
/// JSON is tried first (its error messages are better); YAML (through `serde_norway`) second.
/// When both fail the message of the parser that fits the text best is returned. Refusals carry
/// `InvalidRequest`.
pub fn parse_claim_document(text: &str) -> Result<Value, ConfigError> {
    if text.trim().is_empty() {
        return Err(ConfigError::invalid_request(
            "claim document is empty (expected a ResourceClaim in JSON or YAML)",
        ));
    }
    let json_err = match serde_json::from_str::<Value>(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    match serde_norway::from_str::<serde_norway::Value>(text) {
        Ok(v) => {
            // JSON has no NaN or infinity: converted, they would turn into null and read as
            // "field absent", silently dropping what the user wrote.
            if let Some(path) = non_finite_number(&v, String::new()) {
                return Err(ConfigError::invalid_request(format!(
                    "claim document: {path}: not a finite number"
                )));
            }
            serde_json::to_value(v).map_err(|e| {
                ConfigError::invalid_request(format!("claim document cannot be read as JSON: {e}"))
            })
        }
        Err(yaml_err) => {
            let looks_like_json = text.trim_start().starts_with(['{', '[']);
            Err(ConfigError::invalid_request(if looks_like_json {
                format!("claim document is not valid JSON: {json_err}")
            } else {
                format!("claim document is not valid YAML: {yaml_err}")
            }))
        }
    }
}

/// The path of the first NaN or infinite number in a YAML document, if any.
fn non_finite_number(v: &serde_norway::Value, path: String) -> Option<String> {
    use serde_norway::Value as Y;
    match v {
        Y::Number(n) if n.is_nan() || n.is_infinite() => Some(if path.is_empty() {
            "(document)".into()
        } else {
            path
        }),
        Y::Sequence(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| non_finite_number(item, format!("{path}[{i}]"))),
        Y::Mapping(map) => map.iter().find_map(|(k, item)| {
            let key = k.as_str().map_or_else(|| format!("{k:?}"), str::to_string);
            let child = if path.is_empty() {
                key
            } else {
                format!("{path}.{key}")
            };
            non_finite_number(item, child)
        }),
        Y::Tagged(t) => non_finite_number(&t.value, path),
        _ => None,
    }
}

/// Checks a claim UID (`metadata.uid`) before it is used in paths and CDI device names:
/// 1–128 bytes of ASCII letters, digits, `-`, `_` and `.`, starting and ending with a letter or
/// a digit. Refusals carry `InvalidRequest` and name `metadata.uid` and the value.
pub fn validate_claim_uid(uid: &str) -> Result<(), ConfigError> {
    match claim_uid_problem(uid) {
        None => Ok(()),
        Some(why) => Err(ConfigError::invalid_request(format!(
            "metadata.uid: {} {why}",
            show_str(uid)
        ))),
    }
}

/// What is wrong with `uid` as a claim UID (the rules of [`validate_claim_uid`]), e.g.
/// `contains '/' (only …)`, for callers that name the value their own way (a request's `uid`
/// parameter, a command-line argument); `None` when it is a valid one.
pub fn claim_uid_problem(uid: &str) -> Option<String> {
    if uid.is_empty() {
        return Some("is empty".into());
    }
    if uid.len() > MAX_CLAIM_UID_BYTES {
        return Some(format!(
            "is {} bytes long (at most {MAX_CLAIM_UID_BYTES})",
            uid.len()
        ));
    }
    if let Some(c) = uid
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!(
            "contains {c:?} (only ASCII letters, digits, '-', '_' and '.' are allowed)"
        ));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(uid.chars().next()) || !edge_ok(uid.chars().last()) {
        return Some("must start and end with a letter or a digit".into());
    }
    None
}

/// Whether a device name is a MIG device: `gpu-<minor>-mig-…` as NVIDIA's DRA driver names
/// dynamic MIG slices, or a MIG UUID (`MIG-…`).
pub fn is_mig_device(name: &str) -> bool {
    if name.starts_with("MIG-") {
        return true;
    }
    let Some(rest) = name.strip_prefix("gpu-") else {
        return false;
    };
    let minor_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    minor_len > 0 && rest[minor_len..].starts_with("-mig-")
}

/// Which of the three parameter shapes a config is, which decides the devices it fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    /// NVIDIA `GpuConfig`: full GPUs only.
    GpuConfig,
    /// NVIDIA `MigDeviceConfig`: MIG devices only.
    MigDeviceConfig,
    /// Short form (`sharingMode`): any device.
    Short,
}

impl ConfigKind {
    /// Whether a config of this kind applies to a device of this type (MIG or not).
    pub fn fits(self, mig: bool) -> bool {
        match self {
            ConfigKind::GpuConfig => !mig,
            ConfigKind::MigDeviceConfig => mig,
            ConfigKind::Short => true,
        }
    }

    /// Name used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::GpuConfig => "GpuConfig",
            ConfigKind::MigDeviceConfig => "MigDeviceConfig",
            ConfigKind::Short => "short-form config",
        }
    }
}

/// Decodes opaque parameters found at `path`: NVIDIA's form when they carry `apiVersion` or
/// `kind`, else the short form. Refusals: `InvalidConfig`, or `Unsupported` for NVIDIA kinds
/// gpushare does not serve.
pub fn parse_parameters(
    parameters: &Value,
    path: &str,
) -> Result<(ConfigKind, Sharing), ConfigError> {
    let params = Obj::new(parameters, path, ErrorCode::InvalidConfig)?;
    if params.map.contains_key("apiVersion") || params.map.contains_key("kind") {
        let (kind, sharing) = parse_nvidia(params, path)?;
        let kind = match kind {
            NvidiaKind::GpuConfig => ConfigKind::GpuConfig,
            NvidiaKind::MigDeviceConfig => ConfigKind::MigDeviceConfig,
        };
        Ok((kind, sharing))
    } else {
        Ok((ConfigKind::Short, parse_short(params)?))
    }
}

/// Where a config entry came from; claim configs rank above class configs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    FromClass,
    FromClaim,
}

/// One config entry of our drivers, decoded.
#[derive(Debug)]
struct ConfigEntry {
    /// JSON path of the entry (`status.allocation.devices.config[2]`).
    path: String,
    source: Source,
    /// Position in its list; later entries rank higher within one source.
    position: usize,
    /// Requests it is limited to; empty means all.
    requests: Vec<String>,
    kind: ConfigKind,
    sharing: Sharing,
}

impl ConfigEntry {
    /// Whether the entry names `request` (`name`, or the parent of `name/sub`).
    fn names(&self, request: &str) -> bool {
        let parent = request.split_once('/').map_or(request, |(p, _)| p);
        self.requests.iter().any(|r| r == request || r == parent)
    }
}

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

/// A request name as Kubernetes allows it: a DNS label, or `<request>/<subrequest>` for a
/// prioritized-list alternative. Names end up in CDI device names, so nothing else may pass.
pub(crate) fn is_request_name(name: &str) -> bool {
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let mut parts = name.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), None, None) => label(a),
        (Some(a), Some(b), None) => label(a) && label(b),
        _ => false,
    }
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

/// Every config entry of our drivers, decoded: from `status.allocation.devices.config`, or when
/// that is absent from `spec.devices.config` (all `FromClaim`). Entries without `opaque` or for
/// other drivers are skipped; every entry of ours must decode, whether it applies or not (as
/// NVIDIA's admission webhook validates them all).
fn config_entries(
    root: Obj<'_>,
    devices: Obj<'_>,
    ctx: &ParseContext,
) -> Result<Vec<ConfigEntry>, ConfigError> {
    let (list, list_path, from_status) = match devices.opt_list("config")? {
        Some(list) => (list, join(devices.path, "config"), true),
        None => {
            let spec_list = root
                .opt_obj("spec", "spec")?
                .map(|spec| spec.opt_obj("devices", "spec.devices"))
                .transpose()?
                .flatten()
                .map(|d| d.opt_list("config"))
                .transpose()?
                .flatten();
            match spec_list {
                Some(list) => (list, "spec.devices.config".to_owned(), false),
                None => return Ok(Vec::new()),
            }
        }
    };
    let mut entries = Vec::new();
    for (position, value) in list.iter().enumerate() {
        let path = index(&list_path, position);
        let entry = Obj::new(value, &path, ErrorCode::InvalidRequest)?;
        let opaque_path = join(&path, "opaque");
        let Some(opaque) = entry.opt_obj("opaque", &opaque_path)? else {
            continue;
        };
        let driver = opaque.req_str("driver")?;
        if !ctx.drivers.iter().any(|d| d == driver) {
            continue;
        }
        let source = if from_status {
            match entry.req_str("source")? {
                "FromClaim" => Source::FromClaim,
                "FromClass" => Source::FromClass,
                other => {
                    return Err(entry.err(
                        "source",
                        format!(
                            "expected \"FromClaim\" or \"FromClass\", got {}",
                            show_str(other)
                        ),
                    ))
                }
            }
        } else {
            Source::FromClaim
        };
        let mut requests = Vec::new();
        for (j, r) in entry
            .opt_list("requests")?
            .into_iter()
            .flatten()
            .enumerate()
        {
            match r {
                Value::String(s) => requests.push(s.clone()),
                other => {
                    return Err(ConfigError::invalid_request(format!(
                        "{}: expected a request name, got {}",
                        index(&join(&path, "requests"), j),
                        show(other)
                    )))
                }
            }
        }
        let parameters_path = join(&opaque_path, "parameters");
        let Some(parameters) = opaque.get("parameters") else {
            return Err(ConfigError::invalid_config(format!(
                "{parameters_path}: is required for driver {}",
                show_str(driver)
            )));
        };
        let (kind, sharing) = parse_parameters(parameters, &parameters_path)?;
        entries.push(ConfigEntry {
            path,
            source,
            position,
            requests,
            kind,
            sharing,
        });
    }
    Ok(entries)
}
