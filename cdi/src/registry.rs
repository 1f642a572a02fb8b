//! The spec registry: every valid spec found in a list of spec directories, the devices they
//! define, and the errors met on the way; resolution of qualified names to merged edits.
//!
//! Rules (research notes §2.4, the reference cache):
//! - Directories are scanned in order; a spec's priority is its directory's index, so a later
//!   directory wins. The default is [`DEFAULT_SPEC_DIRS`].
//! - Only regular files (symlinks to them count) named `*.json` or `*.yaml` directly in a
//!   directory are read, in file-name order; subdirectories are not entered; a missing
//!   directory is skipped silently.
//! - A device defined by specs of equal priority is a conflict: it is removed from the
//!   registry (even if a higher-priority directory also defines it, as in the reference
//!   cache) and an error is recorded for both files.
//! - A file that cannot be read, decoded or validated gets an error recorded under its path;
//!   it never affects other files.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::apply::{apply_edits_with, ApplyError, HostDevices, HostFs};
use crate::decode::{load_spec_file, SpecFormat};
use crate::model::{ContainerEdits, Device, Spec};
use crate::name::qualified_name;
use crate::validate::SpecError;

/// The spec directories used when none are configured: static, then dynamic (higher priority).
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// A problem met while scanning spec directories. Recorded, never fatal.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A spec file could not be loaded.
    #[error("failed to load CDI spec {path}: {source}")]
    Load {
        /// The file.
        path: PathBuf,
        /// Why.
        source: SpecError,
    },
    /// A device is defined by two specs of equal priority.
    #[error("conflicting device {device:?} (specs {first}, {second})")]
    Conflict {
        /// The qualified device name.
        device: String,
        /// The spec that defined it first.
        first: PathBuf,
        /// The spec that defined it again.
        second: PathBuf,
    },
    /// A spec directory exists but could not be listed.
    #[error("failed to scan CDI spec directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A spec loaded from a file.
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    /// The decoded, validated spec.
    pub spec: Spec,
    /// The file it came from.
    pub path: PathBuf,
    /// The index of its directory in the registry's directory list (higher wins).
    pub priority: usize,
}

/// Some requested devices are not in the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unresolvable CDI devices {}", .unresolved.join(", "))]
pub struct ResolveError {
    /// Every requested name that was not found, in request order.
    pub unresolved: Vec<String>,
}

