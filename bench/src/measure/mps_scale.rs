//! 4c. MPS prepare with NVIDIA's control program while many claims are held (`--only
//! mps-scale`): the emulator's row of section 4b cannot show what NVIDIA's daemon costs a
//! prepare beside a daemon that holds thousands of claims, so this runs the same cycles with
//! `nvidia-cuda-mps-control` on two daemons of its own, one holding `mps_scale_held`
//! time-sliced claims and one holding none, alternating cycle by cycle.

use std::time::Instant;

use anyhow::{Context, Result};

use super::{prepare_time_sliced, progress, row_p, sum, which, Ctx};
use crate::daemon::{mps_params, Daemon};
use crate::report::{Section, Target};

/// The target: MPS prepare p50 with the claims held against none, NVIDIA's program.
const LIMIT: f64 = 1.10;

impl Ctx {
    /// Section 4c and its target; skipped (with a note on stderr) where NVIDIA's program is
    /// not installed, unless `required` (`--only mps-scale`), which makes that an error.
    pub(super) fn mps_scale_nvidia(&mut self, required: bool) -> Result<()> {
        let Some(program) = which("nvidia-cuda-mps-control") else {
            anyhow::ensure!(
                !required,
                "nvidia-cuda-mps-control is not on PATH: the MPS-at-scale row needs NVIDIA's program"
            );
            progress("MPS at scale with NVIDIA's program: skipped (nvidia-cuda-mps-control is not on PATH)");
            return Ok(());
        };
        let held = self.sizes.mps_scale_held;
        let cycles = self.sizes.cycles;
        progress(&format!(
            "MPS at scale with NVIDIA's program: preparing {held} time-sliced claims"
        ));
        let mut full = Daemon::start(&self.bin_dir, &self.work.join("ns"), &program)?;
        let empty = Daemon::start(&self.bin_dir, &self.work.join("n0"), &program)?;
        let uids: Vec<String> = (0..held).map(|_| self.uids.next()).collect();
        let t = Instant::now();
        prepare_time_sliced(&mut full.client()?, &uids)?;
        progress(&format!(
            "MPS at scale with NVIDIA's program: {held} claims held after {:.0} s; {cycles} cycles a side",
            t.elapsed().as_secs_f64()
        ));
        let (mut at_scale, mut alone) = (vec![], vec![]);
        for _ in 0..cycles {
            let (p0, _, _) = self.cycles(&empty, &mps_params(), "gpu-0", 1)?;
            alone.extend(p0);
            let (p, _, _) = self.cycles(&full, &mps_params(), "gpu-0", 1)?;
            at_scale.extend(p);
        }
        // The time-sliced claims leave nothing outside the daemon's own directories (their
        // specs and claim directories are on its tmpfs, unmounted on drop, the GPUs are
        // simulated there too, and every MPS claim was released): a SIGKILL is enough, where
        // releasing them one by one would take as long as preparing them, and a SIGTERM writes
        // every claim's record once more.
        full.kill().context("killing the daemon at scale")?;
        drop(full);
        drop(empty);
        let (p, p0) = (sum(&at_scale)?, sum(&alone)?);
        self.report.targets.push(Target {
            name: format!(
                "MPS prepare (NVIDIA's `nvidia-cuda-mps-control`) p50 with {held} claims held ≤ {LIMIT:.2} × with none (a second daemon, interleaved)"
            ),
            measured: p.p50_ms / p0.p50_ms,
            limit: LIMIT,
            unit: "×".into(),
        });
        self.report.sections.push(Section {
            title: "4c. MPS prepare at scale, NVIDIA's control program".into(),
            method: format!(
                "Two daemons with NVIDIA's `{}` as their MPS control program: one holding {held} \
                 time-sliced claims (spread over GPUs 1–7, prepared first), one holding none. \
                 {cycles} MPS prepare/unprepare cycles on GPU 0 of each, alternating cycle by \
                 cycle (the empty daemon first), each prepare timed from send to answer on an \
                 open connection. Section 4b's emulator row is the same measurement with our \
                 emulator at 1,000 claims.",
                program.display()
            ),
            rows: row_p(
                &format!("MPS prepare (NVIDIA's `nvidia-cuda-mps-control`), {held} time-sliced claims held"),
                &p,
                "the same on a second daemon holding none, interleaved",
                &p0,
            )
            .into(),
        });
        Ok(())
    }
}
