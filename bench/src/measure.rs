//! The measurements, in the order, each beside its baseline.

use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpushare_proto::{
    AttachParams, ClaimInfo, Client, DetachParams, DetachResult, Method, UidParams,
};
use serde_json::{json, Value};

use crate::daemon::{
    claim, cpu_time, durable_rewrite, exclusive_params, mps_params, prepare, rss_kib,
    time_slicing_params, unprepare, Daemon, Uids,
};
use crate::report::{ms, num, Report, Row, Section, Target};
use crate::stats::{ratio, summarize, Summary};
use crate::Cli;

mod cluster;
mod mps_scale;

/// How much of everything to do.
#[derive(Debug, Clone)]
struct Sizes {
    hook: usize,
    /// Lifecycles a side of the device-less bundle (the target's figure).
    shim: usize,
    /// Of those rounds, every `shim_cdi_every`-th also runs the CDI bundle's pair.
    shim_cdi_every: usize,
    passthrough: usize,
    podman: usize,
    cycles: usize,
    scale: Vec<usize>,
    clients: usize,
    per_client: usize,
    idle: Duration,
    restarts: usize,
    dra: usize,
    /// Batches the smallest scaling size (the per-claim baseline) is timed over.
    baseline_rounds: usize,
    /// Time-sliced claims held during section 4c's MPS cycles (NVIDIA's program).
    mps_scale_held: usize,
    /// Section 11: pods a side, with an MPS claim and without.
    cluster_pairs: usize,
    /// Section 11: pods with claims created and deleted in a row.
    cluster_pods: usize,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            hook: 1500,
            shim: 300,
            shim_cdi_every: 3,
            passthrough: 100,
            podman: 10,
            cycles: 100,
            scale: vec![10, 100, 1000],
            clients: 64,
            per_client: 8,
            idle: Duration::from_secs(60),
            restarts: 15,
            dra: 60,
            baseline_rounds: 10,
            mps_scale_held: 10_000,
            cluster_pairs: 20,
            cluster_pods: 50,
        }
    }

    fn smoke() -> Sizes {
        Sizes {
            hook: 10,
            shim: 2,
            shim_cdi_every: 1,
            passthrough: 5,
            podman: 1,
            cycles: 5,
            scale: vec![10, 20],
            clients: 4,
            per_client: 2,
            idle: Duration::from_secs(2),
            restarts: 1,
            dra: 3,
            baseline_rounds: 2,
            mps_scale_held: 20,
            cluster_pairs: 2,
            cluster_pods: 4,
        }
    }
}

/// Busybox is copied into root filesystems from here (Debian's `busybox-static`).
const BUSYBOX: &str = "/bin/busybox";

/// GPUs the time-sliced claims spread over; GPU 0 stays free for MPS cycles, so "MPS prepare
/// at N claims" runs while N time-sliced claims are held.
const TIME_SLICED_GPUS: usize = 7;

/// Runs every measurement and writes the report to `cli.out`.
pub fn run(cli: &Cli) -> Result<Report> {
    let sizes = if cli.smoke {
        Sizes::smoke()
    } else {
        Sizes::full()
    };
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: the daemon mounts tmpfs and creates device nodes, runc and podman start containers");
    }
    for tool in ["runc", "podman", "valgrind"] {
        which(tool).with_context(|| {
            format!("{tool} is not on PATH (scripts/install-test-deps.sh installs it)")
        })?;
    }
    let bin_dir = cli
        .bin_dir
        .canonicalize()
        .with_context(|| format!("{}", cli.bin_dir.display()))?;
    for b in INSTALLED {
        if !bin_dir.join(b).is_file() {
            bail!(
                "{} is missing: build the workspace first",
                bin_dir.join(b).display()
            );
        }
    }
    // The targets are for the binaries as they ship: the two that runtimes start per container
    // are linked static (scripts/link-static.sh, which bench/run.sh runs).
    for b in STATIC_BINARIES {
        let path = bin_dir.join(b);
        if has_interpreter(&path)? {
            bail!(
                "{} is dynamically linked; gpushare ships it static: run bench/run.sh, or \
                 scripts/link-static.sh first",
                path.display()
            );
        }
    }
    // Short: MPS pipe sockets live under the daemon's run directory (108-byte limit).
    let work = tempfile::Builder::new().prefix("gsb-").tempdir_in("/tmp")?;
    let installed = install(&bin_dir, &work.path().join("bin"))?;
    let mut ctx = Ctx {
        sizes,
        bin_dir: installed,
        work: work.path().to_path_buf(),
        uids: Uids::new(),
        report: Report {
            command: cli.command.clone(),
            smoke: cli.smoke,
            ..Report::default()
        },
    };
    ctx.report.machine = machine(&bin_dir);
    let t0 = Instant::now();
    let result = match cli.only.as_deref() {
        None => ctx.all(),
        Some(section) => ctx.only(section),
    };
    ctx.report.seconds = t0.elapsed().as_secs_f64();
    result?;
    if let Ok(load) = fs::read_to_string("/proc/loadavg") {
        ctx.report.machine.push((
            "load average (1, 5, 15 min) at end".into(),
            first_words(&load, 3),
        ));
    }
    if let Some(notes) = &cli.notes {
        ctx.report.notes =
            fs::read_to_string(notes).with_context(|| format!("{}", notes.display()))?;
    }
    fs::write(&cli.out, ctx.report.render())
        .with_context(|| format!("writing {}", cli.out.display()))?;
    Ok(ctx.report)
}

#[derive(Debug)]
struct Ctx {
    sizes: Sizes,
    bin_dir: PathBuf,
    work: PathBuf,
    uids: Uids,
    report: Report,
}

impl Ctx {
    fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    fn all(&mut self) -> Result<()> {
        let emulator = self.bin("gpushare-mps-control");
        let mut d = Daemon::start(&self.bin_dir, &self.work.join("e"), &emulator)?;
        let idle_rss = settle_rss(d.pid()?)?;

        // A claim the container measurements attach to: MPS, the one with the most CDI edits.
        let mut c = d.client()?;
        let uid = self.uids.next();
        let prepared = prepare(&mut c, &claim(&uid, "gpu-0", &mps_params()))?;
        let device = prepared
            .requests
            .first()
            // The claim's own device (the last; the driver's device comes first).
            .and_then(|r| r.cdi_device_ids.last())
            .context("prepare returned no CDI device")?
            .clone();
        drop(c);
        progress("hook");
        self.hook(&d, &uid)?;
        progress("shim");
        self.shim(&d, &uid)?;
        progress("podman");
        self.podman(&d, &uid, &device)?;
        // A connection of its own: the first one would have been idle past the daemon's idle
        // timeout (60 s) by now.
        unprepare(&mut d.client()?, &uid)?;

        progress("prepare/unprepare per strategy");
        self.strategies(&d)?;
        self.dra(&d)?;
        progress("scaling, footprint and recovery");
        self.scale_footprint_recovery(&mut d, idle_rss)?;
        drop(d);
        self.mps_scale_nvidia(false)?;
        self.readers()?;
        self.cluster()?;
        Ok(())
    }

    /// 10. Unread answers (`crate::readers`), on a daemon of their own.
    fn readers(&mut self) -> Result<()> {
        progress("unread answers");
        let (section, targets) =
            crate::readers::measure(&self.bin_dir, &self.work, &mut self.uids, self.report.smoke)?;
        self.report.sections.push(section);
        self.report.targets.extend(targets);
        Ok(())
    }

    /// 9. The DRA kubelet plugin (`crate::dra`), against `d`.
    fn dra(&mut self, d: &Daemon) -> Result<()> {
        progress("DRA kubelet plugin");
        let (section, targets) =
            crate::dra::measure(&self.bin_dir, &self.work, d, &mut self.uids, self.sizes.dra)?;
        self.report.sections.push(section);
        self.report.targets.extend(targets);
        self.dra_memory(d)
    }

