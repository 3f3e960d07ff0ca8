//! The controller's two views of the world, as in kube-controller-manager's
//! `attachdetach/cache`: what should be attached where ([`desired_state_of_world`]) and what is
//! ([`actual_state_of_world`]). The reconciler moves the second towards the first.

pub mod actual_state_of_world;
pub mod desired_state_of_world;

pub use actual_state_of_world::{ActualStateOfWorld, Attachment, DetachHow};
pub use desired_state_of_world::{
    Backend, DesiredStateOfWorld, DesiredVolume, PodRef, VolumeToAttach,
};

/// A volume on a node: (unique volume name, node name).
pub type VolumeNode = (String, String);
