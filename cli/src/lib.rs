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
    /// Aligned columns for people, at most 120 characters wide: long cells shortened (claim
    /// UIDs to a unique prefix that `gpushare claim` and `unprepare` take back, long lists
    /// to their first items and a count).
    Table,
    /// The table with every column and every cell in full (claim UIDs, GPU and MIG UUIDs,
    /// compute modes, ...): `gpus`, `claims`, `mig list` and `profiles`.
    Wide,
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

/// Renders `value` as JSON or YAML; `None` for the tables ([`Output::Table`] and
/// [`Output::Wide`]).
///
/// # Errors
/// Serialization failed.
pub fn render_structured<T: Serialize>(
    value: &T,
    output: Output,
) -> anyhow::Result<Option<String>> {
    Ok(match output {
        Output::Table | Output::Wide => None,
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

/// The most characters a line of a `-o table` table takes: the trial of issue 29 read them in
/// 120-column terminals, where a longer line wraps and the columns are lost. `-o wide` has no
/// limit.
pub const TABLE_WIDTH: usize = 120;

/// The fewest characters of a claim UID the narrow tables show, as git and docker shorten
/// their IDs: 8 hex digits of Kubernetes' random UIDs almost never collide on one node, and
/// where they do the prefix grows until it is unique.
pub const SHORT_UID_LEN: usize = 8;

/// The one prefix length the narrow tables shorten `uids` to: [`SHORT_UID_LEN`], or more
/// where two of them share a longer start, so that each prefix [`short_uid`] makes names one
/// UID alone (and [`resolve_claim_uid`] takes it back). One length for all keeps the column
/// even.
pub fn short_uid_len<'a>(uids: impl IntoIterator<Item = &'a str>) -> usize {
    let mut sorted: Vec<&str> = uids.into_iter().collect();
    sorted.sort_unstable();
    sorted.dedup();
    // In sorted order the longest start a UID shares with any other is the one it shares
    // with a neighbour.
    sorted
        .windows(2)
        .map(|w| {
            w[0].chars()
                .zip(w[1].chars())
                .take_while(|(a, b)| a == b)
                .count()
                + 1
        })
        .fold(SHORT_UID_LEN, usize::max)
}

/// `uid` shortened to `len` characters ([`short_uid_len`]), or a little more where that
/// would end in `-`, `_` or `.`: a UID never ends so, and a prefix that did would look cut
/// in the middle of a word. A UID no longer than that is shown whole.
pub fn short_uid(uid: &str, len: usize) -> String {
    let chars: Vec<char> = uid.chars().collect();
    let mut end = len.min(chars.len());
    while end > 0 && end < chars.len() && !chars[end - 1].is_ascii_alphanumeric() {
        end += 1;
    }
    chars[..end].iter().collect()
}

/// A claim UID prefix given on the command line that more than one claim's UID starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmbiguousUid {
    /// What was given.
    pub given: String,
    /// The UIDs it starts, sorted.
    pub matches: Vec<String>,
}

/// How many of an ambiguous prefix's UIDs its error names: enough to see which to type, and
/// one line still when a prefix of one character matches hundreds.
const AMBIGUOUS_SHOWN: usize = 10;

impl std::fmt::Display for AmbiguousUid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<&str> = self
            .matches
            .iter()
            .take(AMBIGUOUS_SHOWN)
            .map(String::as_str)
            .collect();
        let more = self.matches.len().saturating_sub(AMBIGUOUS_SHOWN);
        write!(
            f,
            "{:?} is the start of {} claims' UIDs: {}{}; give more of the UID",
            self.given,
            self.matches.len(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    }
}

impl std::error::Error for AmbiguousUid {}

/// The claim UID that `given` (a claim UID or the start of one, as the narrow tables show
/// them) names among `uids`, the claims gpushared holds: `given` itself when a claim has
/// exactly that UID (a full UID always wins, even when it starts a longer one), else the one
/// UID that starts with it. With no match it is `given` itself, so that the daemon's answer
/// stays what it was before prefixes (no such claim).
///
/// # Errors
/// More than one UID starts with `given`, and none is `given`.
pub fn resolve_claim_uid<'a>(
    given: &str,
    uids: impl IntoIterator<Item = &'a str>,
) -> Result<String, AmbiguousUid> {
    let mut matches = Vec::new();
    for uid in uids {
        if uid == given {
            return Ok(uid.to_string());
        }
        if uid.starts_with(given) {
            matches.push(uid.to_string());
        }
    }
    matches.sort_unstable();
    matches.dedup();
    match matches.len() {
        0 => Ok(given.to_string()),
        1 => Ok(matches.remove(0)),
        _ => Err(AmbiguousUid {
            given: given.to_string(),
            matches,
        }),
    }
}

/// Characters a cell takes on the screen: every character the tables print is one column
/// wide (ASCII, and `…`).
fn width(s: &str) -> usize {
    s.chars().count()
}

/// `s` cut to `max` characters, the cut marked by a final `…`.
fn cut_end(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    let kept: String = s.chars().take(max.saturating_sub(1)).collect();
    kept + "…"
}

