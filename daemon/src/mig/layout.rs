//! Declarative MIG layouts in NVIDIA mig-parted's v1 config format, and the plan that takes a
//! node's GPUs from what they hold to a named config: pure, so `gpushare mig plan` and
//! `gpushare mig apply` show and do the same thing.
//!
//! Format (`api/spec/v1/spec.go` of NVIDIA/mig-parted): `version: v1`; `mig-configs:` maps a
//! name to a non-empty list of entries, each with `devices` (`all` or GPU indices),
//! `mig-enabled`, `mig-devices` (profile → count; required when enabled, empty when not) and
//! optional `device-filter` (PCI device IDs such as `0x20B010DE`). Unknown keys are refused, as
//! mig-parted refuses them. Unlike mig-parted, which retries every ordering of placement-less
//! creates, the plan gives every GPU instance an explicit placement.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{GiProfile, GiProfileId, MigModel, MigPlacement, Occupied, MEMORY_SLICES};

/// A parsed mig-parted v1 config file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigPartedConfig {
    /// Must be `v1`.
    pub version: String,
    /// Named configs.
    #[serde(rename = "mig-configs")]
    pub mig_configs: BTreeMap<String, Vec<ConfigEntry>>,
}

/// One entry of a named config: which GPUs, and what they get.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigEntry {
    /// PCI device IDs (`0x20B010DE`: device `0x20B0`, vendor `0x10DE`) the entry is limited to.
    #[serde(rename = "device-filter", default)]
    pub device_filter: Option<OneOrMany>,
    /// `all` or a list of GPU indices (minors).
    pub devices: Devices,
    /// MIG mode wanted.
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    /// Profile name → count of GPU instances (each with one full compute instance).
    #[serde(rename = "mig-devices", default)]
    pub mig_devices: Option<BTreeMap<String, u32>>,
}

/// A string or a list of strings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One.
    One(String),
    /// Many.
    Many(Vec<String>),
}

/// `devices:` of an entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Devices {
    /// `all` (as a string).
    All(String),
    /// GPU indices.
    List(Vec<u32>),
}

/// Why a layout cannot be read or planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The file or the config asked for is malformed or asks for the impossible.
    #[error("{0}")]
    Invalid(String),
    /// Applying it would touch GPUs or MIG instances that prepared claims hold.
    #[error("{0}")]
    Refused(String),
}

/// Parses and validates a mig-parted v1 file (YAML or JSON).
///
/// # Errors
/// [`LayoutError::Invalid`] naming what is wrong.
pub fn parse(text: &str) -> Result<MigPartedConfig, LayoutError> {
    let cfg: MigPartedConfig = serde_norway::from_str(text)
        .map_err(|e| LayoutError::Invalid(format!("not a mig-parted config: {e}")))?;
    if cfg.version != "v1" {
        return Err(LayoutError::Invalid(format!(
            "unknown version {:?} (expected \"v1\")",
            cfg.version
        )));
    }
    if cfg.mig_configs.is_empty() {
        return Err(LayoutError::Invalid("mig-configs is empty".into()));
    }
    for (name, entries) in &cfg.mig_configs {
        if entries.is_empty() {
            return Err(LayoutError::Invalid(format!(
                "mig-configs.{name} has no entries"
            )));
        }
        for (i, e) in entries.iter().enumerate() {
            let at = format!("mig-configs.{name}[{i}]");
            if let Devices::All(s) = &e.devices {
                if s != "all" {
                    return Err(LayoutError::Invalid(format!(
                        "{at}.devices: {s:?} is neither \"all\" nor a list of GPU indices"
                    )));
                }
            }
            match (&e.mig_devices, e.mig_enabled) {
                (None, true) => {
                    return Err(LayoutError::Invalid(format!(
                        "{at}: mig-devices is required when mig-enabled is true"
                    )))
                }
                (Some(d), false) if !d.is_empty() => {
                    return Err(LayoutError::Invalid(format!(
                        "{at}: MIG devices included when 'mig-enabled' is false"
                    )))
                }
                _ => {}
            }
            for f in e.device_filter.iter().flat_map(filters) {
                parse_pci_id(f).ok_or_else(|| {
                    LayoutError::Invalid(format!(
                        "{at}.device-filter: {f:?} is not a PCI device ID such as \"0x20B010DE\""
                    ))
                })?;
            }
        }
    }
    Ok(cfg)
}

