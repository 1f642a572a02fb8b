//! The device nodes a claim's containers get, checked before the claim is reported ready: each
//! must exist on the host, be a character device, and carry the device number the NVIDIA
//! driver gives it. A spec naming a node that is missing fails the container's start in the
//! runtime ("failed to stat CDI host device", NVIDIA/nvidia-container-toolkit#885,
//! kubernetes-sigs/dra-driver-nvidia-gpu#1458) long after prepare said the claim was fine.
//!
//! Device numbers, from the NVIDIA kernel modules: `/dev/nvidia<N>` is `195:<N>`,
//! `/dev/nvidiactl` `195:255`, `/dev/nvidia-modeset` `195:254`; `nvidia-uvm` and
//! `nvidia-caps` get a major at module load (listed in `/proc/devices`), `/dev/nvidia-uvm`
//! minor 0 and `/dev/nvidia-uvm-tools` minor 1, `/dev/nvidia-caps/nvidia-cap<M>` minor `M`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crate::sys::{DeviceFiles, NodeKind};

/// Major number of `/dev/nvidia<N>`, `/dev/nvidiactl` and `/dev/nvidia-modeset`.
pub const NVIDIA_MAJOR: u64 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u64 = 255;
/// Minor number of `/dev/nvidia-modeset`.
pub const NVIDIA_MODESET_MINOR: u64 = 254;

/// Character-device majors the driver's modules registered at load, by the name
/// `/proc/devices` lists them under (`nvidia-uvm`, `nvidia-caps`, …).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverMajors(BTreeMap<String, u64>);

impl DriverMajors {
    /// The `Character devices:` section of `/proc/devices` (`237 nvidia-caps`, one a line).
    pub fn parse_proc_devices(text: &str) -> DriverMajors {
        let mut map = BTreeMap::new();
        let mut in_char = false;
        for line in text.lines() {
            let line = line.trim();
            if line.ends_with(':') {
                in_char = line == "Character devices:";
                continue;
            }
            if !in_char {
                continue;
            }
            if let Some((num, name)) = line.split_once(char::is_whitespace) {
                if let Ok(major) = num.trim().parse::<u64>() {
                    map.insert(name.trim().to_string(), major);
                }
            }
        }
        DriverMajors(map)
    }

    /// These majors plus `name` at `major`.
    pub fn with(mut self, name: &str, major: u64) -> DriverMajors {
        self.0.insert(name.to_string(), major);
        self
    }

    /// The major registered under `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }
}

/// The device number a node at `path` (a container or host path: only its file name counts)
/// must have: `(major, minor)`, the major `None` where the module that owns it registered
/// none in `majors`. `None` for nodes that are not the NVIDIA driver's.
pub fn expected_number(path: &Path, majors: &DriverMajors) -> Option<(Option<u64>, u64)> {
    let name = path.file_name()?.to_str()?;
    let digits = |rest: &str| {
        (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
            .then(|| rest.parse::<u64>().ok())
            .flatten()
    };
    match name {
        "nvidiactl" => Some((Some(NVIDIA_MAJOR), NVIDIACTL_MINOR)),
        "nvidia-modeset" => Some((Some(NVIDIA_MAJOR), NVIDIA_MODESET_MINOR)),
        "nvidia-uvm" => Some((majors.get("nvidia-uvm"), 0)),
        "nvidia-uvm-tools" => Some((majors.get("nvidia-uvm"), 1)),
        _ => {
            if let Some(n) = name.strip_prefix("nvidia-cap").and_then(digits) {
                Some((majors.get("nvidia-caps"), n))
            } else {
                name.strip_prefix("nvidia")
                    .and_then(digits)
                    .map(|n| (Some(NVIDIA_MAJOR), n))
            }
        }
    }
}

/// A device node a spec names that a container could not get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeProblem {
    /// The node's path inside containers.
    pub path: String,
    /// The host path that was examined.
    pub host_path: String,
    /// What is wrong, e.g. `does not exist`.
    pub problem: String,
}