    /// 9b. The DRA kubelet plugin fed oversized API-server answers (`crate::dra_memory`):
    /// a tenth of the plugin's samples in prepares of an oversized claim, at least 2.
    fn dra_memory(&mut self, d: &Daemon) -> Result<()> {
        progress("DRA kubelet plugin: oversized API-server answers");
        let prepares = self.sizes.dra.div_ceil(10).max(2);
        let (section, targets) =
            crate::dra_memory::measure(&self.bin_dir, &self.work, d, prepares)?;
        self.report.sections.push(section);
        self.report.targets.extend(targets);
        Ok(())
    }

    /// One group of measurements (`--only SECTION`), against a daemon of its own.
    fn only(&mut self, section: &str) -> Result<()> {
        if section == "mps-scale" {
            // Daemons of its own, with NVIDIA's program.
            return self.mps_scale_nvidia(true);
        }
        if section == "readers" {
            return self.readers();
        }
        if section == "cluster" {
            return self.cluster();
        }
        let emulator = self.bin("gpushare-mps-control");
        let mut d = Daemon::start(&self.bin_dir, &self.work.join("e"), &emulator)?;
        let idle_rss = settle_rss(d.pid()?)?;
        match section {
            "dra" => self.dra(&d)?,
            "hook" | "shim" => {
                let mut c = d.client()?;
                let uid = self.uids.next();
                prepare(&mut c, &claim(&uid, "gpu-0", &mps_params()))?;
                progress(section);
                drop(c);
                if section == "hook" {
                    self.hook(&d, &uid)?;
                } else {
                    self.shim(&d, &uid)?;
                }
                unprepare(&mut d.client()?, &uid)?;
            }
            "scale" => {
                progress("prepare/unprepare per strategy");
                self.strategies(&d)?;
                progress("scaling, footprint and recovery");
                self.scale_footprint_recovery(&mut d, idle_rss)?;
            }
            other => bail!("no section {other:?}"),
        }
        Ok(())
    }

    /// 1. The hook as a process against `/bin/true` run the same way; daemon-side handling.
    fn hook(&mut self, d: &Daemon, uid: &str) -> Result<()> {
        let n = self.sizes.hook;
        let hook = self.bin("gpushare-cdi-hook");
        // attach wants a live pid, as a container's init would be.
        let mut sleeper = KillOnDrop(Command::new("sleep").arg("3600").spawn()?);
        let pid = sleeper.0.id();
        let (mut attach, mut detach, mut true_a, mut true_d) = (vec![], vec![], vec![], vec![]);
        for i in 0..n {
            let id = format!("bench-hook-{i}");
            let creating = json!({"ociVersion": "1.2.0", "id": id, "status": "creating", "pid": pid, "bundle": "/"}).to_string();
            let stopped = json!({"ociVersion": "1.2.0", "id": id, "status": "stopped", "pid": pid, "bundle": "/"}).to_string();
            let hook_cmd = |verb: &str| {
                let mut cmd = Command::new(&hook);
                cmd.arg(verb)
                    .arg("--socket")
                    .arg(&d.socket)
                    .args(["--claim", uid]);
                cmd
            };
            true_a.push(run_timed(
                &mut Command::new("/bin/true"),
                creating.as_bytes(),
            )?);
            attach.push(run_timed(&mut hook_cmd("attach"), creating.as_bytes())?);
            true_d.push(run_timed(
                &mut Command::new("/bin/true"),
                stopped.as_bytes(),
            )?);
            detach.push(run_timed(&mut hook_cmd("detach"), stopped.as_bytes())?);
        }
        let held: ClaimInfo = d
            .client()?
            .call(Method::GetClaim, Some(&UidParams { uid: uid.into() }))?;
        if !held.attached.is_empty() {
            bail!(
                "the hook's detach left {} attachment(s)",
                held.attached.len()
            );
        }

        // Daemon side: the same requests on one open connection, against `health`.
        let mut c = d.client()?;
        let (mut rt_attach, mut rt_detach, mut rt_health) = (vec![], vec![], vec![]);
        let (mut conn_attach, mut conn_health) = (vec![], vec![]);
        for i in 0..n {
            let id = format!("bench-rt-{i}");
            let t = Instant::now();
            let _: Value = c.call::<(), _>(Method::Health, None)?;
            rt_health.push(t.elapsed());
            let t = Instant::now();
            let _: Value = c.call(
                Method::Attach,
                Some(&AttachParams {
                    claim_uid: uid.into(),
                    container_id: id.clone(),
                    pid: Some(pid as i32),
                    bundle: None,
                    pod: None,
                }),
            )?;
            rt_attach.push(t.elapsed());
            let t = Instant::now();
            let r: DetachResult = c.call(
                Method::Detach,
                Some(&DetachParams {
                    claim_uid: uid.into(),
                    container_id: id,
                }),
            )?;
            rt_detach.push(t.elapsed());
            if !r.detached {
                bail!("detach found nothing attached");
            }
            // As the hook does it: a new connection for one request (accept and any peer
            // checks included), against `health` on a new connection.
            let t = Instant::now();
            let _: Value = d.client()?.call::<(), _>(Method::Health, None)?;
            conn_health.push(t.elapsed());
            let id = format!("bench-conn-{i}");
            let t = Instant::now();
            let _: Value = d.client()?.call(
                Method::Attach,
                Some(&AttachParams {
                    claim_uid: uid.into(),
                    container_id: id.clone(),
                    pid: Some(pid as i32),
                    bundle: None,
                    pod: None,
                }),
            )?;
            conn_attach.push(t.elapsed());
            let _: DetachResult = c.call(
                Method::Detach,
                Some(&DetachParams {
                    claim_uid: uid.into(),
                    container_id: id,
                }),
            )?;
        }
        sleeper.kill();

        let (a, ta) = (sum(&attach)?, sum(&true_a)?);
        let (de, td) = (sum(&detach)?, sum(&true_d)?);
        let (ra, rd, rh) = (sum(&rt_attach)?, sum(&rt_detach)?, sum(&rt_health)?);
        self.report.targets.push(Target {
            name: "hook attach, process, p50 ≤ 2.5 × `/bin/true`".into(),
            measured: a.p50_ms / ta.p50_ms,
            limit: 2.5,
            unit: "×".into(),
        });
        self.report.targets.push(Target {
            name: "hook attach, process, p99 ≤ 2 × its own p50".into(),
            measured: a.p99_ms / a.p50_ms,
            limit: 2.0,
            unit: "×".into(),
        });
        self.report.sections.push(Section {
            title: "1. Hook: `gpushare-cdi-hook attach` / `detach`".into(),
            method: format!(
                "Each sample is one process from spawn to exit, the OCI state written to its stdin, \
                 the daemon round trip included (attach to a prepared MPS claim, the container pid a \
                 live `sleep`); the baseline is `/bin/true` spawned the same way with the same stdin, \
                 alternating with it. Daemon-side handling is the request's round trip on an open \
                 connection, against `health` on the same connection, and on a new connection per request \
                 as the hook makes it. {n} samples each."
            ),
            rows: vec![
                row_p("attach (process)", &a, "`/bin/true`", &ta),
                row_p("detach (process)", &de, "`/bin/true`", &td),
                row_p("attach (daemon round trip)", &ra, "`health` round trip", &rh),
                row_p("detach (daemon round trip)", &rd, "`health` round trip", &rh),
                row_p(
                    "attach (new connection + round trip)",
                    &sum(&conn_attach)?,
                    "`health` on a new connection",
                    &sum(&conn_health)?,
                ),
            ]
            .into_iter()
            .flatten()
            .collect(),
        });
        Ok(())
    }

