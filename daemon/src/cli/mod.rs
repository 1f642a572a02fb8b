//! The operators' CLI: rendering what the daemon reports, and the demo.

pub mod container;
pub mod demo;

use std::fmt::Write as _;

use comfy_table::{presets, Table};
use gpushare_proto::{ClaimInfo, GpuInfo, HealthInfo, StrategyInfo, VersionInfo};
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
        Output::Yaml => Some(serde_norway::to_string(value)?),
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

/// Short description of a claim's strategies, e.g. `MPS(50.0%)+TimeSlicing(Short)`.
pub fn strategy_summary(c: &ClaimInfo) -> String {
    c.groups
        .iter()
        .map(|g| match &g.sharing {
            StrategyInfo::Exclusive => "Exclusive".to_string(),
            StrategyInfo::TimeSlicing { interval } => format!("TimeSlicing({})", interval.as_str()),
            StrategyInfo::Mps(m) if m.active_thread_percentage.is_empty() => {
                "MPS(starting)".to_string()
            }
            StrategyInfo::Mps(m) => format!("MPS({}%)", m.active_thread_percentage),
        })
        .collect::<Vec<_>>()
        .join("+")
}

/// The `gpushare gpus` table.
pub fn gpus_table(gpus: &[GpuInfo]) -> String {
    let mut t = table(&[
        "DEVICE",
        "UUID",
        "PRODUCT",
        "MEMORY",
        "COMPUTE MODE",
        "TIME-SLICE",
        "SHARING",
        "CLAIMS",
    ]);
    for g in gpus {
        t.add_row(vec![
            g.name.clone(),
            g.uuid.clone(),
            g.product_name.clone(),
            format!("{} MiB", g.memory_mib),
            format!("{:?}", g.compute_mode),
            g.time_slice.as_str().to_string(),
            format!("{:?}", g.sharing),
            g.claims.join(","),
        ]);
    }
    t.to_string() + "\n"
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
        let devices: Vec<String> = c.requests.iter().flat_map(|r| r.devices.clone()).collect();
        let attached = match c.attach_limit {
            Some(l) => format!("{}/{l}", c.attached.len()),
            None => format!("{}/-", c.attached.len()),
        };
        t.add_row(vec![
            c.uid.clone(),
            clean(&format!("{}/{}", c.namespace, c.name)),
            format!("{:?}", c.state),
            strategy_summary(c),
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
        let _ = writeln!(
            s,
            "Request {}: devices {} -> CDI {}",
            r.request,
            r.devices.join(","),
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
        match &g.sharing {
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
                for (ordinal, limit) in &m.pinned_device_memory_limits {
                    let shown = if limit.is_empty() {
                        "none"
                    } else {
                        limit.as_str()
                    };
                    // The ordinal counts the daemon's CUDA_VISIBLE_DEVICES (sorted UUIDs).
                    let device = ordinal
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| m.visible_devices.get(i))
                        .and_then(|uuid| g.devices.iter().find(|d| &d.uuid == uuid))
                        .map_or("?".to_string(), |d| d.device.clone());
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
    if h.stopping {
        let _ = writeln!(s, "stopping:     yes");
    }
    if let Some(q) = &h.checkpoint_quarantined {
        let _ = writeln!(s, "CHECKPOINT WAS CORRUPT: {}", clean(q));
    }
    if let Some(e) = &h.checkpoint_error {
        let _ = writeln!(s, "CHECKPOINT NOT WRITABLE: {}", clean(e));
    }
    s
}