/// `s` cut to `max` characters in its middle: claim names end in what tells them apart
/// (`…-gpu-claim-4xk9q`, a generated suffix) and start with their namespace, so both ends
/// stay.
fn cut_middle(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    let keep = max.saturating_sub(1);
    let head = keep.div_ceil(2);
    let chars: Vec<char> = s.chars().collect();
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - (keep - head)..]);
    out
}

/// `items` joined by `sep` in at most `budget` characters: all of them when they fit, else
/// the first ones and ` +<n> more`, else the first and ` +<n>` (a MIG device's name is 20
/// characters), else `<n> <plural>`; a lone item too long is cut.
fn fit_list(items: &[String], sep: &str, budget: usize, plural: &str) -> String {
    let all = items.join(sep);
    if width(&all) <= budget {
        return all;
    }
    if let [one] = items {
        return cut_end(one, budget);
    }
    for shown in (1..items.len()).rev() {
        let text = format!("{} +{} more", items[..shown].join(sep), items.len() - shown);
        if width(&text) <= budget {
            return text;
        }
    }
    let first = format!("{} +{}", items[0], items.len() - 1);
    if width(&first) <= budget {
        return first;
    }
    cut_end(&format!("{} {plural}", items.len()), budget)
}

/// A cell of a narrow table, and how it gives way when the row is too wide.
#[derive(Clone)]
enum Cell {
    /// Shown whole: bounded where it is made.
    Whole(String),
    /// Cut at its end ([`cut_end`]).
    End(String),
    /// Cut in its middle ([`cut_middle`]).
    Middle(String),
    /// A list: as many items as fit and a count ([`fit_list`]), joined by the separator;
    /// the plural names the items when none fits.
    List(Vec<String>, &'static str, &'static str),
}

impl Cell {
    /// Its width in full.
    fn natural(&self) -> usize {
        match self {
            Cell::Whole(s) | Cell::End(s) | Cell::Middle(s) => width(s),
            Cell::List(items, sep, _) => width(&items.join(sep)),
        }
    }

    /// It in at most `max` characters (a [`Cell::Whole`] whole).
    fn fit(&self, max: usize) -> String {
        match self {
            Cell::Whole(s) => s.clone(),
            Cell::End(s) => cut_end(s, max),
            Cell::Middle(s) => cut_middle(s, max),
            Cell::List(items, sep, plural) => fit_list(items, sep, max, plural),
        }
    }
}

/// A column of a narrow table: its header, and for one whose cells give way, the width
/// they keep at least and its rank for the room left (lower first).
struct Column {
    header: &'static str,
    give: Option<(usize, u8)>,
}

/// A table at most [`TABLE_WIDTH`] wide: columns whose cells give way start at their floor
/// (or less, when nothing in them is wider), then share what the others leave by rank, each up
/// to its widest cell. The floors are chosen so that, with every other column bounded where
/// its cells are made, the sum fits.
fn fitted_table(columns: &[Column], rows: Vec<Vec<Cell>>) -> String {
    let mut natural: Vec<usize> = columns.iter().map(|c| width(c.header)).collect();
    for row in &rows {
        for (n, cell) in natural.iter_mut().zip(row) {
            *n = (*n).max(cell.natural());
        }
    }
    let mut widths: Vec<usize> = columns
        .iter()
        .zip(&natural)
        .map(|(c, &n)| match c.give {
            Some((floor, _)) => n.min(floor.max(width(c.header))),
            None => n,
        })
        .collect();
    let mut ranked: Vec<(u8, usize)> = columns
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.give.map(|(_, rank)| (rank, i)))
        .collect();
    ranked.sort_unstable();
    // comfy-table pads every cell with one space on each side.
    let taken: usize = widths.iter().map(|w| w + 2).sum();
    let mut room = TABLE_WIDTH.saturating_sub(taken);
    // The width column `i`'s cells take when given `w` (a list may take less: `gpu-0,gpu-1
    // +6 more` in 22), never more than `w`.
    let used_at = |i: usize, w: usize| {
        rows.iter()
            .map(|row| width(&row[i].fit(w)))
            .fold(width(columns[i].header), usize::max)
    };
    // What a column leaves of its floor is room for the others too.
    for &(_, i) in &ranked {
        let used = used_at(i, widths[i]);
        room += widths[i] - used;
        widths[i] = used;
    }
    for &(_, i) in &ranked {
        let offered = (widths[i] + room).min(natural[i]);
        if offered > widths[i] {
            let used = used_at(i, offered);
            room = room + widths[i] - used;
            widths[i] = used;
        }
    }
    let mut t = table(&columns.iter().map(|c| c.header).collect::<Vec<_>>());
    for row in &rows {
        t.add_row(
            row.iter()
                .zip(&widths)
                .map(|(c, &w)| c.fit(w))
                .collect::<Vec<_>>(),
        );
    }
    t.to_string() + "\n"
}

/// The fewest characters of a product name the narrow `gpus` table keeps: NVIDIA's longest on
/// EC2 (`NVIDIA A100-SXM4-80GB`) whole.
const PRODUCT_WIDTH: usize = 21;