    /// 2. `gpushare-runtime` against plain runc, with and without a CDI device.
    fn shim(&mut self, d: &Daemon, uid: &str) -> Result<()> {
        let n = self.sizes.shim;
        let dir = self.work.join("shim");
        let rootfs = busybox_rootfs(&dir)?;
        let runc_root = dir.join("runc-root");
        let config = dir.join("runtime.toml");
        fs::write(
            &config,
            format!(
                "runtimes = [\"runc\"]\nspec_dirs = [{:?}]\nlog_file = \"\"\nlog_level = \"info\"\n",
                d.cdi_dir.display().to_string()
            ),
        )?;
        let plain = bundle(&dir.join("plain"), &rootfs, &[])?;
        let env = format!(
            "GPUSHARE_VISIBLE_DEVICES={}={uid}",
            gpushare_proto::CDI_KIND
        );
        let cdi = bundle(&dir.join("cdi"), &rootfs, &[env.as_str()])?;
        let pristine = fs::read(cdi.join("config.json"))?;
        // The baseline for the CDI case: runc on the very config the shim produced (edits
        // applied, so the same hooks and mounts run), made by one shim create.
        let pre = dir.join("cdi-pre");
        fs::create_dir_all(&pre)?;
        fs::write(pre.join("config.json"), &pristine)?;
        let shim = self.bin("gpushare-runtime");
        let rt = |prog: &Path| {
            let mut cmd = Command::new(prog);
            cmd.env("GPUSHARE_RUNTIME_CONFIG", &config)
                .arg("--root")
                .arg(&runc_root);
            cmd
        };
        lifecycle(&mut || rt(&shim), &pre, "bench-pre")?;
        let injected: Value = serde_json::from_slice(&fs::read(pre.join("config.json"))?)?;
        if injected["annotations"]["io.gpushare.runtime.injected"].is_null() {
            bail!(
                "gpushare-runtime did not inject the CDI device into {}",
                pre.display()
            );
        }
        let runc = which("runc").context("runc")?;
        let (mut s_plain, mut r_plain, mut s_cdi, mut r_cdi) = (vec![], vec![], vec![], vec![]);
        for i in 0..n {
            r_plain.push(lifecycle(
                &mut || rt(&runc),
                &plain,
                &format!("bench-rp-{i}"),
            )?);
            s_plain.push(lifecycle(
                &mut || rt(&shim),
                &plain,
                &format!("bench-sp-{i}"),
            )?);
            if i % self.sizes.shim_cdi_every != 0 {
                continue;
            }
            r_cdi.push(lifecycle(
                &mut || rt(&runc),
                &pre,
                &format!("bench-rc-{i}"),
            )?);
            fs::write(cdi.join("config.json"), &pristine)?;
            s_cdi.push(lifecycle(
                &mut || rt(&shim),
                &cdi,
                &format!("bench-sc-{i}"),
            )?);
        }
        let (mut s_ver, mut r_ver, mut s_list, mut r_list) = (vec![], vec![], vec![], vec![]);
        for _ in 0..self.sizes.passthrough {
            r_ver.push(run_timed(rt(&runc).arg("--version"), b"")?);
            s_ver.push(run_timed(rt(&shim).arg("--version"), b"")?);
            r_list.push(run_timed(rt(&runc).arg("list"), b"")?);
            s_list.push(run_timed(rt(&shim).arg("list"), b"")?);
        }
        let counted =
            wrapper_instructions(&shim, &config, &runc_root, &plain, &dir.join("callgrind"))?;
        let (sp, rp) = (sum(&s_plain)?, sum(&r_plain)?);
        self.report.targets.push(Target {
            name: "shim lifecycle ≤ 1.05 × runc (median)".into(),
            measured: sp.p50_ms / rp.p50_ms,
            limit: 1.05,
            unit: "×".into(),
        });
        self.report.sections.push(Section {
            title: "2. Shim: `gpushare-runtime` against runc".into(),
            method: format!(
                "`create` + `start` + `delete --force` of a busybox `/bin/true` container (one \
                 bundle, runc's own `--root`), through `gpushare-runtime` (config: `runtimes = \
                 [\"runc\"]`, the daemon's CDI directory) and through plain runc, alternating. With a \
                 CDI device the container asks for the MPS claim by `GPUSHARE_VISIBLE_DEVICES`; the \
                 shim gets a fresh copy of that config each time, and runc gets the config the shim \
                 produced (edits applied), so both run the same hooks and mounts and the ratio is \
                 the cost of resolving and applying the device. {n} lifecycles each without a device, \
                 {} each with one (one round in {}); passthrough subcommands {} each. The wrapper's own instructions are counted by callgrind \
                 (`--dump-before=execvp`: the count is written as the wrapper execs runc, which \
                 then runs unobserved) for one lifecycle of the device-less bundle; runc itself \
                 cannot be counted so (a Go program, which valgrind does not run), so those rows \
                 have no ratio and the target stays the wall-time median.",
                n.div_ceil(self.sizes.shim_cdi_every),
                self.sizes.shim_cdi_every,
                self.sizes.passthrough
            ),
            rows: [
                row_p("lifecycle, no device", &sp, "runc", &rp),
                row_p("lifecycle, CDI device", &sum(&s_cdi)?, "runc, edits pre-applied", &sum(&r_cdi)?),
                row_p("`--version`", &sum(&s_ver)?, "`runc --version`", &sum(&r_ver)?),
                row_p("`list`", &sum(&s_list)?, "`runc list`", &sum(&r_list)?),
            ]
            .into_iter()
            .flatten()
            .chain(counted)
            .collect(),
        });
        Ok(())
    }

