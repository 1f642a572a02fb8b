//! `gpushare`, the operators' CLI for gpushared: rendering what the daemon reports (this
//! file: tables, the detail views, `-o json|yaml|resourceslice`, man pages), the demo
//! ([`demo`]) and the node check ([`doctor`]), and the containers both the demo and the
//! end-to-end tests start ([`container`]).
//!
//! It talks to the daemon through `gpushare-proto` only. What it takes from the daemon's
//! library (the config file and checkpoint readers, the node catalog, the daemon's own choice
//! of MPS control program and toolkit) is `gpushare::cli_api`, and nothing else: not the claim
//! service, the socket server, the strategies or the registry (`tests/layout.rs` checks it).

pub mod container;
pub mod demo;
pub mod doctor;

use std::fmt::Write as _;

use comfy_table::{presets, Table};
use gpushare::cli_api::{catalog, NodeProfile};
use gpushare_proto::{ClaimInfo, GpuInfo, HealthInfo, MigOrigin, StrategyInfo, VersionInfo};
use serde::Serialize;

/// Output format of every listing (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// The daemon's JSON, pretty-printed.
    Json,
    /// The same as YAML.
    Yaml,
    /// `gpushare gpus` only: the `resource.k8s.io/v1` ResourceSlice a DRA driver would
    /// publish for the node, as YAML. Hidden from the `-o` value list, which every command
    /// shares: `gpus`' own help offers it, the others refuse it.
    #[value(name = "resourceslice", hide = true)]
    ResourceSlice,
}

/// Renders `value` as JSON or YAML; `None` for [`Output::Table`].
///
/// # Errors
/// Serialization failed.
pub fn render_structured<T: Serialize>(
    value: &T,
    output: Output,
) -> anyhow::Result<Option<String>> {
    Ok(match output {
        Output::Table => None,
        Output::Json => Some(serde_json::to_string_pretty(value)? + "\n"),
        Output::Yaml | Output::ResourceSlice => Some(serde_norway::to_string(value)?),
    })
}

/// Text from claims (names come from the API server, but may come from a hand-written file)
/// with control characters replaced, so a table cannot be broken or a terminal driven by it.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING).set_header(header.to_vec());
    t
}

/// The `gpushare gpus` table, the same for real and simulated nodes. MIG: `-` for a GPU
/// without MIG, `off`, or `on (<n> device(s))`, followed by a mode change that waits for a
/// GPU reset (`off (enable pending a GPU reset)`).
pub fn gpus_table(gpus: &[GpuInfo]) -> String {
    let mut t = table(&[
        "DEVICE",
        "UUID",
        "PRODUCT",
        "ARCH",
        "CC",
        "MEMORY",
        "MIG",
        "COMPUTE MODE",
        "TIME-SLICE",
        "SHARING",
        "CLAIMS",
    ]);
    for g in gpus {
        let mig = mig_column(g);
        t.add_row(vec![
            g.name.clone(),
            g.uuid.clone(),
            g.product_name.clone(),
            g.architecture.clone(),
            g.cuda_compute_capability.clone(),
            format!("{} MiB", g.memory_mib),
            mig,
            format!("{:?}", g.compute_mode),
            g.time_slice.as_str().to_string(),
            sharing_label(g.sharing).to_string(),
            g.claims.join(","),
        ]);
    }
    t.to_string() + "\n"
}

/// A GPU's sharing in the words `gpushare claims` uses for strategies (`MPS(50.0%)`,
/// `MIG(3g.20gb)`) and the metrics' `mode` label: `Free`, `Exclusive`, `TimeSlicing`, `MPS`,
/// `MIG`.
fn sharing_label(s: gpushare_proto::GpuSharing) -> &'static str {
    use gpushare_proto::GpuSharing;
    match s {
        GpuSharing::Free => "Free",
        GpuSharing::Exclusive => "Exclusive",
        GpuSharing::TimeSlicing => "TimeSlicing",
        GpuSharing::Mps => "MPS",
        GpuSharing::Mig => "MIG",
    }
}

