//! The volume manager's two caches, as the kubelet's: what should be mounted (from the pods
//! bound to this node) and what is (staged and published, learned from the operations and
//! rebuilt from disk after a restart).

pub mod actual_state_of_world;
pub mod desired_state_of_world;

pub use actual_state_of_world::{ActualStateOfWorld, MountedVolume, StagedVolume, VolumeHandle};
pub use desired_state_of_world::{DesiredStateOfWorld, PodToMount};