    /// 3. podman start-to-exit with our CDI device against the same container without it.
    fn podman(&mut self, d: &Daemon, uid: &str, device: &str) -> Result<()> {
        let n = self.sizes.podman;
        let rootfs = busybox_rootfs(&self.work.join("podman"))?;
        // podman reads CDI specs only from /etc/cdi and /var/run/cdi: put a copy of the claim's
        // spec there (its name carries this run's unique UID) and remove it afterwards.
        let spec = fs::read_dir(&d.cdi_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .is_some_and(|f| f.to_string_lossy().contains(uid))
            })
            .with_context(|| format!("no CDI spec for claim {uid} in {}", d.cdi_dir.display()))?;
        fs::create_dir_all("/var/run/cdi")?;
        let host =
            RemoveOnDrop(Path::new("/var/run/cdi").join(spec.file_name().context("spec name")?));
        fs::copy(&spec, &host.0)?;
        let run = |device: Option<&str>| {
            let mut cmd = Command::new("podman");
            cmd.args(["run", "--rm", "--runtime", "runc"])
                .args([
                    "--ulimit",
                    "nofile=1024:1024",
                    "--ulimit",
                    "nproc=1024:1024",
                ])
                .args(["--network", "none"]);
            if let Some(dev) = device {
                cmd.args(["--device", dev]);
            }
            cmd.arg("--rootfs").arg(&rootfs).arg("/bin/true");
            cmd
        };
        // One unmeasured run of each: podman's first start initializes its storage.
        run_timed(&mut run(None), b"")?;
        run_timed(&mut run(Some(device)), b"")?;
        let (mut with, mut without) = (vec![], vec![]);
        for _ in 0..n {
            without.push(run_timed(&mut run(None), b"")?);
            with.push(run_timed(&mut run(Some(device)), b"")?);
        }
        drop(host);
        self.report.sections.push(Section {
            title: "3. Container start with a claim (podman)".into(),
            method: format!(
                "`podman run --rm --runtime runc --network none --rootfs <busybox> /bin/true`, spawn \
                 to exit, with `--device {}=<uid>` (the MPS claim's CDI device: its mounts, device \
                 nodes, environment and the attach/detach hooks) and without, alternating; {n} runs \
                 each after one warm-up run each.",
                gpushare_proto::CDI_KIND
            ),
            rows: row_p("podman run with the claim's CDI device", &sum(&with)?, "same container without it", &sum(&without)?)
                .into_iter()
                .collect(),
        });
        Ok(())
    }

    /// 4a. Prepare/unprepare per strategy, against `health` on the same connection.
    fn strategies(&mut self, emu: &Daemon) -> Result<()> {
        let n = self.sizes.cycles;
        let mut rows = vec![];
        let mut cases: Vec<(String, Value, &str)> = vec![
            ("MPS, emulator".into(), mps_params(), "gpu-0"),
            ("time-slicing".into(), time_slicing_params(), "gpu-1"),
            ("exclusive".into(), exclusive_params(), "gpu-2"),
        ];
        let nvidia = which("nvidia-cuda-mps-control");
        let nv_daemon = match &nvidia {
            Some(p) => Some(Daemon::start(&self.bin_dir, &self.work.join("n"), p)?),
            None => None,
        };
        if nv_daemon.is_some() {
            cases.insert(
                1,
                (
                    "MPS, NVIDIA's `nvidia-cuda-mps-control`".into(),
                    mps_params(),
                    "gpu-0",
                ),
            );
        }
        for (name, params, device) in cases {
            let d = if name.contains("NVIDIA") {
                nv_daemon.as_ref().context("nvidia daemon")?
            } else {
                emu
            };
            let (p, u, h) = self.cycles(d, &params, device, n)?;
            let (p, u, h) = (sum(&p)?, sum(&u)?, sum(&h)?);
            rows.extend(row_p(
                &format!("prepare, {name}"),
                &p,
                "`health` round trip",
                &h,
            ));
            rows.extend(row_p(
                &format!("unprepare, {name}"),
                &u,
                "`health` round trip",
                &h,
            ));
        }
        drop(nv_daemon);
        self.report.sections.push(Section {
            title: "4. Prepare and unprepare".into(),
            method: format!(
                "Per strategy: {n} cycles of `prepare` then `unprepare` of a new claim on one GPU, \
                 on one open connection, each request timed from send to answer; the baseline is a \
                 `health` request on the same connection in the same cycle (the protocol's floor). \
                 MPS claims start, configure, read back and stop a real control daemon each cycle. \
                 No DRA driver baseline runs here: NVIDIA's DRA driver starts a Deployment per MPS \
                 claim, which takes seconds on a real cluster."
            ),
            rows,
        });
        Ok(())
    }

    /// `n` prepare/unprepare cycles of `params` on `device`: (prepare, unprepare, health).
    #[allow(clippy::type_complexity)]
    fn cycles(
        &mut self,
        d: &Daemon,
        params: &Value,
        device: &str,
        n: usize,
    ) -> Result<(Vec<Duration>, Vec<Duration>, Vec<Duration>)> {
        let mut c = d.client()?;
        let (mut p, mut u, mut h) = (vec![], vec![], vec![]);
        for _ in 0..n {
            let uid = self.uids.next();
            let body = claim(&uid, device, params);
            let t = Instant::now();
            let _: Value = c.call::<(), _>(Method::Health, None)?;
            h.push(t.elapsed());
            let t = Instant::now();
            prepare(&mut c, &body)?;
            p.push(t.elapsed());
            let t = Instant::now();
            unprepare(&mut c, &uid)?;
            u.push(t.elapsed());
        }
        Ok((p, u, h))
    }

    /// 4b–6. Scaling curve and throughput, MPS at the largest size, footprint, recovery.
    fn scale_footprint_recovery(&mut self, d: &mut Daemon, idle_rss: (u64, u64)) -> Result<()> {
        let sizes = self.sizes.clone();
        let largest = *sizes.scale.last().context("no scale sizes")?;

        // Recovery baseline: restart with an empty checkpoint.
        let mut empty_restart = vec![];
        for _ in 0..sizes.restarts {
            d.stop()?;
            empty_restart.push(d.restart(0)?);
        }

        // Throughput: 64 clients at once against one client doing the same cycles.
        let total = sizes.clients * sizes.per_client;
        let seq = self.throughput(d, 1, total)?;
        let conc = self.throughput(d, sizes.clients, sizes.per_client)?;
        let burst_rss = rss_kib(d.pid()?)?;

        // Scaling: time per claim to prepare and release N time-sliced claims:
        // (N, prepare per claim, unprepare per claim), in ms.
        let mut points: Vec<(usize, f64, f64)> = vec![];
        let mut held: Vec<String> = vec![];
        let mut mps_at_scale = None;
        let mut mps_alone_beside: Option<Summary> = None;
        let mut scale_rss = (0, 0);
        let mut checkpoint_bytes = 0;
        // The second daemon of the MPS-at-scale and per-claim baselines, kept for the
        // recovery baseline.
        let mut second: Option<Daemon> = None;
        let (mut beside_prepare, mut beside_unprepare) = (Rolling::default(), Rolling::default());
        let mut c = d.client()?;
        for &n in &sizes.scale {
            // The smallest size is the baseline: one batch of so few record writes is noise
            // (one slow fsync moves it), so it is taken over `baseline_rounds` batches, the
            // same per-claim mean over more claims; larger sizes are one batch each.
            let rounds = if n == sizes.scale[0] && n != largest {
                sizes.baseline_rounds
            } else {
                1
            };
            let (mut extra_prepare, mut extra_unprepare) = (Duration::ZERO, Duration::ZERO);
            for _ in 1..rounds {
                let uids: Vec<String> = (0..n).map(|_| self.uids.next()).collect();
                let t = Instant::now();
                prepare_time_sliced(&mut c, &uids)?;
                extra_prepare += t.elapsed();
                let t = Instant::now();
                for uid in &uids {
                    unprepare(&mut c, uid)?;
                }
                extra_unprepare += t.elapsed();
            }
            let uids: Vec<String> = (0..n).map(|_| self.uids.next()).collect();
            let took = if n == largest {
                // The per-claim targets' baseline: a second daemon holding a rolling window
                // of the smallest size, stepped between chunks of these prepares (and of
                // their unprepares, below), so that both sample the disk's same minutes.
                let emulator = self.bin("gpushare-mps-control");
                let z = second.insert(Daemon::start(
                    &self.bin_dir,
                    &self.work.join("z"),
                    &emulator,
                )?);
                let mut zc = z.client()?;
                let mut took = Duration::ZERO;
                for (k, chunk) in uids.chunks(INTERLEAVE_EVERY).enumerate() {
                    let t = Instant::now();
                    prepare_time_sliced_from(&mut c, chunk, k * INTERLEAVE_EVERY)?;
                    took += t.elapsed();
                    beside_prepare.step(&mut zc, &mut self.uids, sizes.scale[0])?;
                }
                beside_prepare.release_all(&mut zc)?;
                took
            } else {
                let t = Instant::now();
                prepare_time_sliced(&mut c, &uids)?;
                t.elapsed()
            };
            let claims_timed = (n * rounds) as f64;
            let per_prepare = (took + extra_prepare).as_secs_f64() * 1e3 / claims_timed;
            if n == largest {
                // MPS cycles on the free GPU 0 while `largest` time-sliced claims are held
                // (they stay held through the idle and restart measurements), alternating
                // cycle by cycle with the same on a second daemon that holds none: both in the
                // same minutes, so the machine's drift falls on both.
                let empty = second.as_ref().context("the second daemon")?;
                let (mut p, mut u, mut h, mut p0) = (vec![], vec![], vec![], vec![]);
                for _ in 0..sizes.cycles {
                    let (ep, _, _) = self.cycles(empty, &mps_params(), "gpu-0", 1)?;
                    p0.extend(ep);
                    let (sp, su, sh) = self.cycles(d, &mps_params(), "gpu-0", 1)?;
                    p.extend(sp);
                    u.extend(su);
                    h.extend(sh);
                }
                mps_alone_beside = Some(sum(&p0)?);
                mps_at_scale = Some((sum(&p)?, sum(&u)?, sum(&h)?));
                scale_rss = rss_kib(d.pid()?)?;
                // What a whole-node checkpoint would write per change: every claim record.
                checkpoint_bytes = fs::read_dir(d.dir.join("state/records"))
                    .context("the daemon's claim records")?
                    .flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len() as usize)
                    .sum();
                held = uids;
                points.push((n, per_prepare, 0.0));
                break;
            }
            let t = Instant::now();
            for uid in &uids {
                unprepare(&mut c, uid)?;
            }
            let per_unprepare = (t.elapsed() + extra_unprepare).as_secs_f64() * 1e3 / claims_timed;
            points.push((n, per_prepare, per_unprepare));
        }
        drop(c);

        // Idle: the largest set of claims plus one MPS claim held, no requests.
        let mut c = d.client()?;
        let mps_uid = self.uids.next();
        prepare(&mut c, &claim(&mps_uid, "gpu-0", &mps_params()))?;
        drop(c);
        let pid = d.pid()?;
        progress(&format!("idle for {} s", sizes.idle.as_secs()));
        let cpu0 = cpu_time(pid)?;
        let t = Instant::now();
        std::thread::sleep(sizes.idle);
        let idle_cpu = cpu_time(pid)?.saturating_sub(cpu0);
        let idle_pct = idle_cpu.as_secs_f64() / t.elapsed().as_secs_f64() * 100.0;

        // Recovery: restart with the claims in the checkpoint. The target's baseline is a
        // restart with few claims of the same shape (the smallest scaling size of time-sliced
        // claims and one MPS claim whose control daemon is re-adopted), so that the ratio is
        // what the claims cost: on the second daemon, alternating restart by restart with this
        // one, so that the machine's drift over minutes falls on both.
        let small_size = sizes.scale[0] + 1;
        let mut small_restart = vec![];
        let mut baseline = match second.take() {
            Some(z) if small_size <= largest => {
                let mut zc = z.client()?;
                // The same history as the daemon at scale: as many released claims (each
                // leaves a tombstone, which every start reads back), so the two restarts
                // differ in the claims held alone.
                let tombstones = |dir: &Path| {
                    fs::read_dir(dir.join("state/tombstones")).map_or(0, |e| e.count())
                };
                let missing = tombstones(&d.dir).saturating_sub(tombstones(&z.dir));
                for _ in 0..missing {
                    let uid = self.uids.next();
                    prepare(&mut zc, &claim(&uid, "gpu-1", &time_slicing_params()))?;
                    unprepare(&mut zc, &uid)?;
                }
                let uids: Vec<String> = (0..sizes.scale[0]).map(|_| self.uids.next()).collect();
                prepare_time_sliced(&mut zc, &uids)?;
                prepare(&mut zc, &claim(&self.uids.next(), "gpu-0", &mps_params()))?;
                Some(z)
            }
            _ => None,
        };
        let mut full_restart = vec![];
        for _ in 0..sizes.restarts {
            if let Some(z) = baseline.as_mut() {
                z.stop()?;
                small_restart.push(z.restart(small_size)?);
            }
            d.stop()?;
            full_restart.push(d.restart(largest + 1)?);
        }
        let restart_rss = rss_kib(d.pid()?)?;
        let mut c = d.client()?;
        let mut zc = baseline.as_ref().map(Daemon::client).transpose()?;
        let releasing: Vec<&String> = held.iter().chain([&mps_uid]).collect();
        let mut took = Duration::ZERO;
        for chunk in releasing.chunks(INTERLEAVE_EVERY) {
            let t = Instant::now();
            for uid in chunk {
                unprepare(&mut c, uid)?;
            }
            took += t.elapsed();
            if let Some(zc) = zc.as_mut() {
                beside_unprepare.step(zc, &mut self.uids, sizes.scale[0])?;
            }
        }
        if let Some(zc) = zc.as_mut() {
            beside_unprepare.release_all(zc)?;
        }
        drop(zc);
        drop(baseline);
        let per_unprepare = took.as_secs_f64() * 1e3 / releasing.len() as f64;
        if let Some(last) = points.last_mut() {
            last.2 = per_unprepare;
        }
        drop(c);

        let (mp, mu, mh) = mps_at_scale.context("no MPS cycles at scale")?;
        let mut rows_beside: Vec<Row> = vec![];
        // What one durable write of a checkpoint that size costs on this disk, against 1 KiB.
        let (mut big, mut small) = (vec![], vec![]);
        for _ in 0..sizes.cycles {
            big.push(durable_rewrite(&d.dir, checkpoint_bytes)?);
            small.push(durable_rewrite(&d.dir, 1024)?);
        }
        let (big, small) = (sum(&big)?, sum(&small)?);
        let mib = |kib: u64| kib as f64 / 1024.0;
        if let Some(alone) = &mps_alone_beside {
            self.report.targets.push(Target {
                name: format!(
                    "MPS prepare (emulator) p50 with {largest} claims held ≤ 1.25 × with none (a second daemon, interleaved)"
                ),
                measured: mp.p50_ms / alone.p50_ms,
                limit: 1.25,
                unit: "×".into(),
            });
        }
        if let (Some(first), Some(last)) = (points.first(), points.last()) {
            // Against the interleaved batches where they ran, else the curve's first point.
            let (p0, u0) = (
                beside_prepare.prepare_ms().unwrap_or(first.1),
                beside_unprepare.unprepare_ms().unwrap_or(first.2),
            );
            let how = if beside_unprepare.released > 0 {
                " (a second daemon, interleaved)"
            } else {
                ""
            };
            self.report.targets.push(Target {
                name: format!(
                    "per-claim prepare, {} vs {} claims ≤ 1.25 ×{how}",
                    last.0, first.0
                ),
                measured: last.1 / p0,
                limit: 1.25,
                unit: "×".into(),
            });
            self.report.targets.push(Target {
                name: format!(
                    "per-claim unprepare, {} vs {} claims ≤ 1.25 ×{how}",
                    last.0, first.0
                ),
                measured: last.2 / u0,
                limit: 1.25,
                unit: "×".into(),
            });
            rows_beside = [
                ("prepare", last.1, beside_prepare.prepare_ms()),
                ("unprepare", last.2, beside_unprepare.unprepare_ms()),
            ]
            .into_iter()
            .filter_map(|(what, at, beside)| {
                Some(Row {
                    figure: format!("{what}, {} claims, per claim", last.0),
                    value: ms(at),
                    baseline: format!("{} held on a second daemon, interleaved", first.0),
                    baseline_value: ms(beside?),
                    ratio: ratio(at, beside?),
                })
            })
            .collect();
        }
        self.report.targets.push(Target {
            name: format!("daemon RSS ≤ 30 MiB at {largest} claims"),
            measured: mib(scale_rss.0.max(restart_rss.0)),
            limit: 30.0,
            unit: "MiB".into(),
        });
        self.report.targets.push(Target {
            name: format!("idle CPU ≤ 0.1 % over {} s", sizes.idle.as_secs()),
            measured: idle_pct,
            limit: 0.1,
            unit: "%".into(),
        });
        let (fr, er) = (sum(&full_restart)?, sum(&empty_restart)?);
        let sr = if small_restart.is_empty() {
            None
        } else {
            Some(sum(&small_restart)?)
        };
        self.report.targets.push(match &sr {
            Some(sr) => Target {
                name: format!(
                    "restart to ready, {} claims ≤ 3 × with {small_size} (median; both with one MPS claim re-adopted)",
                    largest + 1
                ),
                measured: fr.p50_ms / sr.p50_ms,
                limit: 3.0,
                unit: "×".into(),
            },
            None => Target {
                name: format!(
                    "restart to ready, {largest} claims ≤ 3 × with an empty checkpoint (median)"
                ),
                measured: fr.p50_ms / er.p50_ms,
                limit: 3.0,
                unit: "×".into(),
            },
        });

        let mut rows4: Vec<Row> = scaling_rows(&points);
        rows4.append(&mut rows_beside);
        rows4.extend(row_p(
            &format!("MPS prepare (emulator), {largest} time-sliced claims held"),
            &mp,
            "`health` round trip",
            &mh,
        ));
        if let Some(alone) = &mps_alone_beside {
            rows4.extend(row_p(
                &format!("MPS prepare (emulator), {largest} time-sliced claims held"),
                &mp,
                "the same on a second daemon holding none, interleaved",
                alone,
            ));
        }
        rows4.extend(row_p(
            &format!("MPS unprepare (emulator), {largest} time-sliced claims held"),
            &mu,
            "`health` round trip",
            &mh,
        ));
        rows4.extend(row_p(
            &format!(
                "durable rewrite of a {} KiB file (every claim record at {largest} claims: what a whole-node checkpoint wrote per change)",
                checkpoint_bytes / 1024
            ),
            &big,
            "the same for 1 KiB",
            &small,
        ));
        rows4.push(Row {
            figure: format!(
                "throughput, {} concurrent clients × {} cycles",
                sizes.clients, sizes.per_client
            ),
            value: format!("{} cycles/s", num(conc)),
            baseline: format!("one client, {total} cycles"),
            baseline_value: format!("{} cycles/s", num(seq)),
            ratio: ratio(conc, seq),
        });
        self.report.sections.push(Section {
            title: "4b. Scaling and concurrency".into(),
            method: format!(
                "Scaling: prepare N time-sliced claims (spread over GPUs 1–7 of a simulated {}; \
                 time-slicing lets any number of claims share a GPU, while MPS and exclusive allow \
                 one claim per GPU) one after another on one connection, then release them; time per \
                 claim against N = {} (the mean over {} such batches: one batch of so few durable \
                 writes is noise; every other size is one batch). The per-claim targets compare \
                 N = {largest} with a second daemon that holds a rolling window of {} claims: \
                 after every {INTERLEAVE_EVERY} of the {largest} prepares (and of their \
                 unprepares) it prepares one more and releases its oldest, each timed, so that \
                 both sample the same minutes evenly. At N = {largest}, {} MPS prepare/unprepare cycles run on the \
                 free GPU 0 with the emulator while the {largest} claims are held, alternating cycle \
                 by cycle with the same on a second daemon that holds none (the target's baseline) (the unprepare \
                 figure at N = {largest} is taken after the idle and restart measurements below). \
                 Throughput: a cycle is prepare + unprepare of a new time-sliced claim; {} clients \
                 on their own connections start together, against one client doing all {total} \
                 cycles. The durable rewrite (write a temporary file, fsync, rename, fsync the \
                 directory, as crash-safe state is written) is the bench's own, in the daemon's \
                 directory, for the size the checkpoint had at N = {largest}: a reference for the cost \
                 of persisting state on this disk.",
                crate::daemon::PROFILE,
                sizes.scale[0],
                sizes.baseline_rounds,
                sizes.scale[0],
                sizes.cycles,
                sizes.clients
            ),
            rows: rows4,
        });

        let runc_size = which("runc")
            .and_then(|p| fs::metadata(p).ok())
            .map_or(0, |m| m.len());
        let mut rows5 = vec![
            Row {
                figure: "RSS idle, no claims".into(),
                value: format!("{} MiB", num(mib(idle_rss.0))),
                baseline: "–".into(),
                baseline_value: "–".into(),
                ratio: None,
            },
            Row {
                figure: format!("RSS with {largest} claims"),
                value: format!(
                    "{} MiB (peak {} MiB)",
                    num(mib(scale_rss.0)),
                    num(mib(scale_rss.1))
                ),
                baseline: "idle, no claims".into(),
                baseline_value: format!("{} MiB", num(mib(idle_rss.0))),
                ratio: ratio(scale_rss.0 as f64, idle_rss.0 as f64),
            },
            Row {
                figure: format!(
                    "RSS after the throughput runs ({} clients), no claims held",
                    sizes.clients
                ),
                value: format!("{} MiB", num(mib(burst_rss.0))),
                baseline: "idle, no claims".into(),
                baseline_value: format!("{} MiB", num(mib(idle_rss.0))),
                ratio: ratio(burst_rss.0 as f64, idle_rss.0 as f64),
            },
            Row {
                figure: format!("RSS after restart with {} claims", largest + 1),
                value: format!("{} MiB", num(mib(restart_rss.0))),
                baseline: "idle, no claims".into(),
                baseline_value: format!("{} MiB", num(mib(idle_rss.0))),
                ratio: ratio(restart_rss.0 as f64, idle_rss.0 as f64),
            },
            Row {
                figure: format!(
                    "CPU while idle {} s ({largest} time-sliced + 1 MPS claim held)",
                    sizes.idle.as_secs()
                ),
                value: format!(
                    "{} ms ({} %)",
                    num(idle_cpu.as_secs_f64() * 1e3),
                    num(idle_pct)
                ),
                baseline: "–".into(),
                baseline_value: "–".into(),
                ratio: None,
            },
        ];
        for b in [
            "gpushared",
            "gpushare",
            "gpushare-cdi-hook",
            "gpushare-runtime",
            "gpushare-mps-control",
        ] {
            let size = fs::metadata(self.bin(b)).map(|m| m.len()).unwrap_or(0);
            rows5.push(Row {
                figure: format!("binary `{b}`"),
                value: format!("{} MiB", num(size as f64 / 1048576.0)),
                baseline: "`runc` binary".into(),
                baseline_value: format!("{} MiB", num(runc_size as f64 / 1048576.0)),
                ratio: ratio(size as f64, runc_size as f64),
            });
        }
        self.report.sections.push(Section {
            title: "5. Footprint".into(),
            method: "RSS is `VmRSS` (peak: `VmHWM`) of `gpushared` from `/proc`, idle taken 1 s after \
                     start. CPU time is the sum of every daemon thread's `schedstat` run time (ns) \
                     over the idle window, with no request sent. Binary sizes are the files as built \
                     (not stripped)."
                .into(),
            rows: rows5,
        });
        self.report.sections.push(Section {
            title: "6. Recovery".into(),
            method: format!(
                "SIGTERM, then spawn `gpushared` on the same state directory and time spawn to the \
                 first `health` that answers ready with every checkpointed claim ({} time-sliced + 1 \
                 MPS claim, whose control daemon outlives the restart and is re-adopted), polled \
                 every 0.5 ms; the baselines are the same restart with an empty checkpoint, and \
                 with the smallest scaling size of time-sliced claims plus one MPS claim (the \
                 target's: both restarts then re-adopt one control daemon), on a second daemon \
                 given as many released claims (tombstones) as the one at scale, alternating \
                 restart by restart with it. {} restarts each.",
                largest, sizes.restarts
            ),
            rows: row_p(&format!("restart to ready, {} claims", largest + 1), &fr, "empty checkpoint", &er)
                .into_iter()
                .chain(sr.iter().flat_map(|sr| {
                    row_p(
                        &format!("restart to ready, {} claims", largest + 1),
                        &fr,
                        &format!("{small_size} claims (one MPS)"),
                        sr,
                    )
                }))
                .collect(),
        });
        Ok(())
    }

    /// Cycles per second of `clients` clients doing `per_client` cycles each, started together.
    fn throughput(&mut self, d: &Daemon, clients: usize, per_client: usize) -> Result<f64> {
        let barrier = Arc::new(Barrier::new(clients + 1));
        let mut threads = vec![];
        for k in 0..clients {
            let uids: Vec<String> = (0..per_client).map(|_| self.uids.next()).collect();
            let mut c = d.client()?;
            let barrier = Arc::clone(&barrier);
            threads.push(std::thread::spawn(move || -> Result<()> {
                barrier.wait();
                for (j, uid) in uids.iter().enumerate() {
                    let gpu = 1 + (k + j) % TIME_SLICED_GPUS;
                    prepare(
                        &mut c,
                        &claim(uid, &format!("gpu-{gpu}"), &time_slicing_params()),
                    )?;
                    unprepare(&mut c, uid)?;
                }
                Ok(())
            }));
        }
        barrier.wait();
        let t = Instant::now();
        for th in threads {
            th.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok((clients * per_client) as f64 / t.elapsed().as_secs_f64())
    }
}