fn filters(f: &OneOrMany) -> Vec<&str> {
    match f {
        OneOrMany::One(s) => vec![s.as_str()],
        OneOrMany::Many(v) => v.iter().map(String::as_str).collect(),
    }
}

/// The 16-bit PCI device ID of `0x20B010DE` (`0x20B0`), or of a bare `0x20B0`.
fn parse_pci_id(s: &str) -> Option<u16> {
    let hex = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    let v = u32::from_str_radix(hex, 16).ok()?;
    match hex.len() {
        8 => Some((v >> 16) as u16),
        4 => Some(v as u16),
        _ => None,
    }
}

impl MigModel {
    /// PCI device IDs of the model (mig-parted's `device-filter` values, vendor dropped).
    pub fn pci_device_ids(self) -> &'static [u16] {
        match self {
            MigModel::A100Sxm4_40 => &[0x20B0, 0x20B1, 0x20F1, 0x20F6],
            MigModel::A100Sxm4_80 => &[0x20B2, 0x20B5, 0x20F3, 0x20F5],
            MigModel::H100_80 => &[0x2330, 0x2331, 0x2322, 0x2324],
            MigModel::H200 => &[0x2335, 0x233B],
        }
    }
}

/// A GPU instance as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedInstance {
    /// GI ID (existing instances only).
    pub gi_id: Option<u32>,
    /// Profile ID.
    pub profile: GiProfileId,
    /// Profile name.
    pub profile_name: String,
    /// Placement.
    pub placement: MigPlacement,
    /// Claim UID owning it, if any.
    pub owner: Option<String>,
}

/// What the planner knows of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuState {
    /// Minor (the index mig-parted's `devices` lists).
    pub minor: u32,
    /// Device name, `gpu-<minor>`.
    pub name: String,
    /// The model, when the GPU is MIG-capable with known tables; else why it has none (the
    /// wording a prepare gives too: `strategy::mig::mig_model`).
    pub model: Result<MigModel, String>,
    /// MIG mode in effect now.
    pub mig_enabled: bool,
    /// MIG mode after the next GPU reset (equal to `mig_enabled` unless a change is pending).
    pub mig_pending: bool,
    /// Its GPU instances.
    pub instances: Vec<PlannedInstance>,
    /// Claims holding the GPU (whole or by MIG instances).
    pub claims: Vec<String>,
}

/// What applying a config does to one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPlan {
    /// Device name.
    pub name: String,
    /// Minor.
    pub minor: u32,
    /// The model (every planned GPU has one).
    pub model: MigModel,
    /// The MIG mode the config asks for.
    pub mig_enabled: bool,
    /// MIG mode to set, when the pending mode (what the next reset brings) differs from the
    /// config's; setting the mode in effect cancels a change pending a reset.
    pub set_mig_mode: Option<bool>,
    /// GPU instances to destroy (with their compute instances), by GI ID.
    pub destroy: Vec<PlannedInstance>,
    /// GPU instances to create, each with its full compute instance, in this order (once the
    /// config's MIG mode is in effect).
    pub create: Vec<(GiProfile, MigPlacement)>,
    /// What the operator must do: the config's MIG mode takes effect only after a GPU reset
    /// on this GPU (Ampere), so the instances are created by applying again after it.
    pub note: Option<String>,
    /// Claims holding the GPU, when the plan changes it: applying refuses it.
    pub held_by: Vec<String>,
}

impl GpuPlan {
    /// Whether nothing changes on this GPU.
    pub fn is_noop(&self) -> bool {
        self.set_mig_mode.is_none() && self.destroy.is_empty() && self.create.is_empty()
    }
}

