//! What Kubernetes' attach/detach controller and the kubelet's volume manager share about
//! volumes: whether a CSI volume is attached at all (seeds 000/001, skip attach), which backend
//! serves an in-tree volume on a node (seed 003's migration decision), the feature gates that
//! say which plugins a component has migrated, and the names Kubernetes gives volumes and
//! VolumeAttachments. `attach-detach` and `node-agent` both decide through this crate, so the
//! two can never disagree.

pub mod feature_gates;
pub mod migration;
pub mod names;
pub mod skip_attach;

pub use feature_gates::MigratedPlugins;
pub use migration::{Backend, NodeMigrationInfo, decide};
pub use skip_attach::{AttachPath, DriverAttach, SkipAttachMode, attach_path};

/// Errors of this crate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A `--feature-gates` value that Kubernetes would refuse too.
    #[error("--feature-gates: {0}")]
    FeatureGates(String),
}