fn mig_column(g: &GpuInfo) -> String {
    if !g.mig_capable {
        return "-".to_string();
    }
    let pending = g.mig_pending.filter(|p| *p != g.mig_enabled).map(|p| {
        format!(
            "{} pending a GPU reset",
            if p { "enable" } else { "disable" }
        )
    });
    match (g.mig_enabled, pending) {
        (false, None) => "off".to_string(),
        (false, Some(p)) => format!("off ({p})"),
        (true, p) => {
            let n = g.mig_devices.len();
            let devices = format!("{n} device{}", if n == 1 { "" } else { "s" });
            match p {
                None => format!("on ({devices})"),
                Some(p) => format!("on ({devices}; {p})"),
            }
        }
    }
}

/// The devices a claim's request got: the allocated ones, except that a MIG group names the
/// MIG device each became (a short-form `sharingMode: mig` claim is allocated `gpu-<minor>`
/// and gets `gpu-<minor>-mig-…`).
fn request_devices(c: &ClaimInfo, r: &gpushare_proto::RequestDevices) -> Vec<String> {
    let got: Vec<String> = c
        .groups
        .iter()
        .filter(|g| !g.mig.is_empty())
        .flat_map(|g| &g.devices)
        .filter(|d| d.request == r.request)
        .map(|d| d.device.clone())
        .collect();
    if got.is_empty() {
        r.devices.clone()
    } else {
        got
    }
}