/// Rows of the scaling curve: per-claim prepare and unprepare time at each N of `points`
/// (`(N, prepare ms, unprepare ms)`), against the first N.
fn scaling_rows(points: &[(usize, f64, f64)]) -> Vec<Row> {
    let Some(&(n0, p0, u0)) = points.first() else {
        return vec![];
    };
    let mut rows = vec![];
    for &(n, p, _) in points {
        rows.push(Row {
            figure: format!("prepare, {n} claims, per claim"),
            value: ms(p),
            baseline: format!("{n0} claims"),
            baseline_value: ms(p0),
            ratio: ratio(p, p0),
        });
    }
    for &(n, _, u) in points {
        rows.push(Row {
            figure: format!("unprepare, {n} claims, per claim"),
            value: ms(u),
            baseline: format!("{n0} claims"),
            baseline_value: ms(u0),
            ratio: ratio(u, u0),
        });
    }
    rows
}

/// A row comparing two summaries by median, and one by p99.
fn row_p(figure: &str, s: &Summary, baseline: &str, b: &Summary) -> [Row; 2] {
    [
        Row {
            figure: format!("{figure}, p50"),
            value: ms(s.p50_ms),
            baseline: baseline.into(),
            baseline_value: ms(b.p50_ms),
            ratio: ratio(s.p50_ms, b.p50_ms),
        },
        Row {
            figure: format!("{figure}, p99"),
            value: ms(s.p99_ms),
            baseline: baseline.into(),
            baseline_value: ms(b.p99_ms),
            ratio: ratio(s.p99_ms, b.p99_ms),
        },
    ]
}

