//! NVIDIA's opaque sharing parameters: `resource.nvidia.com/v1beta1` `GpuConfig` and
//! `MigDeviceConfig`.
//!
//! Decoding is strict, like NVIDIA's `StrictDecoder`: an unknown field anywhere is refused,
//! naming it. Defaults follow NVIDIA's `Normalize` (a missing `timeSlicingConfig` or interval
//! means `Default`, a missing `mpsConfig` means no limits, a missing `sharing` means no sharing,
//! as NVIDIA's newer releases do). Validation follows NVIDIA's `Validate`, plus the checks NVIDIA
//! only makes when it applies a config (strategy/config mismatch, too-low limits, per-device
//! keys), and one stricter rule: an active-thread percentage of 0 is refused, because the MPS
//! control daemon only accepts values in (0, 100].

use std::collections::BTreeMap;

use gpushare_proto::{ErrorCode, TimeSliceInterval};

use super::quantity::limit_mib;
use super::value::{join, key, show, show_str, Obj};
use super::{ConfigError, DeviceKey, MpsSettings, Sharing};

/// The API group and version of NVIDIA's opaque parameters.
pub const NVIDIA_API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// Kinds of [`NVIDIA_API_VERSION`] that NVIDIA defines but this daemon does not serve
/// (refused with `Unsupported`).
pub const UNSUPPORTED_NVIDIA_KINDS: &[&str] = &[
    "VfioDeviceConfig",
    "ComputeDomainChannelConfig",
    "ComputeDomainDaemonConfig",
    "ComputeDomain",
    "ComputeDomainClique",
];

/// Which NVIDIA kind an opaque config is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvidiaKind {
    /// `GpuConfig`: applies to full GPUs.
    GpuConfig,
    /// `MigDeviceConfig`: applies to MIG devices.
    MigDeviceConfig,
}

impl NvidiaKind {
    /// NVIDIA's kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            NvidiaKind::GpuConfig => "GpuConfig",
            NvidiaKind::MigDeviceConfig => "MigDeviceConfig",
        }
    }
}

/// Decodes NVIDIA parameters (an object carrying `apiVersion` and/or `kind`) found at `path`.
///
/// Refusals: another `apiVersion`, an unknown kind, an unknown field or a bad value →
/// `InvalidConfig`; `VfioDeviceConfig` and the ComputeDomain kinds → `Unsupported`.
pub fn parse_nvidia(params: Obj<'_>, path: &str) -> Result<(NvidiaKind, Sharing), ConfigError> {
    let api_version = params.opt_str("apiVersion")?;
    if api_version != Some(NVIDIA_API_VERSION) {
        let got = api_version.map_or_else(|| "nothing".to_owned(), show_str);
        return Err(params.err(
            "apiVersion",
            format!("expected {}, got {got}", show_str(NVIDIA_API_VERSION)),
        ));
    }
    let kind_name = params.req_str("kind")?;
    let kind = match kind_name {
        "GpuConfig" => NvidiaKind::GpuConfig,
        "MigDeviceConfig" => NvidiaKind::MigDeviceConfig,
        other if UNSUPPORTED_NVIDIA_KINDS.contains(&other) => {
            return Err(ConfigError::new(
                ErrorCode::Unsupported,
                format!(
                    "{}: {} {} is not supported by gpushare (only GpuConfig and MigDeviceConfig are)",
                    join(path, "kind"),
                    NVIDIA_API_VERSION,
                    show_str(other)
                ),
            ))
        }
        other => {
            return Err(params.err(
                "kind",
                format!(
                    "unknown kind {} of {NVIDIA_API_VERSION} (expected \"GpuConfig\" or \"MigDeviceConfig\")",
                    show_str(other)
                ),
            ))
        }
    };
    params.deny_unknown(&["apiVersion", "kind", "sharing"], kind.as_str())?;
    let sharing_path = join(path, "sharing");
    let Some(sharing) = params.opt_obj("sharing", &sharing_path)? else {
        // NVIDIA's newer releases leave a missing `sharing` alone: no sharing at all.
        return Ok((
            kind,
            match kind {
                NvidiaKind::GpuConfig => Sharing::Exclusive,
                NvidiaKind::MigDeviceConfig => Sharing::Mig {
                    profile: None,
                    mps: None,
                },
            },
        ));
    };
    let result = match kind {
        NvidiaKind::GpuConfig => parse_gpu_sharing(sharing)?,
        NvidiaKind::MigDeviceConfig => parse_mig_sharing(sharing)?,
    };
    Ok((kind, result))
}

