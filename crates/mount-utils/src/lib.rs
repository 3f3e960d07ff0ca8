//! Node-side filesystem plumbing shared by everything that mounts volumes on a node: the EBS
//! driver's node service, the in-tree aws-ebs plugin, the hostpath driver and the node agent.
//!
//! Each module but [`stage`] wraps one real tool or kernel interface and nothing else, so that
//! a caller can string them together into its own idempotent steps:
//!
//! - [`below`]: what is mounted or attached below a directory, for clean-ups;
//! - [`cmd`]: running a tool with its output captured (no prompts, C locale);
//! - [`blkid`]: what is on a device ([`blkid::Probe`]);
//! - [`format`](mod@format): mkfs, only ever on a device that is provably blank;
//! - [`fsck`]: checking a filesystem before it is mounted;
//! - [`fstype`]: the filesystem types supported ([`FsType`]);
//! - [`findmnt`]: the mount table from `/proc/self/mountinfo`, the source of truth for
//!   "is this already done?";
//! - [`mount`]: mount, bind mounts (read-only included) and unmounting stacked mounts;
//! - [`stats`]: capacity and usage of a filesystem or a block device;
//! - [`resize`]: growing a mounted filesystem online;
//! - [`stage`]: the sequence a node stage is made of (format if blank, else check; mount),
//!   shared by the EBS driver and the in-tree aws-ebs plugin.
//!
//! Everything is domain code: no gRPC types, no knowledge of where a device came from (finding
//! and verifying a cloud volume's device is the caller's job).

use std::path::PathBuf;

pub mod below;
pub mod blkid;
pub mod cmd;
pub mod findmnt;
pub mod format;
pub mod fsck;
pub mod fstype;
pub mod mount;
pub mod resize;
pub mod stage;
pub mod stats;

pub use fstype::FsType;
pub use stats::{Usage, VolumeStats};

/// What can go wrong on a node's filesystem side. Messages name the device, path or tool and
/// say what was expected, since they end up in front of an operator (a CSI status message, a
/// pod event).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem type this crate does not format, check or mount.
    #[error(
        "unsupported filesystem type {name:?} (supported: {supported})",
        name = .0,
        supported = fstype::supported_names()
    )]
    UnsupportedFsType(String),

    /// fsck found errors it could not correct: the filesystem must not be mounted.
    #[error(
        "filesystem check of {device} found errors it could not fix ({program} exit code {code}); refusing to mount. Output: {output}"
    )]
    FsckFailed {
        device: PathBuf,
        program: &'static str,
        code: i32,
        output: String,
    },

    /// The device is not blank, but holds nothing we can mount (a partition table, RAID member,
    /// a damaged filesystem...): formatting it could destroy data.
    #[error(
        "device {device} is not blank and holds no mountable filesystem ({details}); refusing to format it"
    )]
    UnsupportedContent { device: PathBuf, details: String },

    /// The device holds a filesystem blkid names, but not one of [`FsType`]'s: it is neither
    /// mounted nor formatted over.
    #[error(
        "device {device} holds a {found:?} filesystem, which is not supported (supported: {supported}); refusing to mount or format it",
        supported = fstype::supported_names()
    )]
    UnsupportedFilesystem { device: PathBuf, found: String },

    /// The device holds another filesystem than the one requested: it is never reformatted.
    #[error(
        "device {device} already holds a {found} filesystem, but {requested} was requested; refusing to reformat it"
    )]
    FsTypeMismatch {
        device: PathBuf,
        found: FsType,
        requested: FsType,
    },

    /// The device is blank but is to be mounted read-only: a read-only volume is never
    /// formatted (its owner said nothing may be written to it).
    #[error(
        "device {device} holds no filesystem and is to be mounted read-only: a read-only volume is never formatted"
    )]
    ReadOnlyBlank { device: PathBuf },

    /// An external tool ran and failed.
    #[error("{command} failed with {status}: {output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },

    /// An external tool could not be started at all.
    #[error("could not run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },

    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// /proc/self/mountinfo could not be read or understood.
    #[error("mountinfo: {0}")]
    MountInfo(String),

    /// A sysfs attribute did not hold what the kernel documents.
    #[error("{}: {text:?} is not {expected}", file.display())]
    Sysfs {
        file: PathBuf,
        text: String,
        expected: &'static str,
    },

    /// umount kept reporting success but the mount stayed (or kept coming back).
    #[error("{} is still mounted after {removed} successful umount calls", target.display())]
    StillMounted { target: PathBuf, removed: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