fn sum(samples: &[Duration]) -> Result<Summary> {
    summarize(samples).context("no samples")
}

fn progress(what: &str) {
    eprintln!("gpushare-bench: {what}");
}

/// Spawns `cmd` with `stdin` on its standard input, waits for it, and returns spawn-to-exit
/// wall time; a failure is an error carrying its stderr.
///
/// stderr goes to an anonymous file, not a pipe: `runc create` hands its stdio to the
/// container's init, which holds a pipe open until the container ends, so reading a pipe to
/// its end would wait for the container rather than for runc.
fn run_timed(cmd: &mut Command, stdin: &[u8]) -> Result<Duration> {
    let mut err = tempfile::tempfile()?;
    cmd.stdout(Stdio::null()).stderr(err.try_clone()?);
    if stdin.is_empty() {
        cmd.stdin(Stdio::null());
    } else {
        cmd.stdin(Stdio::piped());
    }
    let t = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
    if let Some(mut input) = child.stdin.take() {
        // A program that does not read its stdin (`/bin/true`) may exit first: EPIPE is fine.
        let _ = input.write_all(stdin);
    }
    let status = child.wait()?;
    let elapsed = t.elapsed();
    if !status.success() {
        let mut text = String::new();
        err.seek(SeekFrom::Start(0))?;
        err.take(64 * 1024).read_to_string(&mut text)?;
        bail!("{cmd:?} failed ({status}): {}", text.trim());
    }
    Ok(elapsed)
}

