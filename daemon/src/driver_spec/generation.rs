//! Running generations of the driver's spec and installing what they give: which use runs a
//! generation and which takes the outcome of one under way, how overlapping generations are
//! applied in the order they started, how one is read, cleaned ([`strip_host_mps`]) and
//! installed, and how a failure is recorded for [`retry`] and `health`. The waiting rules are
//! [`DriverSpecs`]' own (see its doc); this is how they are kept.

use std::sync::MutexGuard;

use gpushare_cdi::Spec;

use super::{
    alias, retry, strip_host_mps, DriverSpecError, DriverSpecs, GenerateError, Inner, Snapshot,
    HOST_MPS_PIPE,
};

impl DriverSpecs {
    /// A spec generated after this call began: [`DriverSpecs::attempt`], unless the last
    /// generation failed and a new one is not due (then that failure, at once) or is due and
    /// one is under way (then that one's outcome, once it ends).
    pub(super) fn fresh(&self, inner: MutexGuard<'_, Inner>) -> Result<Spec, DriverSpecError> {
        if let Some(f) = &inner.failure {
            let now = self.clock.now();
            if !f.due(now, &self.generator.inputs()) {
                return Err(f.answer(now));
            }
            // The retry thread's, or another prepare's: a failing generator is not run once
            // more for every prepare that comes while it runs.
            if let Some(&n) = inner.running.last() {
                return self.outcome_of(inner, n);
            }
        }
        self.attempt(inner)
    }