/// The `gpushare mig list` table: every MIG instance of every GPU with its owner claim
/// (`-` for instances no claim owns, such as a layout's), profile, placement and UUID.
pub fn mig_table(gpus: &[GpuInfo]) -> String {
    let mut t = table(&[
        "GPU",
        "MIG DEVICE",
        "PROFILE",
        "GI PROFILE",
        "PLACEMENT",
        "GI",
        "MEMORY",
        "SMS",
        "UUID",
        "OWNER",
    ]);
    for g in gpus {
        for d in &g.mig_devices {
            t.add_row(vec![
                g.name.clone(),
                d.device_name(g.minor),
                d.profile.clone(),
                d.gi_profile_id.to_string(),
                format!("{}:{}", d.placement_start, d.memory_slices),
                d.gi_id.map_or_else(|| "-".into(), |i| i.to_string()),
                format!("{} MiB", d.memory_mib),
                d.multiprocessors.to_string(),
                if d.uuid.is_empty() {
                    "(no compute instance)".into()
                } else {
                    d.uuid.clone()
                },
                d.owner.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
    }
    t.to_string() + "\n"
}

/// What `gpushare mig plan` / `apply` print: per GPU, the claims holding it (an apply refuses
/// it), the mode change and the MIG devices destroyed and created.
pub fn mig_plan_text(r: &gpushare_proto::MigApplyResult) -> String {
    let mut s = format!(
        "config {}{}\n",
        r.config,
        if r.dry_run {
            ": plan only, nothing is changed (gpushare mig apply makes it)"
        } else {
            " applied"
        }
    );
    let verb = |plan: &str, done: &str| {
        if r.dry_run {
            plan.to_string()
        } else {
            done.to_string()
        }
    };
    for g in &r.gpus {
        if g.set_mig_mode.is_none()
            && g.destroy.is_empty()
            && g.create.is_empty()
            && g.note.is_none()
        {
            s += &format!("  {}: unchanged\n", g.gpu);
            continue;
        }
        if g.held_by.is_empty() {
            s += &format!("  {}:\n", g.gpu);
        } else {
            s += &format!(
                "  {}: held by claim(s) {}: apply refuses it until they are released\n",
                g.gpu,
                g.held_by.join(", ")
            );
        }
        if let Some(on) = g.set_mig_mode {
            s += &format!(
                "    {} MIG mode {}\n",
                verb("would set", "set"),
                if on { "enabled" } else { "disabled" }
            );
        }
        for d in &g.destroy {
            s += &format!("    {} {d}\n", verb("would destroy", "destroyed"));
        }
        for c in &g.create {
            s += &format!("    {} {c}\n", verb("would create", "created"));
        }
        if let Some(n) = &g.note {
            s += &format!("    note: {n}\n");
        }
    }
    s
}

/// One line of `gpushare profiles`.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileRow {
    /// Profile name (EC2 instance type).
    pub name: String,
    /// GPUs on the node.
    pub gpus: u32,
    /// Product names, `+`-joined for mixed nodes.
    pub product: String,
    /// Memory per GPU in MiB, `+`-joined for mixed nodes.
    pub memory_mib: String,
    /// Architectures.
    pub architecture: String,
    /// CUDA compute capabilities.
    pub cuda_compute_capability: String,
    /// Whether the GPUs support MIG.
    pub mig_capable: bool,
}

impl ProfileRow {
    /// The row for `p`.
    pub fn of(p: &NodeProfile) -> ProfileRow {
        let join = |f: &dyn Fn(&catalog::GpuGroup) -> String| {
            let mut v: Vec<String> = p.gpus.iter().map(f).collect();
            v.dedup();
            v.join("+")
        };
        ProfileRow {
            name: p.name.clone(),
            gpus: p.gpus.iter().map(|g| g.count).sum(),
            product: join(&|g| g.product_name.clone()),
            memory_mib: join(&|g| g.memory_mib.to_string()),
            architecture: join(&|g| g.architecture.clone()),
            cuda_compute_capability: join(&|g| g.cuda_compute_capability.clone()),
            mig_capable: p.gpus.iter().any(|g| g.mig_capable),
        }
    }
}

/// The `gpushare profiles` table.
pub fn profiles_table(rows: &[ProfileRow]) -> String {
    let mut t = table(&[
        "PROFILE",
        "GPUS",
        "PRODUCT",
        "MEMORY (MiB)",
        "ARCH",
        "CC",
        "MIG",
    ]);
    for r in rows {
        t.add_row(vec![
            r.name.clone(),
            r.gpus.to_string(),
            r.product.clone(),
            r.memory_mib.clone(),
            r.architecture.clone(),
            r.cuda_compute_capability.clone(),
            if r.mig_capable { "yes" } else { "no" }.to_string(),
        ]);
    }
    t.to_string() + "\n"
}

/// The driver name `-o resourceslice` publishes under: NVIDIA's, whose attribute names the
/// slice carries.
pub const RESOURCE_SLICE_DRIVER: &str = "gpu.nvidia.com";

/// The `resource.k8s.io` versions `-o resourceslice` writes, as `--api-version` takes them,
/// with the first Kubernetes version serving each: the list its error gives.
pub fn accepted_api_versions() -> String {
    gpushare_slice::ApiVersion::PREFERENCE
        .iter()
        .map(|v| format!("{} (Kubernetes 1.{}+)", v.api_version(), v.first_served()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--api-version`'s value: `resource.k8s.io/v1beta2`, or the version alone (`v1beta2`).
///
/// # Errors
/// Not one of ours, naming the accepted ones.
pub fn parse_api_version(s: &str) -> Result<gpushare_slice::ApiVersion, String> {
    let v = s.strip_prefix("resource.k8s.io/").unwrap_or(s);
    gpushare_slice::ApiVersion::parse(v).ok_or_else(|| {
        format!(
            "{s:?} is not a ResourceSlice API version gpushare writes; accepted: {}",
            accepted_api_versions()
        )
    })
}

/// The version `gpushare gpus -o resourceslice` writes: `asked` (`--api-version`) when given,
/// else the best one Kubernetes `1.<minor>` serves when the version is known
/// (`--partitionable`), else `resource.k8s.io/v1` (Kubernetes 1.34 and later).
///
/// # Errors
/// `asked` is not served by Kubernetes `1.<minor>`.
pub fn slice_api_version(
    asked: Option<gpushare_slice::ApiVersion>,
    kubernetes_minor: Option<u32>,
) -> anyhow::Result<gpushare_slice::ApiVersion> {
    use gpushare_slice::ApiVersion;
    match (asked, kubernetes_minor) {
        (Some(v), Some(minor)) if v.first_served() > minor => anyhow::bail!(
            "Kubernetes 1.{minor} does not serve {} (it came in 1.{}); give --api-version {}, or leave it out",
            v.api_version(),
            v.first_served(),
            ApiVersion::for_kubernetes(minor).unwrap_or(ApiVersion::V1beta1).api_version()
        ),
        (Some(v), _) => Ok(v),
        (None, Some(minor)) => Ok(ApiVersion::for_kubernetes(minor).unwrap_or(ApiVersion::V1beta1)),
        (None, None) => Ok(ApiVersion::V1),
    }
}

/// One slice as a YAML document of `version`, in the shape the DRA plugin publishes it
/// ([`gpushare_slice::ResourceSlice::to_api_object`]: v1beta1 nests each device's
/// attributes and capacity under `basic`).
fn slice_document(
    slice: &gpushare_slice::ResourceSlice,
    version: gpushare_slice::ApiVersion,
) -> anyhow::Result<String> {
    Ok(serde_norway::to_string(&slice.to_api_object(version))?)
}

/// `gpushare gpus -o resourceslice`: the slice as YAML in `version`, checked against the API
/// server's rules first.
///
/// # Errors
/// The slice breaks a rule (e.g. a node name that is not a DNS subdomain), or serialization
/// failed.
pub fn resource_slice_yaml(
    gpus: &[GpuInfo],
    node_name: &str,
    version: gpushare_slice::ApiVersion,
) -> anyhow::Result<String> {
    let slice = gpushare_slice::build(gpus, node_name, RESOURCE_SLICE_DRIVER);
    gpushare_slice::validate(&slice).map_err(|errs| {
        anyhow::anyhow!(
            "the ResourceSlice for node {node_name:?} would be refused: {}",
            errs.join("; ")
        )
    })?;
    slice_document(&slice, version)
}

/// `gpushare gpus -o resourceslice --partitionable <version>`: the pool a DRA driver
/// publishes in `layout` (a server that keeps partitionable devices), as a YAML stream of
/// ResourceSlices in `version`, checked against that server's rules first.
///
/// # Errors
/// A slice breaks a rule, or serialization failed.
pub fn resource_pool_yaml(
    gpus: &[GpuInfo],
    node_name: &str,
    layout: gpushare_slice::Layout,
    version: gpushare_slice::ApiVersion,
) -> anyhow::Result<String> {
    let pool = gpushare_slice::build_pool_in(gpus, node_name, RESOURCE_SLICE_DRIVER, 1, layout);
    gpushare_slice::validate_pool(&pool, layout).map_err(|errs| {
        anyhow::anyhow!(
            "the ResourceSlices for node {node_name:?} would be refused: {}",
            errs.join("; ")
        )
    })?;
    let mut out = String::new();
    for s in &pool {
        out += "---\n";
        out += &slice_document(s, version)?;
    }
    Ok(out)
}

/// The `gpushare claims` table.
pub fn claims_table(claims: &[ClaimInfo]) -> String {
    let mut t = table(&[
        "UID",
        "NAMESPACE/NAME",
        "STATE",
        "STRATEGY",
        "DEVICES",
        "ATTACHED/REPLICAS",
    ]);
    for c in claims {
        let devices: Vec<String> = c
            .requests
            .iter()
            .flat_map(|r| request_devices(c, r))
            .collect();
        let attached = match c.attach_limit {
            Some(l) => format!("{}/{l}", c.attached.len()),
            None => format!("{}/-", c.attached.len()),
        };
        t.add_row(vec![
            c.uid.clone(),
            clean(&format!("{}/{}", c.namespace, c.name)),
            format!("{:?}", c.state),
            c.strategy_summary(),
            devices.join(","),
            attached,
        ]);
    }
    t.to_string() + "\n"
}

/// The `gpushare claim UID` detail view.
pub fn claim_detail(c: &ClaimInfo) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Claim:      {} ({})",
        c.uid,
        clean(&format!("{}/{}", c.namespace, c.name))
    );
    let _ = writeln!(s, "State:      {:?}", c.state);
    let _ = writeln!(s, "Restarts:   {}", c.restarts);
    let _ = writeln!(
        s,
        "Last error: {}",
        c.last_error.as_deref().map_or("none".to_string(), clean)
    );
    let _ = writeln!(s, "CDI spec:   {}", c.cdi_spec);
    for r in &c.requests {
        let got = request_devices(c, r);
        let allocated = if got == r.devices {
            String::new()
        } else {
            format!(" (allocated as {})", r.devices.join(","))
        };
        let _ = writeln!(
            s,
            "Request {}: devices {}{allocated} -> CDI {}",
            r.request,
            got.join(","),
            r.cdi_device_ids.join(",")
        );
    }
    for g in &c.groups {
        let devs: Vec<String> = g
            .devices
            .iter()
            .map(|d| format!("{} ({})", d.device, d.uuid))
            .collect();
        let _ = writeln!(s, "Group [{}]: {}", g.requests.join(","), devs.join(", "));
        for m in &g.mig {
            let _ = writeln!(
                s,
                "  MIG slice: {} on gpu-{} ({}), profile {} (GI profile {}) at placement {}, GPU instance {}{}, {}",
                m.device,
                m.gpu_minor,
                m.gpu_uuid,
                m.profile,
                m.gi_profile_id,
                m.placement_start,
                m.gi_id,
                m.ci_id
                    .map_or(String::new(), |ci| format!(", compute instance {ci}")),
                if m.uuid.is_empty() { "no MIG UUID yet" } else { m.uuid.as_str() }
            );
            let _ = writeln!(
                s,
                "             {}{}",
                match m.origin {
                    MigOrigin::Created => "made for the claim (destroyed at unprepare)",
                    MigOrigin::Existing =>
                        "existed before the claim: static MIG (left in place at unprepare)",
                },
                if m.enabled_mig_mode {
                    "; MIG mode was turned on by gpushare and goes off after the last such slice"
                } else {
                    ""
                }
            );
            if !m.original_uuid.is_empty() && m.original_uuid != m.uuid {
                let _ = writeln!(
                    s,
                    "             made again since it was prepared (a GPU reset or a reboot); its CDI IDs keep its first name {}, which the driver's CDI spec keeps for it",
                    clean(&m.original_uuid)
                );
            }
        }
        match &g.sharing {
            StrategyInfo::Exclusive if !g.mig.is_empty() => {
                let _ = writeln!(s, "  strategy:  MIG slice(s) used alone");
            }
            StrategyInfo::Exclusive => {
                let _ = writeln!(s, "  strategy:  Exclusive (nothing changed on the GPU)");
            }
            StrategyInfo::TimeSlicing { interval } => {
                let _ = writeln!(
                    s,
                    "  strategy:  TimeSlicing, interval {} ({})",
                    interval.as_str(),
                    interval.as_int()
                );
            }
            StrategyInfo::Mps(m) => {
                let _ = writeln!(s, "  strategy:  MPS");
                let _ = writeln!(
                    s,
                    "  MPS control daemon pid: {} (restarts: {})",
                    m.control_daemon_pid, m.restarts
                );
                let _ = writeln!(s, "  pipe dir:  {}", m.pipe_dir);
                let _ = writeln!(s, "  shm dir:   {}", m.shm_dir);
                let _ = writeln!(s, "  CUDA_VISIBLE_DEVICES: {}", m.visible_devices.join(","));
                let _ = writeln!(
                    s,
                    "  active thread percentage (read back): {}",
                    m.active_thread_percentage
                );
                if m.pinned_device_memory_limits.is_empty() {
                    let _ = writeln!(s, "  pinned device memory limits: none");
                }
                for (ordinal, limit) in &m.pinned_device_memory_limits {
                    let shown = if limit.is_empty() {
                        "none"
                    } else {
                        limit.as_str()
                    };
                    // The ordinal counts the daemon's CUDA_VISIBLE_DEVICES: the group's GPU
                    // UUIDs (sorted), or its MIG UUIDs on MIG slices.
                    let device = ordinal
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| m.visible_devices.get(i))
                        .and_then(|uuid| {
                            g.mig.iter().find(|x| &x.uuid == uuid).map_or_else(
                                || {
                                    g.devices
                                        .iter()
                                        .find(|d| &d.uuid == uuid)
                                        .map(|d| d.device.clone())
                                },
                                |x| Some(x.device.clone()),
                            )
                        })
                        .unwrap_or_else(|| "?".to_string());
                    let _ = writeln!(
                        s,
                        "  pinned device memory limit, CUDA device {ordinal} = {device} (read back): {shown}"
                    );
                }
            }
        }
    }
    let limit = c
        .attach_limit
        .map_or("unlimited".to_string(), |l| l.to_string());
    let _ = writeln!(s, "Attached:   {} (limit {limit})", c.attached.len());
    for a in &c.attached {
        let _ = writeln!(
            s,
            "  container {} pid {} cgroup {}",
            clean(&a.container_id),
            a.pid.map_or("-".into(), |p| p.to_string()),
            a.cgroup.as_deref().unwrap_or("-")
        );
    }
    s
}

/// The `gpushare status` summary.
pub fn status_text(h: &HealthInfo, v: &VersionInfo) -> String {
    let mut s = format!(
        "gpushared {} (protocol {})\nready:        {}\nnode:         {}\nbackend:      {}\nMPS control:  {}\nGPUs:         {}\nclaims:       {}\n",
        v.daemon, v.protocol, h.ready, h.node_name, h.backend, h.mps_control, h.gpus, h.claims
    );
    let _ = writeln!(s, "degraded:     {}", h.degraded_claims);
    if let Some(d) = h.driver_spec.as_ref().filter(|d| d.ok) {
        let _ = writeln!(s, "driver spec:  {}", clean(&d.path));
    }
    if h.stopping {
        let _ = writeln!(s, "stopping:     yes");
    }
    if let Some(q) = &h.checkpoint_quarantined {
        let _ = writeln!(s, "CHECKPOINT WAS CORRUPT: {}", clean(q));
    }
    if !h.quarantined_records.is_empty() {
        let _ = writeln!(
            s,
            "RECORDS REFUSED AT START: {} (those claims were not re-adopted)",
            h.quarantined_records.len()
        );
        for r in &h.quarantined_records {
            let _ = writeln!(s, "  {}", clean(r));
        }
    }
    if let Some(e) = &h.checkpoint_error {
        let _ = writeln!(s, "CHECKPOINT NOT WRITABLE: {}", clean(e));
    }
    if let Some(d) = h.driver_spec.as_ref().filter(|d| !d.ok) {
        let next = d
            .retry_in_seconds
            .map_or(String::new(), |r| format!("; next try in {r} s"));
        let _ = writeln!(
            s,
            "DRIVER CDI SPEC FAILING: {} ({} failed generations in a row{next}; {}): every prepare that needs it is refused",
            clean(d.error.as_deref().unwrap_or("not generated yet")),
            d.failures,
            clean(&d.generator)
        );
    }
    s
}

/// Writes `<name>.1` for `cmd` and `<name>-<sub>.1` for each visible subcommand into `dir`,
/// and so on down (`gpushare-mig-plan.1`): man pages generated from the clap definitions,
/// for packaging.
///
/// # Errors
/// Rendering or writing failed.
pub fn write_man_pages(cmd: &clap::Command, dir: &std::path::Path) -> anyhow::Result<()> {
    let mut cmd = cmd.clone();
    // Global options (--socket, -o, --timeout) reach every subcommand's page.
    cmd.build();
    let top = cmd.get_name().to_string();
    write_man_page(&cmd, &top, &top, dir)
}

/// `page.1` for `cmd`, whose synopsis is `typed` (`gpushare mig plan` on `gpushare-mig-plan`,
/// as git's pages do), then one page per visible subcommand of it.
fn write_man_page(
    cmd: &clap::Command,
    page: &str,
    typed: &str,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut out = Vec::new();
    clap_mangen::Man::new(
        cmd.clone()
            .display_name(page.to_string())
            .bin_name(typed.to_string()),
    )
    .render(&mut out)
    .with_context(|| format!("rendering the man page of {typed}"))?;
    let path = dir.join(format!("{page}.1"));
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let name = sub.get_name();
        write_man_page(
            sub,
            &format!("{page}-{name}"),
            &format!("{typed} {name}"),
            dir,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(mig_devices: usize) -> GpuInfo {
        let device = serde_json::json!({
            "uuid": "MIG-1", "profile": "3g.20gb", "gi_profile_id": 9, "placement_start": 0,
            "memory_slices": 4, "memory_mib": 19968, "multiprocessors": 42, "copy_engines": 3,
            "decoders": 2, "encoders": 0, "jpeg_engines": 0, "ofa_engines": 0,
        });
        serde_json::from_value(serde_json::json!({
            "name": "gpu-2", "minor": 2, "uuid": "GPU-2", "product_name": "NVIDIA A100-SXM4-40GB",
            "memory_mib": 40960, "compute_mode": "Default", "time_slice": "Default",
            "sharing": "Mig", "claims": [], "mig_capable": true, "mig_enabled": true,
            "mig_devices": vec![device; mig_devices],
        }))
        .unwrap()
    }

    #[test]
    fn status_shows_a_driver_spec_that_cannot_be_generated() {
        let v = VersionInfo {
            daemon: "0.1.0".into(),
            protocol: 1,
        };
        let health = |spec: serde_json::Value| -> HealthInfo {
            serde_json::from_value(serde_json::json!({
                "ready": true, "node_name": "n", "gpus": 1, "claims": 0, "backend": "nvml",
                "mps_control": "/usr/bin/nvidia-cuda-mps-control", "driver_spec": spec,
            }))
            .unwrap()
        };
        let failing = status_text(
            &health(serde_json::json!({
                "path": "/var/run/cdi/gpushare.io-gpu.json",
                "generator": "/usr/bin/nvidia-ctk cdi generate (driver root /)",
                "ok": false, "error": "exit 1: Driver/library version mismatch\nmore",
                "failures": 2, "retry_in_seconds": 17, "generate_timeout_seconds": 15,
            })),
            &v,
        );
        assert!(
            failing.contains("DRIVER CDI SPEC FAILING: exit 1: Driver/library version mismatch?more (2 failed generations in a row; next try in 17 s; /usr/bin/nvidia-ctk cdi generate (driver root /)): every prepare that needs it is refused\n"),
            "{failing}"
        );
        let ok = status_text(
            &health(serde_json::json!({
                "path": "/var/run/cdi/gpushare.io-gpu.json",
                "generator": "/usr/bin/nvidia-ctk cdi generate (driver root /)", "ok": true,
            })),
            &v,
        );
        assert!(
            ok.contains("driver spec:  /var/run/cdi/gpushare.io-gpu.json\n")
                && !ok.contains("FAILING"),
            "{ok}"
        );
    }

    #[test]
    fn status_shows_each_record_refused_at_start() {
        let h: HealthInfo = serde_json::from_value(serde_json::json!({
            "ready": true, "node_name": "n", "gpus": 1, "claims": 0, "backend": "nvml",
            "mps_control": "/usr/bin/nvidia-cuda-mps-control",
            "quarantined_records": ["claim \"a\" (from x): bad; kept at q/1.json", "claim \"b\" (from y): worse; kept at q/2.json"],
        }))
        .unwrap();
        let v = VersionInfo {
            daemon: "0.1.0".into(),
            protocol: 1,
        };
        let text = status_text(&h, &v);
        assert!(text.contains("RECORDS REFUSED AT START: 2 (those claims were not re-adopted)\n  claim \"a\" (from x): bad; kept at q/1.json\n  claim \"b\""), "{text}");
        let quiet: HealthInfo = serde_json::from_value(serde_json::json!({
            "ready": true, "node_name": "n", "gpus": 1, "claims": 0, "backend": "nvml",
            "mps_control": "/usr/bin/nvidia-cuda-mps-control",
        }))
        .unwrap();
        assert!(!status_text(&quiet, &v).contains("REFUSED"));
    }

    #[test]
    fn the_mig_column_counts_in_words_that_agree() {
        assert!(gpus_table(&[gpu(1)]).contains("on (1 device) "));
        assert!(gpus_table(&[gpu(2)]).contains("on (2 devices)"));
        assert!(gpus_table(&[gpu(0)]).contains("on (0 devices)"));
    }

    #[test]
    fn a_plan_says_it_is_one_and_an_apply_what_it_did() {
        let r = |dry_run| gpushare_proto::MigApplyResult {
            config: "all-balanced".into(),
            dry_run,
            gpus: vec![],
        };
        assert_eq!(
            mig_plan_text(&r(true)),
            "config all-balanced: plan only, nothing is changed (gpushare mig apply makes it)\n"
        );
        assert_eq!(mig_plan_text(&r(false)), "config all-balanced applied\n");
    }

    /// Every document of a YAML stream.
    fn documents(yaml: &str) -> Vec<serde_json::Value> {
        serde_norway::Deserializer::from_str(yaml)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect()
    }

    #[test]
    fn a_resource_slice_takes_the_shape_of_its_api_version() {
        use gpushare_slice::ApiVersion;
        let slice = |version| {
            let docs = documents(&resource_slice_yaml(&[gpu(1)], "node-a", version).unwrap());
            assert_eq!(docs.len(), 1, "{docs:?}");
            docs.into_iter().next().unwrap()
        };
        for (version, api, nested) in [
            (ApiVersion::V1, "resource.k8s.io/v1", false),
            (ApiVersion::V1beta2, "resource.k8s.io/v1beta2", false),
            (ApiVersion::V1beta1, "resource.k8s.io/v1beta1", true),
        ] {
            let s = slice(version);
            assert_eq!(s["apiVersion"], api, "{s}");
            assert_eq!(s["kind"], "ResourceSlice", "{s}");
            assert_eq!(s["spec"]["nodeName"], "node-a", "{s}");
            let device = &s["spec"]["devices"][0];
            // v1beta1 nests attributes and capacity under `basic`; v1 and v1beta2 do not.
            let (attributes, capacity) = if nested {
                assert!(device.get("attributes").is_none(), "{device}");
                (&device["basic"]["attributes"], &device["basic"]["capacity"])
            } else {
                assert!(device.get("basic").is_none(), "{device}");
                (&device["attributes"], &device["capacity"])
            };
            assert!(attributes["uuid"].is_object(), "{api}: {device}");
            assert!(capacity["memory"].is_object(), "{api}: {device}");
        }
    }

    #[test]
    fn the_api_version_is_checked_against_the_kubernetes_version() {
        use gpushare_slice::ApiVersion;
        assert_eq!(
            parse_api_version("resource.k8s.io/v1beta2"),
            Ok(ApiVersion::V1beta2)
        );
        assert_eq!(parse_api_version("v1beta1"), Ok(ApiVersion::V1beta1));
        let e = parse_api_version("resource.k8s.io/v1alpha3").unwrap_err();
        for accepted in [
            "resource.k8s.io/v1 ",
            "resource.k8s.io/v1beta2 ",
            "resource.k8s.io/v1beta1 ",
        ] {
            assert!(e.contains(accepted), "{e}");
        }
        assert!(e.contains("\"resource.k8s.io/v1alpha3\""), "{e}");
        // No Kubernetes version given: v1; given: the best it serves.
        assert_eq!(slice_api_version(None, None).unwrap(), ApiVersion::V1);
        assert_eq!(slice_api_version(None, Some(35)).unwrap(), ApiVersion::V1);
        assert_eq!(
            slice_api_version(Some(ApiVersion::V1beta1), Some(33)).unwrap(),
            ApiVersion::V1beta1
        );
        let e = slice_api_version(Some(ApiVersion::V1), Some(33))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Kubernetes 1.33 does not serve resource.k8s.io/v1 ")
                && e.contains("--api-version resource.k8s.io/v1beta2"),
            "{e}"
        );
    }

    #[test]
    fn the_sharing_column_speaks_as_the_claims_table() {
        // gpu(1) is shared through MIG: `MIG`, as `gpushare claims` writes `MIG(3g.20gb)`.
        let table = gpus_table(&[gpu(1)]);
        let row = table.lines().nth(1).unwrap();
        assert!(row.contains(" MIG ") && !row.contains("Mig"), "{table}");
    }
}