/// `create` + `start` + `delete --force` of container `id` from `bundle`, timed.
fn lifecycle(rt: &mut dyn FnMut() -> Command, bundle: &Path, id: &str) -> Result<Duration> {
    let t = Instant::now();
    let created = run_timed(rt().arg("create").arg("--bundle").arg(bundle).arg(id), b"");
    let result = created
        .and_then(|_| run_timed(rt().args(["start", id]), b""))
        .and_then(|_| run_timed(rt().args(["delete", "--force", id]), b""));
    if result.is_err() {
        // Leave no container behind.
        let _ = rt()
            .args(["delete", "--force", id])
            .stderr(Stdio::null())
            .status();
    }
    result.map(|_| t.elapsed())
}

/// How many of the largest size's prepares (and unprepares) run between two steps of
/// [`Rolling`].
const INTERLEAVE_EVERY: usize = 5;

/// The per-claim baseline on a second daemon: it holds a rolling window of a few time-sliced
/// claims, and each step prepares one more and releases the oldest, each timed. Steps run
/// between the measured daemon's prepares, so that both sample the same minutes evenly.
#[derive(Debug, Default)]
struct Rolling {
    held: std::collections::VecDeque<String>,
    next_gpu: usize,
    prepare: Duration,
    prepared: usize,
    unprepare: Duration,
    released: usize,
}

impl Rolling {
    /// One step on `c`, whose window is `size` claims: fills it first (untimed), then
    /// prepares one claim and releases the oldest.
    fn step(&mut self, c: &mut Client, uids: &mut Uids, size: usize) -> Result<()> {
        while self.held.len() < size {
            self.add(c, uids)?;
        }
        let t = Instant::now();
        self.add(c, uids)?;
        self.prepare += t.elapsed();
        self.prepared += 1;
        if let Some(oldest) = self.held.pop_front() {
            let t = Instant::now();
            unprepare(c, &oldest)?;
            self.unprepare += t.elapsed();
            self.released += 1;
        }
        Ok(())
    }

    fn add(&mut self, c: &mut Client, uids: &mut Uids) -> Result<()> {
        let uid = uids.next();
        prepare_time_sliced_from(c, std::slice::from_ref(&uid), self.next_gpu)?;
        self.next_gpu += 1;
        self.held.push_back(uid);
        Ok(())
    }

    /// Mean of the timed prepares, in ms; `None` before any step.
    fn prepare_ms(&self) -> Option<f64> {
        (self.prepared > 0).then(|| self.prepare.as_secs_f64() * 1e3 / self.prepared as f64)
    }

    /// Mean of the timed unprepares, in ms; `None` before any step.
    fn unprepare_ms(&self) -> Option<f64> {
        (self.released > 0).then(|| self.unprepare.as_secs_f64() * 1e3 / self.released as f64)
    }

    /// Releases the window.
    fn release_all(&mut self, c: &mut Client) -> Result<()> {
        while let Some(uid) = self.held.pop_front() {
            unprepare(c, &uid)?;
        }
        Ok(())
    }
}

/// Prepares a time-sliced claim for each of `uids`, spread over the time-sliced GPUs in turn.
fn prepare_time_sliced(c: &mut Client, uids: &[String]) -> Result<()> {
    prepare_time_sliced_from(c, uids, 0)
}

/// [`prepare_time_sliced`] for the claims from the `first`-th on: claim `first + i` goes to
/// the same GPU as in one call for all.
fn prepare_time_sliced_from(c: &mut Client, uids: &[String], first: usize) -> Result<()> {
    for (i, uid) in uids.iter().enumerate() {
        let gpu = format!("gpu-{}", 1 + (first + i) % TIME_SLICED_GPUS);
        prepare(c, &claim(uid, &gpu, &time_slicing_params()))?;
    }
    Ok(())
}

/// The instructions `shim` executes before it execs runc, for `create`, `start` and
/// `delete --force` of one container from `bundle`, and their sum: one row each.
///
/// callgrind's `--dump-before=execvp` writes the count when the wrapper calls `execvp` (its
/// exec into runc), as part 1 of `<dir>/cg<step>.<pid>.1`; runc then runs natively (valgrind does
/// not follow it), so the container is really created, started and deleted. A wrapper that
/// never reached its exec leaves no part 1: that is an error, not a zero.
fn wrapper_instructions(
    shim: &Path,
    config: &Path,
    runc_root: &Path,
    bundle: &Path,
    dir: &Path,
) -> Result<Vec<Row>> {
    fs::create_dir_all(dir)?;
    let id = "bench-callgrind";
    let steps: [(&str, Vec<&OsStr>); 3] = [
        (
            "create",
            vec![
                OsStr::new("create"),
                OsStr::new("--bundle"),
                bundle.as_os_str(),
                OsStr::new(id),
            ],
        ),
        ("start", vec![OsStr::new("start"), OsStr::new(id)]),
        (
            "delete --force",
            vec![OsStr::new("delete"), OsStr::new("--force"), OsStr::new(id)],
        ),
    ];
    let mut rows = Vec::new();
    let mut total = 0u64;
    for (i, (name, args)) in steps.iter().enumerate() {
        let out = dir.join(format!("cg{i}"));
        let mut cmd = Command::new("valgrind");
        cmd.arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}.%p", out.display()))
            .arg("--dump-before=execvp")
            .arg(shim)
            .env("GPUSHARE_RUNTIME_CONFIG", config)
            .arg("--root")
            .arg(runc_root)
            .args(args);
        let run = run_timed(&mut cmd, b"");
        if run.is_err() {
            // Leave no container behind, whichever step failed.
            let _ = Command::new("runc")
                .arg("--root")
                .arg(runc_root)
                .args(["delete", "--force", id])
                .stderr(Stdio::null())
                .status();
        }
        run?;
        let count = callgrind_part_one(dir, &format!("cg{i}."))
            .with_context(|| format!("counting `gpushare-runtime {name}`"))?;
        total += count;
        rows.push(Row {
            figure: format!("`{name}`: the wrapper's own instructions before its exec"),
            value: instructions(count),
            baseline: "–".into(),
            baseline_value: "–".into(),
            ratio: None,
        });
    }
    rows.push(Row {
        figure: "lifecycle: the wrapper's own instructions".into(),
        value: instructions(total),
        baseline: "–".into(),
        baseline_value: "–".into(),
        ratio: None,
    });
    Ok(rows)
}

