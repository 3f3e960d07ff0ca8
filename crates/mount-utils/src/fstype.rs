//! The filesystem types this crate formats, checks and mounts. One list, so that what a driver
//! advertises, what it accepts in a request and what it can actually format never disagree.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// A supported filesystem type; parse one from a request's `fs_type` (any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsType {
    Ext2,
    Ext3,
    Ext4,
    Xfs,
}

impl FsType {
    /// Every supported type, in the order error messages list them.
    pub const ALL: [FsType; 4] = [FsType::Ext2, FsType::Ext3, FsType::Ext4, FsType::Xfs];

    /// The name mount, mkfs.NAME and blkid use.
    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext2 => "ext2",
            FsType::Ext3 => "ext3",
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }

    /// ext2/3/4 share their tools (e2fsck, resize2fs by device); xfs has its own.
    pub fn is_ext(self) -> bool {
        matches!(self, FsType::Ext2 | FsType::Ext3 | FsType::Ext4)
    }
}

/// The supported types' names, comma-separated, for messages.
pub fn supported_names() -> String {
    let names: Vec<&str> = FsType::ALL.iter().map(|f| f.as_str()).collect();
    names.join(", ")
}

impl fmt::Display for FsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FsType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "ext2" => Ok(FsType::Ext2),
            "ext3" => Ok(FsType::Ext3),
            "ext4" => Ok(FsType::Ext4),
            "xfs" => Ok(FsType::Xfs),
            _ => Err(Error::UnsupportedFsType(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_types_case_insensitively() {
        assert_eq!("ext4".parse::<FsType>().unwrap(), FsType::Ext4);
        assert_eq!("XFS".parse::<FsType>().unwrap(), FsType::Xfs);
        assert_eq!("ext3".parse::<FsType>().unwrap().to_string(), "ext3");
        assert!(FsType::Ext2.is_ext() && !FsType::Xfs.is_ext());
    }

    #[test]
    fn rejects_unknown_types_by_name() {
        let err = "btrfs".parse::<FsType>().unwrap_err();
        assert!(err.to_string().contains("\"btrfs\""), "{err}");
    }
}
