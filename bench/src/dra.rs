//! The DRA kubelet plugin: NodePrepareResources of an MPS claim end to end (kubelet
//! stand-in → `gpushare-dra` → API-server stand-in GET → `gpushared` prepare) against
//! `gpushared`'s own `prepare` of the same claim, alternating sample by sample; and one call
//! carrying one claim per GPU of the node against a one-claim call. The stand-ins are the
//! tests' (`gpushare-dra-testkit`): no kubelet or API server can run here.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpushare_dra_testkit::apiserver::ApiServer;
use gpushare_dra_testkit::kubelet::{Claim, Kubelet, Registered, Release};
use serde_json::Value;

use crate::daemon::{claim, mps_params, prepare, unprepare, Daemon, Uids, NODE};
use crate::report::{ms, Row, Section, Target};
use crate::stats::{ratio, summarize};

/// GPUs of the simulated node (p4d.24xlarge).
const GPUS: usize = 8;

fn claim_ref(c: &Value) -> Claim {
    Claim {
        namespace: c["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .into(),
        uid: c["metadata"]["uid"].as_str().unwrap_or_default().into(),
        name: c["metadata"]["name"].as_str().unwrap_or_default().into(),
    }
}

async fn via_plugin(reg: &Registered, claims: &[Claim]) -> Result<Duration> {
    let t = Instant::now();
    let answer = reg
        .prepare(claims, None)
        .await
        .map_err(anyhow::Error::msg)?;
    let took = t.elapsed();
    for (uid, a) in &answer {
        if let Err(e) = a {
            bail!("NodePrepareResources of {uid}: {e}");
        }
    }
    Ok(took)
}

async fn release(reg: &Registered, claims: &[Claim]) -> Result<()> {
    let r = reg
        .unprepare(claims, None)
        .await
        .map_err(anyhow::Error::msg)?;
    if let Some((uid, Err(e))) = r.iter().find(|(_, a)| a.is_err()) {
        bail!("NodeUnprepareResources of {uid}: {e}");
    }
    Ok(())
}

/// Runs both measurements with `samples` samples each; returns the report's section and
/// targets.
pub fn measure(
    bin_dir: &Path,
    work: &Path,
    d: &Daemon,
    uids: &mut Uids,
    samples: usize,
) -> Result<(Section, Vec<Target>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let api = ApiServer::start(NODE).await;
        let dir = work.join("dra");
        let (plugins, registry) = (dir.join("p"), dir.join("r"));
        std::fs::create_dir_all(&plugins)?;
        std::fs::create_dir_all(&registry)?;
        let kubeconfig = dir.join("kubeconfig");
        api.kubeconfig(NODE, &kubeconfig);
        std::fs::write(dir.join("dra.toml"), "")?;
        let log = std::fs::File::create(dir.join("plugin.log"))?;
        let mut child = Command::new(bin_dir.join("gpushare-dra"))
            .arg("--config")
            .arg(dir.join("dra.toml"))
            .args(["--node-name", NODE, "--metrics-address", "off"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--gpushared-socket")
            .arg(&d.socket)
            .arg("--plugins-dir")
            .arg(&plugins)
            .arg("--registry-dir")
            .arg(&registry)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning gpushare-dra")?;
        let result = async {
            let reg = Kubelet::new(&registry, Release::K134)
                .register("gpu.nvidia.com", Duration::from_secs(30), None)
                .await
                .map_err(anyhow::Error::msg)?;
            let mut c = d.client()?;
            let (mut direct, mut e2e) = (Vec::new(), Vec::new());
            for i in 0..=samples {
                let a = claim(&uids.next(), "gpu-0", &mps_params());
                let b = claim(&uids.next(), "gpu-0", &mps_params());
                api.add_claim(&b, Some(NODE));
                let b_ref = claim_ref(&b);
                // Alternate which goes first, so neither always runs on a warmer host.
                let mut one_direct = || -> Result<Duration> {
                    let t = Instant::now();
                    prepare(&mut c, &a)?;
                    let took = t.elapsed();
                    unprepare(&mut c, a["metadata"]["uid"].as_str().unwrap_or_default())?;
                    Ok(took)
                };
                let (td, te) = if i % 2 == 0 {
                    let td = one_direct()?;
                    let te = via_plugin(&reg, std::slice::from_ref(&b_ref)).await?;
                    release(&reg, std::slice::from_ref(&b_ref)).await?;
                    (td, te)
                } else {
                    let te = via_plugin(&reg, std::slice::from_ref(&b_ref)).await?;
                    release(&reg, std::slice::from_ref(&b_ref)).await?;
                    (one_direct()?, te)
                };
                // The first pair warms both paths up.
                if i > 0 {
                    direct.push(td);
                    e2e.push(te);
                }
            }
            let (mut single, mut per_claim) = (Vec::new(), Vec::new());
            for i in 0..=samples.div_ceil(2) {
                let one = claim(&uids.next(), "gpu-0", &mps_params());
                api.add_claim(&one, Some(NODE));
                let batch: Vec<Value> = (0..GPUS)
                    .map(|g| claim(&uids.next(), &format!("gpu-{g}"), &mps_params()))
                    .collect();
                for b in &batch {
                    api.add_claim(b, Some(NODE));
                }
                let one_ref = [claim_ref(&one)];
                let refs: Vec<Claim> = batch.iter().map(claim_ref).collect();
                let ts = via_plugin(&reg, &one_ref).await?;
                release(&reg, &one_ref).await?;
                let tb = via_plugin(&reg, &refs).await?;
                release(&reg, &refs).await?;
                if i > 0 {
                    single.push(ts);
                    per_claim.push(tb / u32::try_from(GPUS).unwrap_or(1));
                }
            }
            anyhow::Ok((direct, e2e, single, per_claim))
        }
        .await;
        let _ = child.kill();
        let _ = child.wait();
        let (direct, e2e, single, per_claim) = result.with_context(|| {
            format!(
                "plugin log:\n{}",
                std::fs::read_to_string(dir.join("plugin.log")).unwrap_or_default()
            )
        })?;
        let (d, e) = (
            summarize(&direct).context("no samples")?,
            summarize(&e2e).context("no samples")?,
        );
        let (s, p) = (
            summarize(&single).context("no samples")?,
            summarize(&per_claim).context("no samples")?,
        );
        let rows = vec![
            Row {
                figure: "NodePrepareResources of an MPS claim, end to end, p50".into(),
                value: ms(e.p50_ms),
                baseline: "gpushared's own `prepare` of the same claim".into(),
                baseline_value: ms(d.p50_ms),
                ratio: ratio(e.p50_ms, d.p50_ms),
            },
            Row {
                figure: "NodePrepareResources of an MPS claim, end to end, p99".into(),
                value: ms(e.p99_ms),
                baseline: "gpushared's own `prepare` of the same claim".into(),
                baseline_value: ms(d.p99_ms),
                ratio: ratio(e.p99_ms, d.p99_ms),
            },
            Row {
                figure: format!("one call with {GPUS} MPS claims (one per GPU), per claim, p50"),
                value: ms(p.p50_ms),
                baseline: "a one-claim call".into(),
                baseline_value: ms(s.p50_ms),
                ratio: ratio(p.p50_ms, s.p50_ms),
            },
        ];
        let targets = vec![
            Target {
                name: "NodePrepareResources (MPS) end to end ≤ 1.15 × gpushared's prepare (p50)"
                    .into(),
                measured: e.p50_ms / d.p50_ms,
                limit: 1.15,
                unit: "×".into(),
            },
            Target {
                name: format!("one call with a claim per GPU ({GPUS}): per-claim ≤ 1.2 × a one-claim call (p50)"),
                measured: p.p50_ms / s.p50_ms,
                limit: 1.2,
                unit: "×".into(),
            },
        ];
        let section = Section {
            title: "9. The DRA kubelet plugin".into(),
            method: format!(
                "A kubelet stand-in (the tests', generated from the same protos) registers \
                 `gpushare-dra` and calls v1 NodePrepareResources over its Unix socket; the plugin \
                 GETs each claim from an in-process API-server stand-in, prepares it through \
                 `gpushared` (MPS, the emulator's control daemon) and maps the answer. {samples} \
                 samples, alternating with `gpushared`'s own `prepare` of an identical claim on \
                 the same GPU (timed from send to answer on an open connection); each claim is \
                 released after its sample. Then {n} pairs of a call with one MPS claim per GPU \
                 (its time divided by {GPUS}) and a one-claim call. The first sample of each is \
                 a warm-up.",
                n = samples.div_ceil(2)
            ),
            rows,
        };
        Ok((section, targets))
    })
}
