//! Capacity and usage of a published volume: statvfs for a filesystem, the device size (from
//! sysfs, no tool needed) for a raw block volume.

use std::path::Path;

use crate::{Error, Result};

/// Totals of one resource (bytes or inodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub total: u64,
    pub used: u64,
    pub available: u64,
}

/// What a CSI NodeGetVolumeStats reports for a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeStats {
    Filesystem {
        bytes: Usage,
        inodes: Usage,
    },
    /// A raw block volume: only its size is known.
    Block {
        size_bytes: u64,
    },
}

/// Bytes and inodes of the filesystem mounted at `path` (statvfs; "available" is what an
/// unprivileged writer can use, as `df` reports it). The caller checks that `path` is a mount
/// point: statvfs of a plain directory reports its parent filesystem.
pub fn filesystem(path: &Path) -> Result<VolumeStats> {
    let st = rustix::fs::statvfs(path).map_err(|e| Error::io("statvfs", path, e.into()))?;
    let frsize = if st.f_frsize > 0 {
        st.f_frsize
    } else {
        st.f_bsize
    };
    let bytes = Usage {
        total: st.f_blocks.saturating_mul(frsize),
        used: st
            .f_blocks
            .saturating_sub(st.f_bfree)
            .saturating_mul(frsize),
        available: st.f_bavail.saturating_mul(frsize),
    };
    let inodes = Usage {
        total: st.f_files,
        used: st.f_files.saturating_sub(st.f_ffree),
        available: st.f_favail,
    };
    Ok(VolumeStats::Filesystem { bytes, inodes })
}

/// The size of block device `dev` in bytes: `/sys/dev/block/MAJ:MIN/size` counts 512-byte
/// sectors whatever the device's own sector size.
pub fn block_device_size(sys_root: &Path, dev: (u32, u32)) -> Result<u64> {
    let file = sys_root.join(format!("dev/block/{}:{}/size", dev.0, dev.1));
    let text = std::fs::read_to_string(&file).map_err(|e| Error::io("read", &file, e))?;
    let sectors: u64 = text.trim().parse().map_err(|_| Error::Sysfs {
        file: file.clone(),
        text: text.clone(),
        expected: "a sector count",
    })?;
    Ok(sectors.saturating_mul(512))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_of_a_real_directory_is_consistent() {
        let dir = tempfile::tempdir().unwrap();
        let VolumeStats::Filesystem { bytes, inodes } = filesystem(dir.path()).unwrap() else {
            panic!("expected filesystem stats");
        };
        assert!(bytes.total > 0);
        assert!(bytes.used <= bytes.total && bytes.available <= bytes.total);
        assert!(inodes.used <= inodes.total || inodes.total == 0);
    }

    #[test]
    fn missing_path_is_an_error_naming_it() {
        let err = filesystem(Path::new("/nonexistent/ebs-driver")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ebs-driver"), "{err}");
    }

    #[test]
    fn block_size_is_read_in_512_byte_sectors() {
        let sys = tempfile::tempdir().unwrap();
        let d = sys.path().join("dev/block/7:3");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("size"), "2097152\n").unwrap();
        assert_eq!(block_device_size(sys.path(), (7, 3)).unwrap(), 1 << 30);
        assert!(block_device_size(sys.path(), (7, 4)).is_err());
    }
}