impl fmt::Display for NodeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path == self.host_path {
            write!(f, "device node {} {}", self.host_path, self.problem)
        } else {
            write!(
                f,
                "device node {} (for {} in containers) {}",
                self.host_path, self.path, self.problem
            )
        }
    }
}

/// Checks every node of `nodes` (CDI device nodes: `host_path`, or `path` when that is empty)
/// on the host through `files`: it exists, is a device node of the declared type (a character
/// device when none is declared and the name is the NVIDIA driver's), and has the declared
/// numbers or those [`expected_number`] gives. A node named twice is checked once.
///
/// # Errors
/// Every node that fails, in order.
pub fn check_device_nodes(
    nodes: &[gpushare_cdi::DeviceNode],
    files: &dyn DeviceFiles,
    majors: &DriverMajors,
) -> Result<(), Vec<NodeProblem>> {
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for node in nodes {
        let host = if node.host_path.is_empty() {
            node.path.as_str()
        } else {
            node.host_path.as_str()
        };
        if !seen.insert((node.path.as_str(), host)) {
            continue;
        }
        let problem = |problem: String| NodeProblem {
            path: node.path.clone(),
            host_path: host.to_string(),
            problem,
        };
        let st = match files.stat(Path::new(host)) {
            Ok(st) => st,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                problems.push(problem("does not exist".into()));
                continue;
            }
            Err(e) => {
                problems.push(problem(format!("cannot be examined: {e}")));
                continue;
            }
        };
        let expected = expected_number(Path::new(&node.path), majors);
        let want_block = node.device_type == "b";
        let ok_kind = match st.kind {
            NodeKind::Char => !want_block,
            NodeKind::Block => want_block || (node.device_type.is_empty() && expected.is_none()),
            NodeKind::Other(_) => false,
        };
        if !ok_kind {
            let is = match st.kind {
                NodeKind::Char => "a character device",
                NodeKind::Block => "a block device",
                NodeKind::Other(what) => what,
            };
            let want = if want_block {
                "a block device"
            } else {
                "a character device"
            };
            problems.push(problem(format!("is {is}, not {want}")));
            continue;
        }
        // Numbers the spec declares win; else the driver's, where known.
        let (major, minor) = if node.major > 0 {
            (
                u64::try_from(node.major).ok(),
                u64::try_from(node.minor).unwrap_or(0),
            )
        } else {
            match expected {
                Some(e) => e,
                None => continue,
            }
        };
        let major_ok = match major {
            Some(m) => m == st.major,
            None => true,
        };
        if !major_ok || st.minor != minor {
            let want = match major {
                Some(m) => format!("{m}:{minor}"),
                None => format!("minor {minor}"),
            };
            problems.push(problem(format!(
                "is device {}:{}, expected {want}",
                st.major, st.minor
            )));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::NodeStat;
    use std::io;
    use std::path::PathBuf;

    #[derive(Debug, Default)]
    struct Files(BTreeMap<PathBuf, NodeStat>);

    impl DeviceFiles for Files {
        fn stat(&self, path: &Path) -> io::Result<NodeStat> {
            self.0
                .get(path)
                .copied()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
    }

    fn node(path: &str, host: &str) -> gpushare_cdi::DeviceNode {
        gpushare_cdi::DeviceNode {
            path: path.into(),
            host_path: host.into(),
            ..Default::default()
        }
    }

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia-frontend\n237 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  8 sd\n259 blkext\n";

    #[test]
    fn reads_character_majors_only() {
        let m = DriverMajors::parse_proc_devices(PROC_DEVICES);
        assert_eq!(m.get("nvidia-uvm"), Some(510));
        assert_eq!(m.get("nvidia-caps"), Some(237));
        assert_eq!(m.get("sd"), None, "a block major");
    }

    #[test]
    fn expected_numbers_follow_the_driver() {
        let m = DriverMajors::parse_proc_devices(PROC_DEVICES);
        let e = |p: &str| expected_number(Path::new(p), &m);
        assert_eq!(e("/dev/nvidia3"), Some((Some(195), 3)));
        assert_eq!(e("/x/sim/nvidia12"), Some((Some(195), 12)));
        assert_eq!(e("/dev/nvidiactl"), Some((Some(195), 255)));
        assert_eq!(e("/dev/nvidia-modeset"), Some((Some(195), 254)));
        assert_eq!(e("/dev/nvidia-uvm"), Some((Some(510), 0)));
        assert_eq!(e("/dev/nvidia-uvm-tools"), Some((Some(510), 1)));
        assert_eq!(e("/dev/nvidia-caps/nvidia-cap21"), Some((Some(237), 21)));
        assert_eq!(e("/dev/dri/card1"), None);
        assert_eq!(e("/dev/nvidia-nvswitch0"), None);
        assert_eq!(e("/dev/nvidiax"), None);
        assert_eq!(
            expected_number(Path::new("/dev/nvidia-uvm"), &DriverMajors::default()),
            Some((None, 0)),
            "the module's major unknown: only the minor is checked"
        );
    }

    #[test]
    fn missing_wrong_kind_and_wrong_numbers_are_named() {
        let m = DriverMajors::default().with("nvidia-uvm", 510);
        let mut files = Files::default();
        files
            .0
            .insert("/h/nvidia0".into(), NodeStat::char_device(195, 0));
        files
            .0
            .insert("/h/nvidia1".into(), NodeStat::char_device(195, 7));
        files.0.insert(
            "/dev/nvidia-uvm".into(),
            NodeStat {
                kind: NodeKind::Other("a regular file"),
                major: 0,
                minor: 0,
            },
        );
        files
            .0
            .insert("/dev/nvidiactl".into(), NodeStat::char_device(195, 255));
        let nodes = vec![
            node("/dev/nvidia0", "/h/nvidia0"),
            node("/dev/nvidia0", "/h/nvidia0"),
            node("/dev/nvidia1", "/h/nvidia1"),
            node("/dev/nvidia2", "/h/nvidia2"),
            node("/dev/nvidia-uvm", ""),
            node("/dev/nvidiactl", ""),
        ];
        let problems = check_device_nodes(&nodes, &files, &m).unwrap_err();
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            vec![
                "device node /h/nvidia1 (for /dev/nvidia1 in containers) is device 195:7, expected 195:1",
                "device node /h/nvidia2 (for /dev/nvidia2 in containers) does not exist",
                "device node /dev/nvidia-uvm is a regular file, not a character device",
            ]
        );
        assert!(check_device_nodes(&nodes[..1], &files, &m).is_ok());
    }

    #[test]
    fn declared_numbers_and_types_win() {
        let mut files = Files::default();
        files.0.insert(
            "/dev/sda".into(),
            NodeStat {
                kind: NodeKind::Block,
                major: 8,
                minor: 0,
            },
        );
        files
            .0
            .insert("/dev/odd".into(), NodeStat::char_device(10, 200));
        let mut sda = node("/dev/sda", "");
        sda.device_type = "b".into();
        let mut odd = node("/dev/odd", "");
        odd.device_type = "c".into();
        odd.major = 10;
        odd.minor = 200;
        assert!(check_device_nodes(
            &[sda.clone(), odd.clone()],
            &files,
            &DriverMajors::default()
        )
        .is_ok());
        odd.minor = 201;
        sda.device_type = "c".into();
        let problems =
            check_device_nodes(&[sda, odd], &files, &DriverMajors::default()).unwrap_err();
        assert_eq!(
            problems[0].problem,
            "is a block device, not a character device"
        );
        assert_eq!(problems[1].problem, "is device 10:200, expected 10:201");
    }
}