/// The `summary:` count of the one callgrind part-1 dump in `dir` whose name starts with
/// `prefix`.
fn callgrind_part_one(dir: &Path, prefix: &str) -> Result<u64> {
    let mut found = None;
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) && name.ends_with(".1") {
            if found.is_some() {
                bail!(
                    "more than one callgrind dump {prefix}*.1 in {}",
                    dir.display()
                );
            }
            found = Some(dir.join(name));
        }
    }
    let file = found.with_context(|| {
        format!(
            "callgrind wrote no dump {prefix}*.1 in {}: the wrapper never reached execvp",
            dir.display()
        )
    })?;
    let text = fs::read_to_string(&file)?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .with_context(|| format!("no summary line in {}", file.display()))?
        .trim()
        .parse()
        .with_context(|| format!("summary of {}", file.display()))
}

/// `1234567` as "1.23 M instructions".
fn instructions(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.2} M instructions", n as f64 / 1e6)
    } else {
        format!("{} k instructions", (n + 500) / 1000)
    }
}

/// `<dir>/rootfs` with busybox and a link per applet.
fn busybox_rootfs(dir: &Path) -> Result<PathBuf> {
    let root = dir.join("rootfs");
    for d in ["bin", "tmp", "proc", "dev", "sys", "etc"] {
        fs::create_dir_all(root.join(d))?;
    }
    fs::copy(BUSYBOX, root.join("bin/busybox"))
        .with_context(|| format!("copying {BUSYBOX} (package busybox-static)"))?;
    for applet in ["sh", "true"] {
        symlink("busybox", root.join("bin").join(applet))?;
    }
    Ok(root)
}

/// A runc bundle at `dir` running `/bin/true` in `rootfs` with `env` added.
fn bundle(dir: &Path, rootfs: &Path, env: &[&str]) -> Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let st = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(dir)
        .status()?;
    if !st.success() {
        bail!("runc spec --bundle {} failed: {st}", dir.display());
    }
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path)?)?;
    config["process"]["terminal"] = json!(false);
    config["process"]["args"] = json!(["/bin/true"]);
    config["root"] = json!({"path": rootfs, "readonly": false});
    if let Some(list) = config["process"]["env"].as_array_mut() {
        list.extend(env.iter().map(|e| json!(e)));
    }
    fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
    Ok(dir.to_path_buf())
}

/// RSS 1 s after start, once start-up allocations have settled.
fn settle_rss(pid: u32) -> Result<(u64, u64)> {
    std::thread::sleep(Duration::from_secs(1));
    rss_kib(pid)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn first_words(s: &str, n: usize) -> String {
    s.split_whitespace().take(n).collect::<Vec<_>>().join(" ")
}

/// Output of a command's first line, or "unknown".
fn first_line(prog: &str, args: &[&str]) -> String {
    Command::new(prog)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The binaries container runtimes start at every container start and stop, which gpushare
/// links static (scripts/link-static.sh).
const STATIC_BINARIES: [&str; 2] = ["gpushare-cdi-hook", "gpushare-runtime"];

/// Whether the ELF file at `path` names a program interpreter (`PT_INTERP`), i.e. is linked
/// dynamically. Only 64-bit little-endian ELF (what this bench runs on) is read.
fn has_interpreter(path: &Path) -> Result<bool> {
    const PT_INTERP: u32 = 3;
    let elf = fs::read(path).with_context(|| format!("{}", path.display()))?;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    if elf.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        bail!("{} is not a 64-bit little-endian ELF file", path.display());
    }
    let bad = || anyhow::anyhow!("{}: truncated ELF header", path.display());
    // e_phoff, e_phentsize and e_phnum of the ELF64 header.
    let phoff = usize::try_from(u64_at(0x20).ok_or_else(bad)?)?;
    let entsize = usize::from(u16_at(0x36).ok_or_else(bad)?);
    let count = usize::from(u16_at(0x38).ok_or_else(bad)?);
    for i in 0..count {
        if u32_at(phoff + i * entsize).ok_or_else(bad)? == PT_INTERP {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The binaries measured, copied from the build into `dir` as an install (`rpm`, `install`,
/// `cp`) writes them, through the write path rather than a mapping; returns `dir`.
///
/// Why not run them where the build left them: the linker (rust-lld) writes its output through
/// a shared mapping, and on this kernel (6.18, ext4) a program whose page cache was filled that
/// way starts about 0.14 ms slower per exec than the same bytes written with write(2) (65
/// against 72 page faults for the runtime wrapper's `--version`; a copy made through a mapping
/// is as slow as the linker's). The baselines (runc, `/bin/true`) are installed files, and so
/// are gpushare's on a node, so the build's files would charge gpushare for how the build
/// wrote them.
fn install(bin_dir: &Path, dir: &Path) -> Result<PathBuf> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for b in INSTALLED {
        let (from, to) = (bin_dir.join(b), dir.join(b));
        fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(dir.to_path_buf())
}

/// The programs [`install`] copies: every one the bench starts (the daemon finds the hook
/// beside itself).
const INSTALLED: [&str; 6] = [
    "gpushared",
    "gpushare",
    "gpushare-cdi-hook",
    "gpushare-runtime",
    "gpushare-mps-control",
    "gpushare-dra",
];

/// What the report says about the machine and the build.
fn machine(bin_dir: &Path) -> Vec<(String, String)> {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    let uts = nix::sys::utsname::uname()
        .map(|u| {
            format!(
                "{} {} {}",
                u.sysname().to_string_lossy(),
                u.release().to_string_lossy(),
                u.machine().to_string_lossy()
            )
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let git = first_line("git", &["rev-parse", "--short", "HEAD"]);
    // The report itself does not make the measured tree dirty.
    let dirty = Command::new("git")
        .args([
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":!BENCHMARKS.md",
        ])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    vec![
        (
            "date (UTC)".into(),
            first_line("date", &["-u", "+%Y-%m-%d %H:%M:%S"]),
        ),
        ("CPU".into(), format!("{model}, {cpus} usable cores")),
        ("memory".into(), mem),
        ("kernel".into(), uts),
        (
            "load average (1, 5, 15 min) at start".into(),
            fs::read_to_string("/proc/loadavg")
                .map(|l| first_words(&l, 3))
                .unwrap_or_default(),
        ),
        (
            "binaries".into(),
            format!(
                "{} (git {git}{}), measured as installed copies (see the notes)",
                bin_dir.display(),
                if dirty { ", uncommitted changes" } else { "" }
            ),
        ),
        (
            "linking".into(),
            format!(
                "{} static-pie (scripts/link-static.sh); the others dynamic",
                STATIC_BINARIES.map(|b| format!("`{b}`")).join(" and ")
            ),
        ),
        ("rustc".into(), first_line("rustc", &["--version"])),
        ("runc".into(), first_line("runc", &["--version"])),
        ("podman".into(), first_line("podman", &["--version"])),
        (
            "MPS control programs".into(),
            format!(
                "gpushare-mps-control (ours); NVIDIA's: {}",
                which("nvidia-cuda-mps-control")
                    .map_or("not installed".into(), |p| p.display().to_string())
            ),
        ),
        ("simulated node".into(), crate::daemon::PROFILE.into()),
    ]
}

/// A child process killed and reaped on drop.
#[derive(Debug)]
struct KillOnDrop(Child);

impl KillOnDrop {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A file removed on drop.
#[derive(Debug)]
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_rows_compare_each_size_with_the_first() {
        let rows = scaling_rows(&[(10, 2.0, 1.0), (1000, 3.0, 4.0)]);
        let got: Vec<(String, Option<f64>)> =
            rows.iter().map(|r| (r.figure.clone(), r.ratio)).collect();
        assert_eq!(
            got,
            vec![
                ("prepare, 10 claims, per claim".to_string(), Some(1.0)),
                ("prepare, 1000 claims, per claim".to_string(), Some(1.5)),
                ("unprepare, 10 claims, per claim".to_string(), Some(1.0)),
                ("unprepare, 1000 claims, per claim".to_string(), Some(4.0)),
            ]
        );
        assert!(rows.iter().all(|r| r.baseline == "10 claims"));
        assert!(scaling_rows(&[]).is_empty());
    }
}