/// The fewest characters of the narrow `gpus` table's claims: one short UID and a count
/// (`3f75ec50 +6`) beside the longest MIG column.
const GPU_CLAIMS_WIDTH: usize = 12;

/// The `gpushare gpus` table, the same for real and simulated nodes, at most
/// [`TABLE_WIDTH`] wide: each GPU's product, memory, MIG mode, sharing and claims (UIDs
/// shortened; the first ones and a count where they do not fit). MIG: `-` for a GPU without
/// MIG, `off`, or `on (<n> device(s))`, followed by a mode change that waits for a GPU reset
/// (`off (enable pending a GPU reset)`). [`gpus_table_wide`] adds the UUID, architecture,
/// compute capability, compute mode and time-slice.
pub fn gpus_table(gpus: &[GpuInfo]) -> String {
    let len = short_uid_len(gpus.iter().flat_map(|g| &g.claims).map(String::as_str));
    let rows = gpus
        .iter()
        .map(|g| {
            vec![
                Cell::Whole(g.name.clone()),
                Cell::End(g.product_name.clone()),
                Cell::Whole(format!("{} MiB", g.memory_mib)),
                Cell::Whole(mig_column(g)),
                Cell::Whole(sharing_label(g.sharing).to_string()),
                Cell::List(
                    g.claims.iter().map(|c| short_uid(c, len)).collect(),
                    ",",
                    "claims",
                ),
            ]
        })
        .collect();
    let whole = |header| Column { header, give: None };
    fitted_table(
        &[
            whole("DEVICE"),
            Column {
                header: "PRODUCT",
                give: Some((PRODUCT_WIDTH, 1)),
            },
            whole("MEMORY"),
            whole("MIG"),
            whole("SHARING"),
            Column {
                header: "CLAIMS",
                give: Some((GPU_CLAIMS_WIDTH, 0)),
            },
        ],
        rows,
    )
}