/// Why injection failed.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// Some devices are unknown.
    #[error(transparent)]
    Unresolved(#[from] ResolveError),
    /// Applying the merged edits failed; the config was left unchanged.
    #[error(transparent)]
    Apply(#[from] ApplyError),
}

/// Specs and devices from a list of spec directories. Build with [`Registry::load`] (or
/// [`Registry::new`] and [`Registry::refresh`]); query with [`Registry::device`], resolve with
/// [`Registry::resolve`], and apply with [`Registry::inject`].
#[derive(Debug, Default)]
pub struct Registry {
    dirs: Vec<PathBuf>,
    specs: Vec<LoadedSpec>,
    /// Qualified name → (index in `specs`, index in that spec's devices).
    devices: BTreeMap<String, (usize, usize)>,
    errors: BTreeMap<PathBuf, Vec<RegistryError>>,
}

impl Registry {
    /// An empty registry over `dirs` (lowest priority first). Call [`Registry::refresh`].
    pub fn new<P: AsRef<Path>>(dirs: &[P]) -> Registry {
        Registry {
            dirs: dirs.iter().map(|d| d.as_ref().to_path_buf()).collect(),
            ..Registry::default()
        }
    }

    /// A registry over `dirs`, scanned once.
    pub fn load<P: AsRef<Path>>(dirs: &[P]) -> Registry {
        let mut registry = Registry::new(dirs);
        registry.refresh();
        registry
    }

    /// A registry over [`DEFAULT_SPEC_DIRS`], scanned once.
    pub fn load_default() -> Registry {
        Registry::load(&DEFAULT_SPEC_DIRS)
    }

    /// The spec directories, lowest priority first.
    pub fn spec_dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Rescans every directory, replacing specs, devices and errors.
    pub fn refresh(&mut self) {
        let mut scan = Scan::default();
        for (priority, dir) in self.dirs.iter().enumerate() {
            let files = match spec_files(dir) {
                Ok(files) => files,
                Err(source) if source.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    scan.errors
                        .entry(dir.clone())
                        .or_default()
                        .push(RegistryError::Dir {
                            path: dir.clone(),
                            source,
                        });
                    continue;
                }
            };
            for path in files {
                scan.add_file(path, priority);
            }
        }
        scan.finish(self);
    }

    /// A registry of exactly these spec files, all of one priority (as files of one spec
    /// directory are), read in the order given: what a runtime scanning their directory
    /// would see of them, for checking that some devices resolve without reading every other
    /// spec of the directory. [`Registry::refresh`] on it finds nothing (it has no
    /// directories).
    pub fn load_files<P: AsRef<Path>>(files: &[P]) -> Registry {
        let mut registry = Registry::default();
        let mut scan = Scan::default();
        for path in files {
            scan.add_file(path.as_ref().to_path_buf(), 0);
        }
        scan.finish(&mut registry);
        registry
    }

    /// Every loaded spec, in scan order.
    pub fn specs(&self) -> &[LoadedSpec] {
        &self.specs
    }

    /// Errors of the last scan, keyed by file (or directory) path.
    pub fn errors(&self) -> &BTreeMap<PathBuf, Vec<RegistryError>> {
        &self.errors
    }

    /// Takes the errors of the last scan out of the registry (leaving none), keyed as
    /// [`Registry::errors`]: for a caller that returns one as its own error's source.
    pub fn take_errors(&mut self) -> BTreeMap<PathBuf, Vec<RegistryError>> {
        std::mem::take(&mut self.errors)
    }

    /// Qualified names of every device, sorted.
    pub fn device_names(&self) -> Vec<&str> {
        self.devices.keys().map(String::as_str).collect()
    }

    /// A device and the spec defining it, by qualified name.
    pub fn device(&self, qualified: &str) -> Option<(&LoadedSpec, &Device)> {
        let &(s, d) = self.devices.get(qualified)?;
        let spec = &self.specs[s];
        Some((spec, &spec.spec.devices[d]))
    }

    /// Merges the edits for `names` in request order: for each device, its spec's
    /// spec-level edits the first time a device of that spec is seen, then the device's own
    /// edits. Unknown names give a [`ResolveError`] listing all of them.
    pub fn resolve<S: AsRef<str>>(&self, names: &[S]) -> Result<ContainerEdits, ResolveError> {
        let mut edits = ContainerEdits::default();
        let mut seen_specs = HashSet::new();
        let mut unresolved = Vec::new();
        for name in names {
            let name = name.as_ref();
            let Some(&(s, d)) = self.devices.get(name) else {
                unresolved.push(name.to_string());
                continue;
            };
            let spec = &self.specs[s].spec;
            if seen_specs.insert(s) {
                edits.append(&spec.container_edits);
            }
            edits.append(&spec.devices[d].container_edits);
        }
        if unresolved.is_empty() {
            Ok(edits)
        } else {
            Err(ResolveError { unresolved })
        }
    }

    /// Resolves `names` and applies the merged edits to an OCI config, all or nothing: on
    /// error `config` is unchanged. Device nodes are examined on the real host.
    pub fn inject<S: AsRef<str>>(
        &self,
        config: &mut Value,
        names: &[S],
    ) -> Result<(), InjectError> {
        self.inject_with(config, names, &HostFs)
    }

    /// [`Registry::inject`] with device-node facts from `host`.
    pub fn inject_with<S: AsRef<str>>(
        &self,
        config: &mut Value,
        names: &[S],
        host: &dyn HostDevices,
    ) -> Result<(), InjectError> {
        let edits = self.resolve(names)?;
        let mut edited = config.clone();
        apply_edits_with(&mut edited, &edits, host)?;
        *config = edited;
        Ok(())
    }
}

