//! Device nodes on the host, as `lstat(2)` sees them: the leaf under the check that every node
//! a claim's CDI spec names exists before the claim is reported ready.

use std::io;
use std::path::Path;

/// What kind of file a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A character device node.
    Char,
    /// A block device node.
    Block,
    /// Anything else (a regular file, a directory, a symbolic link, a fifo, a socket).
    Other(&'static str),
}

/// A host path's kind and, for device nodes, its device number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStat {
    /// The file's kind.
    pub kind: NodeKind,
    /// Major device number (0 unless a device node).
    pub major: u64,
    /// Minor device number (0 unless a device node).
    pub minor: u64,
}

impl NodeStat {
    /// A character device `major:minor`.
    pub fn char_device(major: u64, minor: u64) -> NodeStat {
        NodeStat {
            kind: NodeKind::Char,
            major,
            minor,
        }
    }
}

/// Looks at device nodes. The production implementation is [`HostDeviceFiles`].
pub trait DeviceFiles: Send + Sync + std::fmt::Debug {
    /// `lstat`s `path` (a symbolic link is reported as such, never followed, as the CDI
    /// reference library does when it fills in a device node).
    ///
    /// # Errors
    /// The path does not exist (`NotFound`) or cannot be examined.
    fn stat(&self, path: &Path) -> io::Result<NodeStat>;
}

/// The host's device nodes, through `lstat(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostDeviceFiles;

impl DeviceFiles for HostDeviceFiles {
    fn stat(&self, path: &Path) -> io::Result<NodeStat> {
        use nix::sys::stat::{lstat, major, minor, SFlag};
        let st = lstat(path).map_err(io::Error::from)?;
        let fmt = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        let kind = if fmt == SFlag::S_IFCHR {
            NodeKind::Char
        } else if fmt == SFlag::S_IFBLK {
            NodeKind::Block
        } else if fmt == SFlag::S_IFREG {
            NodeKind::Other("a regular file")
        } else if fmt == SFlag::S_IFDIR {
            NodeKind::Other("a directory")
        } else if fmt == SFlag::S_IFLNK {
            NodeKind::Other("a symbolic link")
        } else if fmt == SFlag::S_IFIFO {
            NodeKind::Other("a fifo")
        } else {
            NodeKind::Other("a socket")
        };
        let (maj, min) = match kind {
            NodeKind::Char | NodeKind::Block => (major(st.st_rdev), minor(st.st_rdev)),
            NodeKind::Other(_) => (0, 0),
        };
        Ok(NodeStat {
            kind,
            major: maj,
            minor: min,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_device_nodes_from_other_files() {
        let null = HostDeviceFiles.stat(Path::new("/dev/null")).unwrap();
        assert_eq!(null, NodeStat::char_device(1, 3));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(
            HostDeviceFiles.stat(&file).unwrap().kind,
            NodeKind::Other("a regular file")
        );
        assert_eq!(
            HostDeviceFiles.stat(dir.path()).unwrap().kind,
            NodeKind::Other("a directory")
        );
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert_eq!(
            HostDeviceFiles.stat(&link).unwrap().kind,
            NodeKind::Other("a symbolic link")
        );
        let err = HostDeviceFiles
            .stat(&dir.path().join("missing"))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