/// `gpushare gpus -o wide`: every column of [`gpus_table`] and the GPU's UUID, architecture,
/// CUDA compute capability, compute mode and time-slice, every cell in full.
pub fn gpus_table_wide(gpus: &[GpuInfo]) -> String {
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
        t.add_row(vec![
            g.name.clone(),
            g.uuid.clone(),
            g.product_name.clone(),
            g.architecture.clone(),
            g.cuda_compute_capability.clone(),
            format!("{} MiB", g.memory_mib),
            mig_column(g),
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

/// The `gpushare mig list` table: every MIG instance of every GPU with its profile,
/// placement and owner claim (its UID shortened; `-` for instances no claim owns, such as a
/// layout's). [`mig_table_wide`] adds the instance's UUID and the owner's whole UID.
pub fn mig_table(gpus: &[GpuInfo]) -> String {
    mig_table_in(gpus, false)
}

/// `gpushare mig list -o wide`: [`mig_table`] with each instance's MIG UUID (`(no compute
/// instance)` without one) and the owner's whole UID.
pub fn mig_table_wide(gpus: &[GpuInfo]) -> String {
    mig_table_in(gpus, true)
}

fn mig_table_in(gpus: &[GpuInfo], wide: bool) -> String {
    let mut header = vec![
        "GPU",
        "MIG DEVICE",
        "PROFILE",
        "GI PROFILE",
        "PLACEMENT",
        "GI",
        "MEMORY",
        "SMS",
    ];
    if wide {
        header.push("UUID");
    }
    header.push("OWNER");
    let mut t = table(&header);
    let len = short_uid_len(
        gpus.iter()
            .flat_map(|g| &g.mig_devices)
            .filter_map(|d| d.owner.as_deref()),
    );
    for g in gpus {
        for d in &g.mig_devices {
            let mut row = vec![
                g.name.clone(),
                d.device_name(g.minor),
                d.profile.clone(),
                d.gi_profile_id.to_string(),
                format!("{}:{}", d.placement_start, d.memory_slices),
                d.gi_id.map_or_else(|| "-".into(), |i| i.to_string()),
                format!("{} MiB", d.memory_mib),
                d.multiprocessors.to_string(),
            ];
            if wide {
                row.push(if d.uuid.is_empty() {
                    "(no compute instance)".into()
                } else {
                    d.uuid.clone()
                });
            }
            row.push(match &d.owner {
                None => "-".into(),
                Some(o) if wide => o.clone(),
                Some(o) => short_uid(o, len),
            });
            t.add_row(row);
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

/// The fewest characters of `<namespace>/<name>` the narrow `claims` table keeps (cut in the
/// middle): a namespace and a name may each be 63 characters and more.
const CLAIM_NAME_WIDTH: usize = 32;

/// The fewest characters of a claim's strategy the narrow `claims` table keeps: one group's
/// longest (`MIG(3g.20gb)+MPS(100.0%)`) whole.
const STRATEGY_WIDTH: usize = 24;

/// The fewest characters of a claim's devices the narrow `claims` table keeps: a MIG
/// device's name (20) and a count, or three GPUs and a count.
const CLAIM_DEVICES_WIDTH: usize = 22;

/// The devices of a claim as the tables list them, request by request.
fn claim_devices(c: &ClaimInfo) -> Vec<String> {
    c.requests
        .iter()
        .flat_map(|r| request_devices(c, r))
        .collect()
}

/// `<attached>/<limit>` (`-` when unlimited).
fn attached_column(c: &ClaimInfo) -> String {
    match c.attach_limit {
        Some(l) => format!("{}/{l}", c.attached.len()),
        None => format!("{}/-", c.attached.len()),
    }
}

/// The groups of a claim's strategy, in [`ClaimInfo::strategy_summary`]'s words, one item
/// each so that a cut never falls inside one.
fn strategy_groups(c: &ClaimInfo) -> Vec<String> {
    c.groups.iter().map(|g| g.strategy_summary()).collect()
}

/// The `gpushare claims` table, at most [`TABLE_WIDTH`] wide: UIDs shortened to a unique
/// prefix (which `gpushare claim` and `unprepare` take), `<namespace>/<name>` cut in the
/// middle, strategies and devices as many as fit and a count. [`claims_table_wide`] has them
/// all in full.
pub fn claims_table(claims: &[ClaimInfo]) -> String {
    let len = short_uid_len(claims.iter().map(|c| c.uid.as_str()));
    let rows = claims
        .iter()
        .map(|c| {
            vec![
                Cell::Whole(short_uid(&c.uid, len)),
                Cell::Middle(clean(&format!("{}/{}", c.namespace, c.name))),
                Cell::Whole(format!("{:?}", c.state)),
                Cell::List(strategy_groups(c), "+", "strategies"),
                Cell::List(claim_devices(c), ",", "devices"),
                Cell::Whole(attached_column(c)),
            ]
        })
        .collect();
    let whole = |header| Column { header, give: None };
    fitted_table(
        &[
            whole("UID"),
            Column {
                header: "NAMESPACE/NAME",
                give: Some((CLAIM_NAME_WIDTH, 2)),
            },
            whole("STATE"),
            Column {
                header: "STRATEGY",
                give: Some((STRATEGY_WIDTH, 1)),
            },
            Column {
                header: "DEVICES",
                give: Some((CLAIM_DEVICES_WIDTH, 0)),
            },
            whole("ATTACHED"),
        ],
        rows,
    )
}

/// The pods whose containers are attached to a claim, each once, in the order they attached
/// (their names only: a pod is always in its claim's namespace). Containers whose runtime named
/// no pod are left out.
fn claim_pods(c: &ClaimInfo) -> Vec<String> {
    let mut pods: Vec<String> = Vec::new();
    for p in c.attached.iter().filter_map(|a| a.pod.as_ref()) {
        let shown = if p.namespace == c.namespace {
            clean(&p.name)
        } else {
            clean(&p.to_string())
        };
        if !pods.contains(&shown) {
            pods.push(shown);
        }
    }
    pods
}

/// `gpushare claims -o wide`: every claim's whole UID, name, strategy and devices, its
/// restarts (of its MPS control daemons) and the pods attached to it.
pub fn claims_table_wide(claims: &[ClaimInfo]) -> String {
    let mut t = table(&[
        "UID",
        "NAMESPACE/NAME",
        "STATE",
        "STRATEGY",
        "DEVICES",
        "ATTACHED",
        "RESTARTS",
        "PODS",
    ]);
    for c in claims {
        t.add_row(vec![
            c.uid.clone(),
            clean(&format!("{}/{}", c.namespace, c.name)),
            format!("{:?}", c.state),
            c.strategy_summary(),
            claim_devices(c).join(","),
            attached_column(c),
            c.restarts.to_string(),
            match claim_pods(c) {
                pods if pods.is_empty() => "-".into(),
                pods => pods.join(","),
            },
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
            "  container {} pid {} pod {} cgroup {}",
            clean(&a.container_id),
            a.pid.map_or("-".into(), |p| p.to_string()),
            a.pod.as_ref().map_or("-".into(), |p| clean(&p.to_string())),
            a.cgroup.as_deref().unwrap_or("-")
        );
    }
    let pods = claim_pods(c);
    if !pods.is_empty() {
        let _ = writeln!(s, "Pods:       {}", pods.join(", "));
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

    /// A Kubernetes-like claim UID (a v4 UUID's shape), different for each `n`.
    fn k8s_uid(n: u64) -> String {
        let h = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995_1234_5678;
        let g = h.rotate_left(29).wrapping_mul(0xff51_afd7_ed55_8ccd);
        format!(
            "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
            h >> 32,
            (h >> 16) & 0xffff,
            h & 0xfff,
            g >> 52,
            g & 0xffff_ffff_ffff
        )
    }

    /// Every line of `table` at most [`TABLE_WIDTH`] characters.
    fn assert_fits(table: &str) {
        for line in table.lines() {
            assert!(
                width(line) <= TABLE_WIDTH,
                "{} characters:\n{line}\nin\n{table}",
                width(line)
            );
        }
    }

    /// The row of `table` whose first cell is `first`.
    fn row<'a>(table: &'a str, first: &str) -> &'a str {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no row {first}:\n{table}"))
    }

    /// A MIG device of `gpu_minor` at `start`, owned by `owner`.
    fn mig_device(
        profile: &str,
        gi_profile_id: u32,
        start: u32,
        owner: Option<&str>,
    ) -> serde_json::Value {
        serde_json::json!({
            "uuid": format!("MIG-{}", k8s_uid(u64::from(gi_profile_id * 100 + start))),
            "profile": profile, "gi_profile_id": gi_profile_id, "placement_start": start,
            "memory_slices": 1, "memory_mib": 4864, "multiprocessors": 14, "copy_engines": 1,
            "decoders": 0, "encoders": 0, "jpeg_engines": 0, "ofa_engines": 0, "gi_id": start + 7,
            "owner": owner,
        })
    }

    /// A busy p4d.24xlarge: every MIG state the MIG column words (7 slices on, a disable and
    /// an enable pending a reset), GPUs shared by many claims, and the longest sharing words.
    fn busy_node(uids: &[String]) -> Vec<GpuInfo> {
        let gpu = |minor: u32,
                   sharing: &str,
                   compute_mode: &str,
                   mig: serde_json::Value,
                   claims: &[String]| {
            let mut g = serde_json::json!({
                "name": format!("gpu-{minor}"), "minor": minor,
                "uuid": format!("GPU-{}", k8s_uid(u64::from(minor) + 1000)),
                "product_name": "NVIDIA A100-SXM4-40GB", "architecture": "Ampere",
                "cuda_compute_capability": "8.0", "memory_mib": 40960,
                "compute_mode": compute_mode, "time_slice": "Medium", "sharing": sharing,
                "claims": claims, "mig_capable": true, "mig_enabled": false,
            });
            g.as_object_mut()
                .unwrap()
                .extend(mig.as_object().unwrap().clone());
            serde_json::from_value::<GpuInfo>(g).unwrap()
        };
        let seven: Vec<serde_json::Value> = (0..7)
            .map(|i| mig_device("1g.5gb", 19, i, uids.get(i as usize).map(String::as_str)))
            .collect();
        let off = serde_json::json!({});
        vec![
            gpu(
                0,
                "Mig",
                "Default",
                serde_json::json!({"mig_enabled": true, "mig_pending": true, "mig_devices": seven}),
                &uids[..7],
            ),
            gpu(
                1,
                "Free",
                "Default",
                serde_json::json!({"mig_pending": true}),
                &[],
            ),
            gpu(2, "TimeSlicing", "Default", off.clone(), &uids[7..12]),
            gpu(3, "Mps", "ExclusiveProcess", off.clone(), &uids[12..14]),
            gpu(4, "Exclusive", "Default", off.clone(), &uids[14..15]),
            gpu(5, "TimeSlicing", "Default", off.clone(), &uids[15..17]),
            gpu(6, "Mps", "ExclusiveProcess", off.clone(), &uids[17..18]),
            gpu(7, "Free", "Prohibited", off, &[]),
        ]
    }

    #[test]
    fn a_whole_uid_wins_a_unique_start_names_its_claim_and_an_ambiguous_one_names_all() {
        let uids = [
            "3f75ec50-6fb8-4f09-a085-ef34f55a38b9",
            "3f75ec50-6fb8-4f09-a085-ef34f55a38b9x",
            "3f7aaaaa-0000-4000-a000-000000000000",
            "9b2c0d11-1111-4111-a111-111111111111",
        ];
        let resolve = |given: &str| resolve_claim_uid(given, uids.iter().copied());
        // A whole UID, even one that starts another.
        assert_eq!(resolve(uids[0]).unwrap(), uids[0]);
        assert_eq!(resolve(uids[1]).unwrap(), uids[1]);
        // A unique start, however short.
        assert_eq!(resolve("9b2c0d11").unwrap(), uids[3]);
        assert_eq!(resolve("9").unwrap(), uids[3]);
        assert_eq!(resolve("3f7a").unwrap(), uids[2]);
        // No claim: what was given, for the daemon to answer as before.
        assert_eq!(resolve("0123abcd").unwrap(), "0123abcd");
        assert_eq!(
            resolve("9b2c0d11-1111-4111-a111-111111111111x").unwrap(),
            "9b2c0d11-1111-4111-a111-111111111111x"
        );
        // Several: an error naming each, sorted.
        let e = resolve("3f7").unwrap_err();
        assert_eq!(e.matches, [uids[0], uids[1], uids[2]]);
        assert_eq!(
            e.to_string(),
            format!(
                "\"3f7\" is the start of 3 claims' UIDs: {}, {}, {}; give more of the UID",
                uids[0], uids[1], uids[2]
            )
        );
        assert!(resolve("3f75ec50").is_err());
    }

    #[test]
    fn an_ambiguous_start_of_many_uids_names_ten_and_counts_the_rest() {
        let uids: Vec<String> = (0..25).map(|n| format!("c{n:02}-uid")).collect();
        let e = resolve_claim_uid("c", uids.iter().map(String::as_str)).unwrap_err();
        assert_eq!(e.matches.len(), 25);
        let text = e.to_string();
        assert!(
            text.starts_with("\"c\" is the start of 25 claims' UIDs: c00-uid, c01-uid,"),
            "{text}"
        );
        assert!(
            text.contains("c09-uid and 15 more; give more of the UID"),
            "{text}"
        );
        assert!(!text.contains("c10-uid"), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    #[test]
    fn short_uids_are_eight_characters_unless_longer_ones_are_needed_and_resolve_back() {
        let random: Vec<String> = (0..200).map(k8s_uid).collect();
        let len = short_uid_len(random.iter().map(String::as_str));
        assert_eq!(len, SHORT_UID_LEN);
        // Two UIDs alike in their first 10 characters: 11 for all, so that each prefix is
        // one claim's.
        let mut alike = random[..3].to_vec();
        alike.push(format!(
            "{}{}",
            &random[0][..10],
            "ffff-4fff-afff-ffffffffffff"
        ));
        let len = short_uid_len(alike.iter().map(String::as_str));
        assert_eq!(len, 11);
        for set in [&random, &alike] {
            let len = short_uid_len(set.iter().map(String::as_str));
            for uid in set.iter() {
                let short = short_uid(uid, len);
                assert!(
                    uid.starts_with(&short) && short.len() < uid.len(),
                    "{short}"
                );
                assert_eq!(
                    &resolve_claim_uid(&short, set.iter().map(String::as_str)).unwrap(),
                    uid
                );
            }
        }
        // A UID that starts another is shown whole, which then names it alone.
        let nested = ["e2e-a", "e2e-ab", "e2e-abc-0"];
        let len = short_uid_len(nested);
        for uid in nested {
            assert_eq!(
                resolve_claim_uid(&short_uid(uid, len), nested).unwrap(),
                uid
            );
        }
        // Never cut just after a '-': a UUID's 9th character is one.
        assert_eq!(
            short_uid("3f75ec50-6fb8-4f09-a085-ef34f55a38b9", 9),
            "3f75ec50-6"
        );
        assert_eq!(short_uid("short", 8), "short");
    }

    #[test]
    fn long_cells_are_cut_visibly_and_long_lists_summarised() {
        assert_eq!(
            cut_end("NVIDIA RTX PRO 6000 Blackwell Server Edition", 24),
            "NVIDIA RTX PRO 6000 Bla…"
        );
        assert_eq!(
            cut_middle(
                "ml-inference-production/llama-3-70b-serving-claim-7fj2k",
                28
            ),
            "ml-inference-p…g-claim-7fj2k"
        );
        assert_eq!(width(&cut_middle(&"x".repeat(300), 28)), 28);
        let gpus: Vec<String> = (0..8).map(|i| format!("gpu-{i}")).collect();
        assert_eq!(fit_list(&gpus, ",", 47, "devices"), gpus.join(","));
        assert_eq!(
            fit_list(&gpus, ",", 26, "devices"),
            "gpu-0,gpu-1,gpu-2 +5 more"
        );
        assert_eq!(fit_list(&gpus, ",", 12, "devices"), "gpu-0 +7");
        let mig = vec!["gpu-2-mig-3g20gb-9-4".to_string(); 3];
        assert_eq!(fit_list(&mig, ",", 12, "devices"), "3 devices");
        assert_eq!(fit_list(&gpus[..1], ",", 3, "devices"), "gp…");
        assert_eq!(fit_list(&[], ",", 3, "devices"), "");
    }

    #[test]
    fn the_gpus_table_of_a_busy_eight_gpu_node_fits_and_wide_shows_it_all() {
        let uids: Vec<String> = (0..18).map(k8s_uid).collect();
        let gpus = busy_node(&uids);
        let narrow = gpus_table(&gpus);
        assert_fits(&narrow);
        assert_eq!(narrow.lines().count(), 9, "{narrow}");
        let short = |n: usize| uids[n][..SHORT_UID_LEN].to_string();
        let gpu0 = row(&narrow, "gpu-0");
        assert!(
            gpu0.contains("on (7 devices)") && gpu0.contains(" MIG "),
            "{gpu0}"
        );
        assert!(
            gpu0.contains(&format!("{},{} +5 more", short(0), short(1))),
            "{gpu0}"
        );
        assert!(
            row(&narrow, "gpu-1").contains("off (enable pending a GPU reset)"),
            "{narrow}"
        );
        assert!(
            row(&narrow, "gpu-4").split_whitespace().last() == Some(short(14).as_str()),
            "{narrow}"
        );
        // What the narrow table leaves out.
        for left_out in ["GPU-", "ExclusiveProcess", "Medium", "Ampere", &uids[0]] {
            assert!(!narrow.contains(left_out), "{left_out} in\n{narrow}");
        }
        let wide = gpus_table_wide(&gpus);
        let gpu0 = row(&wide, "gpu-0");
        assert!(gpu0.contains(&uids[..7].join(",")), "{gpu0}");
        assert!(
            gpu0.contains(&gpus[0].uuid) && gpu0.contains("Ampere") && gpu0.contains("8.0"),
            "{gpu0}"
        );
        let gpu3 = row(&wide, "gpu-3");
        assert!(
            gpu3.contains("ExclusiveProcess") && gpu3.contains("Medium") && gpu3.contains(" MPS "),
            "{gpu3}"
        );
        // A disable pending: the longest MIG words, still within the width.
        let mut pending = gpus.clone();
        pending[0].mig_pending = Some(false);
        pending[0].product_name = "NVIDIA RTX PRO 6000 Blackwell Server Edition".into();
        let narrow = gpus_table(&pending);
        assert_fits(&narrow);
        assert!(
            row(&narrow, "gpu-0").contains("on (7 devices; disable pending a GPU reset)"),
            "{narrow}"
        );
        assert!(
            row(&narrow, "gpu-0").contains("  NVIDIA RTX PRO 6000 B…  "),
            "{narrow}"
        );
        assert!(
            row(&narrow, "gpu-0").contains(&format!("{} +6 ", short(0))),
            "{narrow}"
        );
    }

    #[test]
    fn the_mig_table_of_seven_slices_fits_and_wide_adds_uuids_and_whole_owners() {
        let uids: Vec<String> = (0..18).map(k8s_uid).collect();
        let mut gpus = busy_node(&uids);
        // All eight GPUs cut into seven slices each.
        for g in &mut gpus {
            g.mig_devices = gpus_of_slices(&uids);
        }
        let narrow = mig_table(&gpus);
        assert_fits(&narrow);
        assert_eq!(narrow.lines().count(), 1 + 8 * 7, "{narrow}");
        let first = narrow.lines().nth(1).unwrap();
        assert!(
            first.starts_with(" gpu-0 ")
                && first.contains("gpu-0-mig-1g5gb-19-0")
                && first.trim_end().ends_with(&uids[0][..SHORT_UID_LEN]),
            "{first}"
        );
        assert!(
            !narrow.contains("MIG-") && !narrow.contains(&uids[0]),
            "{narrow}"
        );
        let wide = mig_table_wide(&gpus);
        let first = wide.lines().nth(1).unwrap();
        assert!(
            first.contains("MIG-") && first.trim_end().ends_with(&uids[0]),
            "{first}"
        );
    }

    fn gpus_of_slices(uids: &[String]) -> Vec<gpushare_proto::MigDeviceInfo> {
        (0..7)
            .map(|i| {
                serde_json::from_value(mig_device("1g.5gb", 19, i, Some(&uids[i as usize])))
                    .unwrap()
            })
            .collect()
    }

    /// A claim `uid` of `namespace/name` on `devices` of request `gpu`, with `strategies`
    /// (one group each).
    fn claim_info(
        uid: &str,
        name: &str,
        state: &str,
        strategies: &[serde_json::Value],
        devices: &[&str],
    ) -> ClaimInfo {
        let groups: Vec<serde_json::Value> = strategies
            .iter()
            .map(|sharing| serde_json::json!({"requests": ["gpu"], "devices": [], "sharing": sharing}))
            .collect();
        let (namespace, name) = name.split_once('/').unwrap();
        serde_json::from_value(serde_json::json!({
            "uid": uid, "namespace": namespace, "name": name, "state": state, "groups": groups,
            "requests": [{"request": "gpu", "devices": devices, "cdi_device_ids": []}],
            "cdi_spec": "/var/run/cdi/x.json", "attach_limit": 16,
            "attached": (0..12).map(|i| serde_json::json!({"claim_uid": uid, "container_id": format!("c{i}"), "pid": null, "cgroup": null, "bundle": null, "attached_at": 0})).collect::<Vec<_>>(),
            "restarts": 3,
        }))
        .unwrap()
    }

    #[test]
    fn the_pods_attached_to_a_claim_are_named_once_each_in_wide_and_in_its_detail() {
        let ts = serde_json::json!({"strategy": "TimeSlicing", "interval": "Default"});
        let uid = k8s_uid(0);
        let mut c = claim_info(&uid, "team-a/shared", "Prepared", &[ts], &["gpu-0"]);
        let attach = |container: &str, pod: Option<(&str, &str)>| -> gpushare_proto::Attachment {
            serde_json::from_value(
                serde_json::json!({"claim_uid": uid, "container_id": container,
                "pid": 7, "cgroup": null, "bundle": null, "attached_at": 0,
                "pod": pod.map(|(ns, name)| serde_json::json!({"namespace": ns, "name": name}))}),
            )
            .unwrap()
        };
        c.attached = vec![
            attach("c1", Some(("team-a", "trainer-0"))),
            // A second container of the same pod, and one started outside Kubernetes.
            attach("c2", Some(("team-a", "trainer-0"))),
            attach("c3", None),
            attach("c4", Some(("team-a", "trainer-1"))),
        ];
        let wide = claims_table_wide(std::slice::from_ref(&c));
        let header = wide.lines().next().unwrap();
        assert!(header.trim_end().ends_with("PODS"), "{wide}");
        assert!(
            wide.lines()
                .nth(1)
                .unwrap()
                .trim_end()
                .ends_with(" trainer-0,trainer-1"),
            "{wide}"
        );
        let detail = claim_detail(&c);
        assert!(
            detail.contains("  container c1 pid 7 pod team-a/trainer-0 cgroup -"),
            "{detail}"
        );
        assert!(
            detail.contains("  container c3 pid 7 pod - cgroup -"),
            "{detail}"
        );
        assert!(
            detail.contains("Pods:       trainer-0, trainer-1\n"),
            "{detail}"
        );
        // No pod known: a dash, and no Pods line.
        c.attached.truncate(0);
        c.attached.push(attach("c3", None));
        assert!(
            claims_table_wide(std::slice::from_ref(&c))
                .lines()
                .nth(1)
                .unwrap()
                .trim_end()
                .ends_with(" -"),
            "{}",
            claims_table_wide(std::slice::from_ref(&c))
        );
        assert!(!claim_detail(&c).contains("Pods:"));
    }

    #[test]
    fn the_claims_table_of_claims_with_many_devices_fits_and_wide_shows_them_whole() {
        let mps = serde_json::json!({"strategy": "Mps", "control_daemon_pid": 7, "pipe_dir": "/p",
            "log_dir": "/l", "shm_dir": "/s", "visible_devices": [], "active_thread_percentage": "100.0",
            "pinned_device_memory_limits": {}});
        let ts = serde_json::json!({"strategy": "TimeSlicing", "interval": "Default"});
        let uids: Vec<String> = (0..3).map(k8s_uid).collect();
        let all8: Vec<String> = (0..8).map(|i| format!("gpu-{i}")).collect();
        let all8: Vec<&str> = all8.iter().map(String::as_str).collect();
        let claims = vec![
            claim_info(
                &uids[0],
                "ml-inference-production/llama-3-70b-instruct-serving-gpu-claim-7fj2k",
                "PrepareStarted",
                &[mps.clone(), ts.clone()],
                &all8,
            ),
            claim_info(
                &uids[1],
                "default/inference-pod-gpu-claim-4xk9q",
                "Degraded",
                &[mps],
                &[
                    "gpu-2-mig-3g20gb-9-4",
                    "gpu-3-mig-3g20gb-9-0",
                    "gpu-4-mig-3g20gb-9-4",
                ],
            ),
            claim_info(&uids[2], "team-a/train", "Prepared", &[ts], &["gpu-0"]),
        ];
        let narrow = claims_table(&claims);
        assert_fits(&narrow);
        let header = narrow.lines().next().unwrap();
        assert!(
            header.split_whitespace().eq([
                "UID",
                "NAMESPACE/NAME",
                "STATE",
                "STRATEGY",
                "DEVICES",
                "ATTACHED"
            ]),
            "{header}"
        );
        let first = row(&narrow, &uids[0][..SHORT_UID_LEN]);
        for want in [
            "  ml-inference-pro…-gpu-claim-7fj2k  ",
            "PrepareStarted",
            "MPS(100.0%) +1 more",
            "gpu-0,gpu-1,gpu-2 +5 more",
            "12/16",
        ] {
            assert!(first.contains(want), "{want} in\n{narrow}");
        }
        let second = row(&narrow, &uids[1][..SHORT_UID_LEN]);
        assert!(
            second.contains("  default/inferenc…-gpu-claim-4xk9q  ")
                && second.contains("gpu-2-mig-3g20gb-9-4 +2 "),
            "{narrow}"
        );
        assert!(
            row(&narrow, &uids[2][..SHORT_UID_LEN]).contains("TimeSlicing(Default)"),
            "{narrow}"
        );
        // Each shortened UID is what `gpushare claim` takes back.
        for uid in &uids {
            assert_eq!(
                &resolve_claim_uid(&uid[..SHORT_UID_LEN], uids.iter().map(String::as_str)).unwrap(),
                uid
            );
        }
        let wide = claims_table_wide(&claims);
        let first = row(&wide, &uids[0]);
        for want in [
            "ml-inference-production/llama-3-70b-instruct-serving-gpu-claim-7fj2k",
            "MPS(100.0%)+TimeSlicing(Default)",
            &all8.join(","),
            "12/16",
        ] {
            assert!(first.contains(want), "{want} in\n{wide}");
        }
        assert!(
            wide.lines()
                .next()
                .unwrap()
                .trim_end()
                .ends_with("RESTARTS  PODS")
                && first.trim_end().ends_with(" 3         -"),
            "{wide}"
        );
    }

    #[test]
    fn the_profiles_table_fits() {
        let rows: Vec<ProfileRow> = catalog::catalog()
            .unwrap()
            .iter()
            .map(ProfileRow::of)
            .collect();
        assert_fits(&profiles_table(&rows));
    }

    #[test]
    fn the_sharing_column_speaks_as_the_claims_table() {
        // gpu(1) is shared through MIG: `MIG`, as `gpushare claims` writes `MIG(3g.20gb)`.
        let table = gpus_table(&[gpu(1)]);
        let row = table.lines().nth(1).unwrap();
        assert!(row.contains(" MIG ") && !row.contains("Mig"), "{table}");
    }
}