/// The two strategies NVIDIA knows, spelled exactly (case-sensitive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    TimeSlicing,
    Mps,
}

/// Reads `sharing.strategy`: exactly `TimeSlicing` or `MPS`.
fn strategy(sharing: Obj<'_>) -> Result<Strategy, ConfigError> {
    let Some(raw) = sharing.opt_str("strategy")? else {
        return Err(sharing.err("strategy", "is required (\"TimeSlicing\" or \"MPS\")"));
    };
    match raw {
        "TimeSlicing" => Ok(Strategy::TimeSlicing),
        "MPS" => Ok(Strategy::Mps),
        other => Err(sharing.err(
            "strategy",
            format!(
                "unknown GPU sharing strategy {} (expected exactly \"TimeSlicing\" or \"MPS\"; names are case-sensitive)",
                show_str(other)
            ),
        )),
    }
}

/// `GpuSharing`: strategy, `timeSlicingConfig`, `mpsConfig`.
fn parse_gpu_sharing(sharing: Obj<'_>) -> Result<Sharing, ConfigError> {
    sharing.deny_unknown(
        &["strategy", "timeSlicingConfig", "mpsConfig"],
        "GpuSharing",
    )?;
    match strategy(sharing)? {
        Strategy::TimeSlicing => {
            refuse_mismatch(sharing, "mpsConfig", "TimeSlicing")?;
            let interval = parse_time_slicing(sharing)?;
            Ok(Sharing::TimeSlicing {
                interval,
                replicas: None,
            })
        }
        Strategy::Mps => {
            refuse_mismatch(sharing, "timeSlicingConfig", "MPS")?;
            Ok(Sharing::Mps {
                settings: parse_mps_config(sharing)?,
                replicas: None,
            })
        }
    }
}

/// `MigDeviceSharing`: strategy and `mpsConfig` only (a `timeSlicingConfig` is an unknown
/// field, as in NVIDIA's types). TimeSlicing on a MIG device is accepted and does nothing.
fn parse_mig_sharing(sharing: Obj<'_>) -> Result<Sharing, ConfigError> {
    sharing.deny_unknown(&["strategy", "mpsConfig"], "MigDeviceSharing")?;
    let mps = match strategy(sharing)? {
        Strategy::TimeSlicing => {
            refuse_mismatch(sharing, "mpsConfig", "TimeSlicing")?;
            None
        }
        Strategy::Mps => Some(parse_mps_config(sharing)?),
    };
    Ok(Sharing::Mig { profile: None, mps })
}

/// Refuses a config block that belongs to the other strategy.
fn refuse_mismatch(sharing: Obj<'_>, field: &str, strategy: &str) -> Result<(), ConfigError> {
    match sharing.get(field) {
        None => Ok(()),
        Some(v) => Err(sharing.err(
            field,
            format!(
                "cannot be used with the {} strategy (got {})",
                show_str(strategy),
                show(v)
            ),
        )),
    }
}

/// `timeSlicingConfig.interval`; a missing block, `{}` or a missing interval mean `Default`.
fn parse_time_slicing(sharing: Obj<'_>) -> Result<TimeSliceInterval, ConfigError> {
    let path = join(sharing.path, "timeSlicingConfig");
    let Some(ts) = sharing.opt_obj("timeSlicingConfig", &path)? else {
        return Ok(TimeSliceInterval::Default);
    };
    ts.deny_unknown(&["interval"], "TimeSlicingConfig")?;
    match ts.opt_str("interval")? {
        None => Ok(TimeSliceInterval::Default),
        Some(raw) => interval_exact(raw).ok_or_else(|| {
            ts.err(
                "interval",
                format!(
                    "unknown time-slice interval {} (expected \"Default\", \"Short\", \"Medium\" or \"Long\")",
                    show_str(raw)
                ),
            )
        }),
    }
}