/// A scan under way: specs, devices and errors as files are added in priority order.
#[derive(Default)]
struct Scan {
    specs: Vec<LoadedSpec>,
    /// Qualified name → (index in `specs`, index in that spec's devices).
    devices: BTreeMap<String, (usize, usize)>,
    conflicts: BTreeSet<String>,
    errors: BTreeMap<PathBuf, Vec<RegistryError>>,
}

impl Scan {
    fn add_file(&mut self, path: PathBuf, priority: usize) {
        let spec = match load_spec_file(&path) {
            Ok(spec) => spec,
            Err(source) => {
                self.errors
                    .entry(path.clone())
                    .or_default()
                    .push(RegistryError::Load {
                        path: path.clone(),
                        source,
                    });
                return;
            }
        };
        let spec_index = self.specs.len();
        for (dev_index, device) in spec.devices.iter().enumerate() {
            let qualified = qualified_name(&spec.kind, &device.name);
            if let Some(&(other, _)) = self.devices.get(&qualified) {
                let other_spec = &self.specs[other];
                if other_spec.priority == priority {
                    for at in [&other_spec.path, &path] {
                        self.errors
                            .entry(at.clone())
                            .or_default()
                            .push(RegistryError::Conflict {
                                device: qualified.clone(),
                                first: other_spec.path.clone(),
                                second: path.clone(),
                            });
                    }
                    self.conflicts.insert(qualified);
                    continue;
                }
            }
            self.devices.insert(qualified, (spec_index, dev_index));
        }
        self.specs.push(LoadedSpec {
            spec,
            path,
            priority,
        });
    }

    fn finish(mut self, registry: &mut Registry) {
        for name in &self.conflicts {
            self.devices.remove(name);
        }
        registry.specs = self.specs;
        registry.devices = self.devices;
        registry.errors = self.errors;
    }
}

/// The spec files directly in `dir`, sorted by name.
fn spec_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if SpecFormat::from_path(&path).is_none() {
            continue;
        }
        // Follows symlinks; directories, fifos, sockets and dangling links are skipped
        // (reading a fifo could block forever).
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

