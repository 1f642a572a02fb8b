//! The config entries of a claim for our drivers, decoded, with the kind of parameters each
//! carries (which decides the devices it fits).

use gpushare_proto::ErrorCode;
use serde_json::Value;

use crate::config::nvidia::{parse_nvidia, NvidiaKind};
use crate::config::short::parse_short;
use crate::config::value::{index, join, show, show_str, Obj};
use crate::config::{ConfigError, ParseContext, Sharing};

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
pub(super) enum Source {
    FromClass,
    FromClaim,
}

/// One config entry of our drivers, decoded.
#[derive(Debug)]
pub(super) struct ConfigEntry {
    /// JSON path of the entry (`status.allocation.devices.config[2]`).
    pub(super) path: String,
    pub(super) source: Source,
    /// Position in its list; later entries rank higher within one source.
    pub(super) position: usize,
    /// Requests it is limited to; empty means all.
    pub(super) requests: Vec<String>,
    pub(super) kind: ConfigKind,
    pub(super) sharing: Sharing,
}

impl ConfigEntry {
    /// Whether the entry names `request` (`name`, or the parent of `name/sub`).
    pub(super) fn names(&self, request: &str) -> bool {
        let parent = request.split_once('/').map_or(request, |(p, _)| p);
        self.requests.iter().any(|r| r == request || r == parent)
    }
}

/// Every config entry of our drivers, decoded: from `status.allocation.devices.config`, or when
/// that is absent from `spec.devices.config` (all `FromClaim`). Entries without `opaque` or for
/// other drivers are skipped; every entry of ours must decode, whether it applies or not (as
/// NVIDIA's admission webhook validates them all).
pub(super) fn config_entries(
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