/// The note of a GPU whose MIG mode stays `enabled` or not until a reset.
pub fn pending_note(enabled: bool) -> String {
    format!(
        "MIG mode {} is pending a GPU reset: reset the GPU or reboot the node, then apply again",
        if enabled { "enable" } else { "disable" }
    )
}

/// Refuses, naming them, plans that would change GPUs claims hold (see [`GpuPlan::held_by`]).
///
/// # Errors
/// [`LayoutError::Refused`] naming each such GPU and its claims.
pub fn refuse_held(plans: &[GpuPlan]) -> Result<(), LayoutError> {
    let held: Vec<String> = plans
        .iter()
        .filter(|p| !p.held_by.is_empty())
        .map(|p| {
            format!(
                "{} is held by prepared claim(s) {}",
                p.name,
                p.held_by.join(", ")
            )
        })
        .collect();
    if held.is_empty() {
        return Ok(());
    }
    Err(LayoutError::Refused(format!(
        "{}; release those claims before changing the MIG layout",
        held.join("; ")
    )))
}

/// Plans config `name` of `cfg` over `gpus`: for every GPU the config selects, the MIG mode
/// change (against the pending mode, so a change waiting for a reset is not asked twice and a
/// config with the mode in effect cancels it) and the GPU instances to destroy and create. A
/// GPU already as asked is left alone (a plan with nothing to do). A GPU that would change
/// while prepared claims hold it (whole or through MIG instances) is planned all the same
/// with the claims in [`GpuPlan::held_by`]: [`refuse_held`] is what an apply checks.
///
/// # Errors
/// [`LayoutError::Invalid`] for an unknown config name, a GPU selected twice, a non-MIG GPU
/// named by index, a profile the GPU does not have or a set that does not fit.
pub fn plan(
    cfg: &MigPartedConfig,
    name: &str,
    gpus: &[GpuState],
) -> Result<Vec<GpuPlan>, LayoutError> {
    let entries = cfg.mig_configs.get(name).ok_or_else(|| {
        LayoutError::Invalid(format!(
            "no config {name:?} in the file (it has {})",
            cfg.mig_configs
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let mut chosen: BTreeMap<u32, &ConfigEntry> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        let at = format!("mig-configs.{name}[{i}]");
        let wanted_ids: Vec<u16> = e
            .device_filter
            .iter()
            .flat_map(filters)
            .filter_map(parse_pci_id)
            .collect();
        let passes = |g: &GpuState| {
            wanted_ids.is_empty()
                || g.model
                    .as_ref()
                    .is_ok_and(|m| m.pci_device_ids().iter().any(|id| wanted_ids.contains(id)))
        };
        let selected: Vec<&GpuState> = match &e.devices {
            // As mig-parted: `all` passes over GPUs without MIG.
            Devices::All(_) => gpus
                .iter()
                .filter(|g| g.model.is_ok() && passes(g))
                .collect(),
            Devices::List(minors) => {
                let mut v = Vec::new();
                for m in minors {
                    let g = gpus.iter().find(|g| g.minor == *m).ok_or_else(|| {
                        LayoutError::Invalid(format!("{at}.devices: the node has no GPU {m}"))
                    })?;
                    if !passes(g) {
                        continue;
                    }
                    if let Err(why) = &g.model {
                        return Err(LayoutError::Invalid(format!(
                            "{at}: cannot set MIG mode: {why}"
                        )));
                    }
                    v.push(g);
                }
                v
            }
        };
        for g in selected {
            if chosen.insert(g.minor, e).is_some() {
                return Err(LayoutError::Invalid(format!(
                    "{at}: {} is selected by more than one entry",
                    g.name
                )));
            }
        }
    }
    let mut plans = Vec::new();
    for (minor, entry) in chosen {
        let Some(g) = gpus.iter().find(|g| g.minor == minor) else {
            continue;
        };
        let Ok(model) = g.model.clone() else { continue };
        let mut p = plan_gpu(g, model, entry)?;
        if !p.is_noop() {
            p.held_by.clone_from(&g.claims);
        }
        plans.push(p);
    }
    Ok(plans)
}

fn plan_gpu(g: &GpuState, model: MigModel, e: &ConfigEntry) -> Result<GpuPlan, LayoutError> {
    let mut wanted: Vec<GiProfile> = Vec::new();
    for (profile, count) in e.mig_devices.iter().flatten() {
        let p = model.profile_by_name(profile).ok_or_else(|| {
            LayoutError::Invalid(format!(
                "{}: no MIG profile {profile:?} on {model} (it has {})",
                g.name,
                model.profile_names()
            ))
        })?;
        wanted.extend(std::iter::repeat_n(p, *count as usize));
    }
    let mut plan = GpuPlan {
        name: g.name.clone(),
        minor: g.minor,
        model,
        mig_enabled: e.mig_enabled,
        set_mig_mode: (g.mig_pending != e.mig_enabled).then_some(e.mig_enabled),
        destroy: Vec::new(),
        create: Vec::new(),
        note: None,
        held_by: Vec::new(),
    };
    // Where a mode change waits for a reset (Ampere), the config's mode is not in effect
    // after the plan: its instances are made by applying again after the reset.
    let in_effect = match plan.set_mig_mode {
        Some(on) if model.reset_free_mode_toggle() => on,
        _ => g.mig_enabled,
    };
    if in_effect != e.mig_enabled {
        plan.note = Some(pending_note(e.mig_enabled));
    }
    let mut have: Vec<GiProfileId> = g.instances.iter().map(|i| i.profile).collect();
    let mut want: Vec<GiProfileId> = wanted.iter().map(|p| p.id).collect();
    have.sort();
    want.sort();
    if plan.set_mig_mode.is_none() && g.mig_enabled == e.mig_enabled && have == want {
        return Ok(plan);
    }
    // Clear and create, as mig-parted does; but with explicit placements.
    plan.destroy = g.instances.clone();
    if e.mig_enabled {
        plan.create = pack(&wanted).ok_or_else(|| {
            LayoutError::Invalid(format!(
                "{}: {} do not fit together on one {model}",
                g.name,
                wanted.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
            ))
        })?;
    }
    Ok(plan)
}

/// Gives each profile a placement, largest first, backtracking: any set that fits the 8
/// memory slices is found, whatever order it was asked in.
pub fn pack(profiles: &[GiProfile]) -> Option<Vec<(GiProfile, MigPlacement)>> {
    let mut order: Vec<&GiProfile> = profiles.iter().collect();
    order.sort_by(|a, b| {
        b.memory_slices
            .cmp(&a.memory_slices)
            .then(b.compute_slices.cmp(&a.compute_slices))
    });
    let mut placed: Vec<(GiProfile, MigPlacement)> = Vec::new();
    fn go(order: &[&GiProfile], placed: &mut Vec<(GiProfile, MigPlacement)>) -> bool {
        let Some((first, rest)) = order.split_first() else {
            return true;
        };
        let same = placed.iter().filter(|(p, _)| p.id == first.id).count() as u32;
        if same >= first.max_instances {
            return false;
        }
        for pl in first.placements() {
            if pl.start + pl.size > MEMORY_SLICES || placed.iter().any(|(_, o)| o.overlaps(&pl)) {
                continue;
            }
            placed.push(((*first).clone(), pl));
            if go(rest, placed) {
                return true;
            }
            placed.pop();
        }
        false
    }
    go(&order, &mut placed).then_some(placed)
}

/// The instances of `plan` that exist after it is applied, for checks.
pub fn occupied_after(plan: &GpuPlan) -> Vec<Occupied> {
    plan.create
        .iter()
        .map(|(p, pl)| Occupied {
            profile: p.id,
            placement: *pl,
        })
        .collect()
}