/// NVIDIA's interval names, case-sensitive.
fn interval_exact(raw: &str) -> Option<TimeSliceInterval> {
    match raw {
        "Default" => Some(TimeSliceInterval::Default),
        "Short" => Some(TimeSliceInterval::Short),
        "Medium" => Some(TimeSliceInterval::Medium),
        "Long" => Some(TimeSliceInterval::Long),
        _ => None,
    }
}

/// `mpsConfig`; a missing block means no limits (NVIDIA fills in an empty `MpsConfig`).
fn parse_mps_config(sharing: Obj<'_>) -> Result<MpsSettings, ConfigError> {
    let path = join(sharing.path, "mpsConfig");
    let Some(mps) = sharing.opt_obj("mpsConfig", &path)? else {
        return Ok(MpsSettings::default());
    };
    mps.deny_unknown(
        &[
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
            "multiUser",
        ],
        "MpsConfig",
    )?;
    let mut settings = MpsSettings {
        active_thread_percentage: active_thread_percentage(mps, "defaultActiveThreadPercentage")?,
        multi_user: mps.opt_bool("multiUser")?.unwrap_or(false),
        ..MpsSettings::default()
    };
    if let Some(v) = mps.get("defaultPinnedDeviceMemoryLimit") {
        settings.default_pinned_limit_mib = Some(limit_mib(
            v,
            &join(&path, "defaultPinnedDeviceMemoryLimit"),
        )?);
    }
    let per_device_path = join(&path, "defaultPerDevicePinnedMemoryLimit");
    if let Some(per_device) = mps.opt_obj("defaultPerDevicePinnedMemoryLimit", &per_device_path)? {
        settings.per_device_pinned_limit_mib = per_device_limits(per_device)?;
    }
    Ok(settings)
}

/// An active-thread percentage at `field` of `obj`: a whole number in 1..=100.
///
/// NVIDIA's validation accepts 0..=100, but the MPS control daemon refuses 0, so 0 is refused
/// here, where the user sees why.
pub(crate) fn active_thread_percentage(
    obj: Obj<'_>,
    field: &str,
) -> Result<Option<u32>, ConfigError> {
    let Some(p) = obj.opt_int(field)? else {
        return Ok(None);
    };
    match p {
        1..=100 => Ok(u32::try_from(p).ok()),
        0 => Err(obj.err(
            field,
            "value 0 is refused: the MPS control daemon accepts only (0, 100]",
        )),
        p if p < 0 => Err(obj.err(field, format!("value {p} must not be negative (1 to 100)"))),
        p => Err(obj.err(field, format!("value {p} must not be greater than 100"))),
    }
}

/// `defaultPerDevicePinnedMemoryLimit`: key (index or GPU UUID) → MiB.
fn per_device_limits(per_device: Obj<'_>) -> Result<BTreeMap<DeviceKey, u64>, ConfigError> {
    let mut out = BTreeMap::new();
    for (raw_key, value) in per_device.map {
        let entry_path = key(per_device.path, raw_key);
        let device_key = parse_device_key(raw_key).ok_or_else(|| {
            ConfigError::invalid_config(format!(
                "{entry_path}: key {} is neither a device index (0, 1, …) nor a GPU UUID (GPU-…)",
                show_str(raw_key)
            ))
        })?;
        let mib = limit_mib(value, &entry_path)?;
        if out.insert(device_key.clone(), mib).is_some() {
            return Err(ConfigError::invalid_config(format!(
                "{entry_path}: key {} names device {device_key} a second time",
                show_str(raw_key)
            )));
        }
    }
    Ok(out)
}

/// A per-device key: a decimal index, or a GPU / MIG UUID.
pub(crate) fn parse_device_key(raw: &str) -> Option<DeviceKey> {
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return raw.parse::<usize>().ok().map(DeviceKey::Index);
    }
    let body = raw
        .strip_prefix("GPU-")
        .or_else(|| raw.strip_prefix("MIG-"))?;
    let plausible = !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'/');
    plausible.then(|| DeviceKey::Uuid(raw.to_owned()))
}

#[cfg(test)]
#[path = "nvidia_tests.rs"]
mod tests;