impl fmt::Display for LoadedSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, priority {})",
            self.spec.kind,
            self.path.display(),
            self.priority
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn spec_json(kind: &str, devices: &[(&str, &str)], spec_env: Option<&str>) -> String {
        let devs: Vec<String> = devices
            .iter()
            .map(|(name, env)| {
                format!(r#"{{"name":"{name}","containerEdits":{{"env":["{env}"]}}}}"#)
            })
            .collect();
        let spec_edits = spec_env
            .map(|e| format!(r#","containerEdits":{{"env":["{e}"]}}"#))
            .unwrap_or_default();
        format!(
            r#"{{"cdiVersion":"0.3.0","kind":"{kind}","devices":[{}]{spec_edits}}}"#,
            devs.join(",")
        )
    }

    #[test]
    fn scans_json_and_yaml_only_without_recursion() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path();
        write(d, "a.json", &spec_json("ex.com/a", &[("x", "A=1")], None));
        write(d, "b.yaml", "cdiVersion: 0.3.0\nkind: ex.com/b\ndevices:\n- name: y\n  containerEdits:\n    env: [B=1]\n");
        write(d, "c.yml", &spec_json("ex.com/c", &[("z", "C=1")], None));
        write(d, "d.txt", &spec_json("ex.com/d", &[("z", "D=1")], None));
        std::fs::create_dir(d.join("sub.json")).unwrap();
        write(
            &d.join("sub.json"),
            "e.json",
            &spec_json("ex.com/e", &[("z", "E=1")], None),
        );
        std::os::unix::fs::symlink(d.join("a.json"), d.join("link.json")).unwrap();
        let reg = Registry::load(&[d]);
        // link.json points at a.json: the same devices at the same priority conflict.
        assert_eq!(reg.device_names(), vec!["ex.com/b=y"]);
        assert_eq!(reg.specs().len(), 3);
        let errs: Vec<String> = reg
            .errors()
            .values()
            .flatten()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs
            .iter()
            .all(|e| e.contains("conflicting device \"ex.com/a=x\"")));
    }

    #[test]
    fn missing_dirs_are_skipped_and_bad_files_recorded() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("cdi");
        std::fs::create_dir(&d).unwrap();
        let good = write(
            &d,
            "good.json",
            &spec_json("ex.com/a", &[("x", "A=1")], None),
        );
        let bad = write(&d, "bad.json", "{not json");
        let unknown = write(
            &d,
            "unknown.yaml",
            "cdiVersion: 0.3.0\nkind: ex.com/u\nbogus: 1\ndevices: []\n",
        );
        let low = write(
            &d,
            "low.json",
            r#"{"cdiVersion":"0.3.0","kind":"ex.com/l","devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}"#,
        );
        let reg = Registry::load(&[root.path().join("missing"), d.clone()]);
        assert_eq!(reg.device_names(), vec!["ex.com/a=x"]);
        assert!(!reg.errors().contains_key(&good));
        for path in [&bad, &unknown, &low] {
            let e = &reg.errors()[path];
            assert_eq!(e.len(), 1);
            assert!(matches!(e[0], RegistryError::Load { .. }));
        }
        assert!(reg.errors()[&unknown][0].to_string().contains("bogus"));
        assert!(reg.errors()[&low][0]
            .to_string()
            .contains("at least v0.5.0"));
        assert_eq!(reg.device("ex.com/a=x").unwrap().1.name, "x");
        assert_eq!(reg.device("ex.com/a=x").unwrap().0.priority, 1);
        assert!(reg.device("ex.com/a=y").is_none());
    }

    #[test]
    fn later_directories_win_and_equal_priority_conflicts_remove_the_device() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc");
        let run = root.path().join("run");
        std::fs::create_dir(&etc).unwrap();
        std::fs::create_dir(&run).unwrap();
        write(
            &etc,
            "v.json",
            &spec_json("ex.com/v", &[("a", "FROM=etc"), ("b", "FROM=etc")], None),
        );
        write(
            &run,
            "v.json",
            &spec_json("ex.com/v", &[("a", "FROM=run")], None),
        );
        let p1 = write(
            &run,
            "c1.json",
            &spec_json("ex.com/c", &[("x", "C=1"), ("only1", "O=1")], None),
        );
        let p2 = write(
            &run,
            "c2.yaml",
            &spec_json("ex.com/c", &[("x", "C=2")], None),
        );
        let reg = Registry::load(&[&etc, &run]);
        assert_eq!(
            reg.device_names(),
            vec!["ex.com/c=only1", "ex.com/v=a", "ex.com/v=b"]
        );
        assert_eq!(reg.resolve(&["ex.com/v=a"]).unwrap().env, vec!["FROM=run"]);
        assert_eq!(reg.resolve(&["ex.com/v=b"]).unwrap().env, vec!["FROM=etc"]);
        assert!(reg.errors()[&p1][0]
            .to_string()
            .contains("conflicting device \"ex.com/c=x\""));
        assert!(reg.errors()[&p2][0]
            .to_string()
            .contains("conflicting device \"ex.com/c=x\""));
        assert!(reg.resolve(&["ex.com/c=x"]).is_err());
    }

    #[test]
    fn a_conflict_in_a_low_directory_is_not_healed_by_a_higher_one() {
        // Same as the reference cache: once marked conflicting, the name is dropped.
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc");
        let run = root.path().join("run");
        std::fs::create_dir(&etc).unwrap();
        std::fs::create_dir(&run).unwrap();
        write(
            &etc,
            "a.json",
            &spec_json("ex.com/c", &[("x", "C=1")], None),
        );
        write(
            &etc,
            "b.json",
            &spec_json("ex.com/c", &[("x", "C=2")], None),
        );
        write(
            &run,
            "c.json",
            &spec_json("ex.com/c", &[("x", "C=3")], None),
        );
        let reg = Registry::load(&[&etc, &run]);
        assert!(reg.device("ex.com/c=x").is_none());
    }

    #[test]
    fn refresh_sees_new_files() {
        let root = tempfile::tempdir().unwrap();
        let mut reg = Registry::load(&[root.path()]);
        assert!(reg.device_names().is_empty());
        write(
            root.path(),
            "n.json",
            &spec_json("ex.com/n", &[("a", "N=1")], None),
        );
        reg.refresh();
        assert_eq!(reg.device_names(), vec!["ex.com/n=a"]);
        assert_eq!(reg.spec_dirs(), &[root.path().to_path_buf()]);
    }

    #[test]
    fn resolution_order_and_spec_level_edits_once() {
        let root = tempfile::tempdir().unwrap();
        write(
            root.path(),
            "p.json",
            &spec_json("ex.com/p", &[("a", "PA=1"), ("b", "PB=1")], Some("P=spec")),
        );
        write(
            root.path(),
            "q.json",
            &spec_json("ex.com/q", &[("a", "QA=1")], Some("Q=spec")),
        );
        let reg = Registry::load(&[root.path()]);
        let edits = reg
            .resolve(&["ex.com/q=a", "ex.com/p=b", "ex.com/p=a"])
            .unwrap();
        assert_eq!(edits.env, vec!["Q=spec", "QA=1", "P=spec", "PB=1", "PA=1"]);
        let err = reg
            .resolve(&["ex.com/x=1", "ex.com/p=a", "nope"])
            .unwrap_err();
        assert_eq!(err.unresolved, vec!["ex.com/x=1", "nope"]);
        assert_eq!(err.to_string(), "unresolvable CDI devices ex.com/x=1, nope");
        assert_eq!(reg.resolve::<&str>(&[]).unwrap(), ContainerEdits::default());
    }

    #[test]
    fn inject_is_all_or_nothing() {
        let root = tempfile::tempdir().unwrap();
        write(
            root.path(),
            "i.json",
            r#"{"cdiVersion":"0.3.0","kind":"ex.com/i","devices":[
                {"name":"ok","containerEdits":{"env":["OK=1"],"deviceNodes":[{"path":"/dev/null"}]}},
                {"name":"broken","containerEdits":{"env":["BROKEN=1"],"deviceNodes":[{"path":"/dev/does-not-exist-gpushare"}]}}]}"#,
        );
        let reg = Registry::load(&[root.path()]);
        let mut config = json!({"process": {"env": ["PATH=/bin"]}});
        reg.inject(&mut config, &["ex.com/i=ok"]).unwrap();
        assert_eq!(config["process"]["env"], json!(["PATH=/bin", "OK=1"]));
        assert_eq!(config["linux"]["devices"][0]["major"], 1);
        let before = config.clone();
        let err = reg.inject(&mut config, &["ex.com/i=broken"]).unwrap_err();
        assert!(
            matches!(err, InjectError::Apply(ApplyError::Stat { .. })),
            "{err}"
        );
        assert_eq!(config, before);
        let err = reg.inject(&mut config, &["ex.com/i=gone"]).unwrap_err();
        assert_eq!(err.to_string(), "unresolvable CDI devices ex.com/i=gone");
        assert_eq!(config, before);
    }

    #[test]
    fn unreadable_directory_is_an_error_for_that_directory() {
        let root = tempfile::tempdir().unwrap();
        let file = write(root.path(), "plain", "x");
        let mut reg = Registry::load(&[&file]);
        assert!(matches!(reg.errors()[&file][0], RegistryError::Dir { .. }));
        // Taken out whole, leaving none.
        let taken = reg.take_errors();
        assert!(matches!(taken[&file][0], RegistryError::Dir { .. }));
        assert!(reg.errors().is_empty());
    }

    #[test]
    fn load_files_reads_just_those_files_at_one_priority() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path();
        let a = write(d, "a.json", &spec_json("ex.com/a", &[("x", "A=1")], None));
        let b = write(d, "b.json", &spec_json("ex.com/b", &[("y", "B=1")], None));
        write(d, "c.json", &spec_json("ex.com/c", &[("z", "C=1")], None));
        let twin = write(
            d,
            "twin.json",
            &spec_json("ex.com/a", &[("x", "A=2")], None),
        );
        let reg = Registry::load_files(&[&a, &b]);
        assert_eq!(reg.device_names(), vec!["ex.com/a=x", "ex.com/b=y"]);
        assert!(reg.errors().is_empty());
        // Two of them defining one device conflict as in one directory.
        let reg = Registry::load_files(&[&a, &twin]);
        assert!(reg.device_names().is_empty());
        assert_eq!(reg.errors().len(), 2);
        let missing = d.join("missing.json");
        let reg = Registry::load_files(&[&missing]);
        assert!(matches!(
            reg.errors()[&missing][0],
            RegistryError::Load { .. }
        ));
    }

    /// What gpushare relies on when a container gets a driver device (NVIDIA's toolkit spec)
    /// and then a claim device naming the same container paths: edits are merged in request
    /// order, a later mount at a destination replaces the earlier one, a later env key
    /// replaces the earlier value, and a device node named by both ends up once.
    #[test]
    fn the_later_device_wins_where_two_specs_name_one_container_path() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path();
        let driver = write(
            d,
            "driver.json",
            r#"{"cdiVersion":"0.5.0","kind":"ex.com/gpu",
                "containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void","CUDA_MPS_PIPE_DIRECTORY=/host-mps"],
                  "deviceNodes":[{"path":"/dev/null"}],
                  "mounts":[{"hostPath":"/host/tmp/nvidia-mps","containerPath":"/tmp/nvidia-mps","options":["rbind"]},
                            {"hostPath":"/host/lib/libcuda.so.1","containerPath":"/usr/lib64/libcuda.so.1","options":["ro","rbind"]}]},
                "devices":[{"name":"GPU-1","containerEdits":{"deviceNodes":[{"path":"/dev/zero"}]}}]}"#,
        );
        let claim = write(
            d,
            "claim.json",
            r#"{"cdiVersion":"0.5.0","kind":"ex.com/claim",
                "devices":[{"name":"c","containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void","CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],
                  "deviceNodes":[{"path":"/dev/zero"},{"path":"/dev/null"}],
                  "mounts":[{"hostPath":"/claim/pipe","containerPath":"/tmp/nvidia-mps","type":"bind","options":["rbind"]}]}}]}"#,
        );
        let reg = Registry::load_files(&[&driver, &claim]);
        let base =
            json!({"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]}, "mounts": []});

        let mut config = base.clone();
        reg.inject(&mut config, &["ex.com/gpu=GPU-1", "ex.com/claim=c"])
            .unwrap();
        let mounts = config["mounts"].as_array().unwrap();
        let at = |dest: &str| -> Vec<String> {
            mounts
                .iter()
                .filter(|m| m["destination"] == dest)
                .map(|m| m["source"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(at("/tmp/nvidia-mps"), vec!["/claim/pipe"]);
        assert_eq!(
            at("/usr/lib64/libcuda.so.1"),
            vec!["/host/lib/libcuda.so.1"]
        );
        let env: Vec<&str> = config["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert_eq!(
            env,
            vec![
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=void",
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
            ]
        );
        let devices = config["linux"]["devices"].as_array().unwrap();
        let paths: Vec<&str> = devices
            .iter()
            .map(|d| d["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            vec!["/dev/zero", "/dev/null"],
            "each node once, as last named"
        );
        // The cgroup allows the same node twice: a repeated grant of the same access.
        let rules = config["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules.len(), 4);

        // The order is what decides: the claim device first lets the driver's mount win.
        let mut reversed = base;
        reg.inject(&mut reversed, &["ex.com/claim=c", "ex.com/gpu=GPU-1"])
            .unwrap();
        let sources: Vec<&str> = reversed["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["destination"] == "/tmp/nvidia-mps")
            .map(|m| m["source"].as_str().unwrap())
            .collect();
        assert_eq!(sources, vec!["/host/tmp/nvidia-mps"]);
    }
}