    /// Waits for generation `n` to end (bounded by the generator's own bound), then answers
    /// what is installed or the failure now.
    fn outcome_of(
        &self,
        mut inner: MutexGuard<'_, Inner>,
        n: u64,
    ) -> Result<Spec, DriverSpecError> {
        while inner.running.contains(&n) {
            inner = self.ended.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
        self.outcome(&inner)
    }

    /// What a use is answered now without running the generator: the last failure, else the
    /// installed spec.
    fn outcome(&self, inner: &Inner) -> Result<Spec, DriverSpecError> {
        match (&inner.failure, &inner.installed) {
            (Some(f), _) => Err(f.answer(self.clock.now())),
            (None, Some(spec)) => Ok(spec.clone()),
            (None, None) => Err(DriverSpecError::Failed(format!(
                "the NVIDIA driver's CDI spec {} is not generated yet",
                self.spec_path().display()
            ))),
        }
    }

    /// Runs a generation (outside the lock: other uses, `set_aliases` and `health` go on
    /// meanwhile) and installs it, recording how it went for the retries and `health`; one
    /// that ends after a later-started one has been applied changes nothing and answers
    /// [`DriverSpecs::outcome`].
    pub(super) fn attempt(
        &self,
        mut inner: MutexGuard<'_, Inner>,
    ) -> Result<Spec, DriverSpecError> {
        inner.started += 1;
        let n = inner.started;
        inner.running.insert(n);
        if n == 1 {
            // A killed gpushared's outputs: only this process's generations write there.
            self.sweep_staging();
        }
        drop(inner);
        let running = Running {
            specs: self,
            n,
            ended: false,
        };
        // Read before the run: a change during it is one the next check sees.
        let inputs = self.generator.inputs();
        let generated = self.generate(n);
        let mut inner = self.lock();
        if n < inner.applied {
            tracing::debug!(
                generation = n,
                newer = inner.applied,
                "a generation ended after a later one; the later one's spec stays"
            );
            running.end(&mut inner);
            return self.outcome(&inner);
        }
        inner.applied = n;
        let result = generated.and_then(|generated| self.install(&mut inner, generated));
        let generator = self.generator.describe();
        match &result {
            Ok(_) => {
                if let Some(f) = inner.failure.take() {
                    tracing::info!(failures = f.failures, generator = %generator, "the NVIDIA driver's CDI spec is generated again; claims that need it are prepared again");
                }
            }
            Err(e) => {
                let failures = inner.failure.as_ref().map_or(0, |f| f.failures) + 1;
                let wait = self.policy.delay(failures);
                let not_installed = matches!(e, DriverSpecError::NotInstalled(_));
                // A missing toolkit is looked for at every use: said once, not every time.
                let repeated = not_installed
                    && inner
                        .failure
                        .as_ref()
                        .is_some_and(|f| f.error.to_string() == e.to_string());
                if !repeated {
                    if not_installed {
                        tracing::error!(error = %e, generator = %generator, "cannot generate the NVIDIA driver's CDI spec; claims that need it are refused until it can be");
                    } else {
                        tracing::error!(error = %e, generator = %generator, failures, retry_in_s = wait.as_secs(), "cannot generate the NVIDIA driver's CDI spec; claims that need it are refused until it can be (the generator is run again after the wait, or at once when it or the driver changes)");
                    }
                }
                inner.failure = Some(retry::Failure {
                    error: e.clone(),
                    failures,
                    next: self.clock.now() + wait,
                    inputs,
                });
            }
        }
        let snap = Snapshot {
            generator,
            ok: result.is_ok(),
            error: inner.failure.as_ref().map(|f| f.error.to_string()),
            failures: inner.failure.as_ref().map_or(0, |f| f.failures),
            next: inner
                .failure
                .as_ref()
                .filter(|f| !matches!(f.error, DriverSpecError::NotInstalled(_)))
                .map(|f| f.next),
        };
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = snap;
        running.end(&mut inner);
        result
    }

    /// Removes what generations of an earlier process left in the staging directory.
    fn sweep_staging(&self) {
        let Ok(entries) = std::fs::read_dir(&self.staging) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("generated") && name.ends_with(".json") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Installs `generated` with the aliases: validated, written atomically; kept in memory.
    pub(super) fn install(
        &self,
        inner: &mut Inner,
        generated: Spec,
    ) -> Result<Spec, DriverSpecError> {
        let (spec, left_out) = alias::with_aliases(&generated, &inner.aliases);
        for (name, why) in &left_out {
            tracing::warn!(alias = %name, reason = %why, "a recreated MIG slice's first name is not in the driver's CDI spec");
        }
        gpushare_cdi::validate_spec(&spec).map_err(|e| {
            DriverSpecError::Failed(format!("the driver's CDI spec is not valid: {e}"))
        })?;
        crate::fsutil::create_dir_if_missing(&self.cdi_dir, 0o755).map_err(|e| {
            DriverSpecError::Failed(format!("creating {}: {e}", self.cdi_dir.display()))
        })?;
        let mut bytes = serde_json::to_vec_pretty(&spec)
            .map_err(|e| DriverSpecError::Failed(format!("encoding the driver's CDI spec: {e}")))?;
        bytes.push(b'\n');
        crate::fsutil::write_atomic(&self.spec_path(), &bytes, 0o644).map_err(|e| {
            DriverSpecError::Failed(format!("writing {}: {e}", self.spec_path().display()))
        })?;
        tracing::info!(path = %self.spec_path().display(), devices = spec.devices.len(), aliases = spec.devices.len() - generated.devices.len(), generator = %self.generator.describe(), "driver's CDI spec installed");
        inner.generated = Some(generated);
        inner.installed = Some(spec.clone());
        inner.left_out = left_out;
        Ok(spec)
    }

    /// Runs the generator (generation `n`, into a file of its own) and reads, checks and
    /// cleans what it wrote.
    fn generate(&self, n: u64) -> Result<Spec, DriverSpecError> {
        crate::fsutil::create_dir_if_missing(&self.staging, 0o700).map_err(|e| {
            DriverSpecError::Failed(format!("creating {}: {e}", self.staging.display()))
        })?;
        let out = self.staging.join(format!("generated-{n}.json"));
        crate::fsutil::remove_file_if_exists(&out)
            .map_err(|e| DriverSpecError::Failed(format!("removing {}: {e}", out.display())))?;
        let generated = self.generator.generate(&self.vendor, &self.class, &out);
        let loaded = generated
            .map_err(|e| match e {
                GenerateError::NotInstalled(m) => DriverSpecError::NotInstalled(m),
                GenerateError::Failed(m) => DriverSpecError::Failed(m),
            })
            .and_then(|()| {
                gpushare_cdi::load_spec_file(&out).map_err(|e| {
                    DriverSpecError::Failed(format!(
                        "the driver's CDI spec that {} wrote is not valid: {e}",
                        self.generator.describe()
                    ))
                })
            });
        let _ = std::fs::remove_file(&out);
        let mut spec = loaded?;
        if spec.kind != self.kind() {
            return Err(DriverSpecError::Failed(format!(
                "{} wrote a spec of kind {:?}, not {:?}",
                self.generator.describe(),
                spec.kind,
                self.kind()
            )));
        }
        let removed = strip_host_mps(&mut spec);
        if removed > 0 {
            tracing::warn!(mounts = removed, path = HOST_MPS_PIPE, "removed the host's MPS pipe directory from the driver's CDI spec: a node-wide MPS control daemon ran at generation time, and claims' containers must not reach it");
        }
        // Removing mounts never raises the version needed; the lowest that fits keeps older
        // readers (podman 4.3 reads up to 0.5.0) able to read it.
        spec.cdi_version = gpushare_cdi::minimum_version(&spec).to_string();
        gpushare_cdi::validate_spec(&spec).map_err(|e| {
            DriverSpecError::Failed(format!("the driver's CDI spec is not valid: {e}"))
        })?;
        Ok(spec)
    }
}

/// A generation under way ([`Inner::running`]): ended when its outcome is applied, or when it
/// unwinds, so that no use waits on it for ever.
struct Running<'a> {
    specs: &'a DriverSpecs,
    n: u64,
    ended: bool,
}

impl Running<'_> {
    fn end(mut self, inner: &mut Inner) {
        inner.running.remove(&self.n);
        self.specs.ended.notify_all();
        self.ended = true;
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.specs.lock().running.remove(&self.n);
            self.specs.ended.notify_all();
        }
    }
}
