//! Test support: the configuration every service unit test uses, and the records on disk as
//! one checkpoint.

use super::*;

/// The configuration every service unit test uses: everything under `root`, a hook that is
/// never run, a 1 MiB shm size.
impl ServiceConfig {
    pub(crate) fn for_tests(root: &Path, node_name: &str) -> ServiceConfig {
        ServiceConfig {
            node_name: node_name.into(),
            drivers: vec!["gpu.nvidia.com".into()],
            run_dir: root.join("run"),
            cdi_dir: root.join("cdi"),
            checkpoint: root.join("state/checkpoint.json"),
            hook: HookConfig {
                path: "/usr/bin/gpushare-cdi-hook".into(),
                socket: "/run/gpushare/gpushared.sock".into(),
                timeout_secs: 10,
            },
            shm_bytes: Some(1 << 20),
            driver_spec: None,
        }
    }
}

/// The claim records on disk as one checkpoint, for tests: what `load` reads is what the next
/// start finds, and `save` plants records for it.
pub(crate) struct RecordsOnDisk(PathBuf);

pub(crate) struct OnDisk {
    pub(crate) checkpoint: crate::checkpoint::Checkpoint,
    /// Records that are not records.
    pub(crate) quarantined: Option<String>,
}

impl RecordsOnDisk {
    pub(crate) fn new(checkpoint: PathBuf) -> RecordsOnDisk {
        RecordsOnDisk(checkpoint)
    }

    /// What a start reads: the records, with each claim's CDI spec path and containers as
    /// the reconcile completes them (from the `for_tests` layout: `<root>/state`,
    /// `<root>/run`, `<root>/cdi`).
    pub(crate) fn load(&self) -> std::io::Result<OnDisk> {
        let dir = self.0.parent().unwrap_or(Path::new("."));
        let root = dir.parent().unwrap_or(Path::new("."));
        let (mut checkpoint, problems) = crate::store::snapshot(dir);
        for (uid, c) in &mut checkpoint.claims {
            c.cdi_spec = cdi::spec_path(&root.join("cdi"), uid).display().to_string();
            c.attached = persisted::host_record_read(&root.join("run"), uid)
                .0
                .iter()
                .map(Into::into)
                .collect();
        }
        let quarantined = (!problems.is_empty()).then(|| problems.join("; "));
        Ok(OnDisk {
            checkpoint,
            quarantined,
        })
    }

    /// Removes every record (the checkpoint goes missing); panics when there was none.
    pub(crate) fn remove(&self) {
        let dir = self.0.parent().unwrap_or(Path::new("."));
        std::fs::remove_file(dir.join(crate::store::STORE_FILE)).unwrap();
        std::fs::remove_dir_all(dir.join(crate::store::CLAIMS_DIR)).unwrap();
        let _ = std::fs::remove_dir_all(dir.join(crate::store::TOMBSTONES_DIR));
    }

    /// Writes `cp` as the version 2 `checkpoint.json` a previous release leaves, which the
    /// next start migrates, whatever its keys and fields: how records of any shape reach a
    /// start.
    pub(crate) fn save_v2(&self, cp: &crate::checkpoint::Checkpoint) -> std::io::Result<()> {
        crate::checkpoint::CheckpointFile::new(self.0.clone()).save(cp)
    }

    pub(crate) fn save(&self, cp: &crate::checkpoint::Checkpoint) -> std::io::Result<()> {
        crate::store::replace_with(self.0.parent().unwrap_or(Path::new(".")), cp)
    }
}

/// The protocol's view of the claims, as the socket answers them: what most service tests
/// assert on.
impl Service {
    pub(crate) fn get_claim(&self, uid: &str) -> Result<ClaimInfo, ServiceError> {
        self.claim(uid).map(|c| crate::claim::wire::claim_info(&c))
    }

    pub(crate) fn list_claims(&self) -> Vec<ClaimInfo> {
        self.claims()
            .iter()
            .map(|c| crate::claim::wire::claim_info(c))
            .collect()
    }
}
