//! ControllerPublishVolume / ControllerUnpublishVolume with `--enable-attach`, and the volume
//! ID format that makes them work from a controller-only instance.
//!
//! Nothing is attached: a hostpath volume is a directory or an image on one node, and the only
//! thing publishing can check is that the node asked for is that node. One csi-attacher serves
//! every VolumeAttachment of a driver, so it talks to one instance, while each node's volumes
//! are known only to that node's instance (its own state dir). The volume ID therefore names
//! its node: `<node-id>_<uuid>`. Any instance can then check the node without the node's
//! state; an instance that has the volume in its state also checks that it exists and that the
//! capability fits. An instance cannot tell whether another node's volume still exists: it
//! trusts the ID, and the node's NodeStage/NodePublish answer NOT_FOUND if it does not.

use csi_spec::v1::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};

use crate::driver::Driver;
use crate::validate::{self, non_empty};
use crate::{Error, Result};

/// Node IDs longer than this are not put in volume IDs (CSI allows 128 bytes per ID; a UUID
/// and the separator take 37).
const MAX_NODE_IN_ID: usize = 64;

/// The separator between node and UUID: node names (DNS subdomains) never contain it.
const SEPARATOR: char = '_';

/// A new volume's ID: `<node-id>_<uuid>`, or the bare UUID when the node ID cannot be part of a
/// directory name (or is too long for the ID); such volumes are published only through their
/// own node's instance.
pub(crate) fn new_volume_id(node_id: &str) -> String {
    let uuid = uuid::Uuid::new_v4().to_string();
    if node_fits_in_id(node_id) {
        format!("{node_id}{SEPARATOR}{uuid}")
    } else {
        uuid
    }
}

fn node_fits_in_id(node_id: &str) -> bool {
    !node_id.is_empty()
        && node_id.len() <= MAX_NODE_IN_ID
        && node_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && node_id != "."
        && node_id != ".."
}

/// The node a volume ID names, if it is of the `<node-id>_<uuid>` form.
pub(crate) fn node_of(volume_id: &str) -> Option<&str> {
    let (node, uuid) = volume_id.rsplit_once(SEPARATOR)?;
    (node_fits_in_id(node) && uuid::Uuid::try_parse(uuid).is_ok()).then_some(node)
}

/// Checks a ControllerPublishVolume; there is nothing to do beyond the checks, so a repeated
/// call answers the same.
#[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, node_id = %req.node_id))]
pub(crate) async fn publish(d: &Driver, req: &ControllerPublishVolumeRequest) -> Result<()> {
    non_empty("volume_id", &req.volume_id)?;
    non_empty("node_id", &req.node_id)?;
    let access = validate::capability("volume_capability", req.volume_capability.as_ref())?;
    let home = match d.volume(&req.volume_id).await {
        Some(v) => {
            validate::fits_volume(&v, access)?;
            d.config.node_id.clone()
        }
        // Another node's volume (this instance is controller-only, or that node's neighbour):
        // its existence is that node's to check.
        None => match node_of(&req.volume_id) {
            Some(node) if node != d.config.node_id => node.to_string(),
            _ => return Err(Error::volume_not_found(&req.volume_id)),
        },
    };
    if req.node_id != home {
        // CSI: "Node does not exist" is NOT_FOUND. For this volume only its own node exists;
        // the Go hostpath driver answers the same for a node that is not its own.
        return Err(Error::NodeNotFound {
            node: req.node_id.clone(),
            volume: req.volume_id.clone(),
            home,
        });
    }
    tracing::info!("published (nothing to attach: the volume is on this node)");
    Ok(())
}

/// Checks a ControllerUnpublishVolume. Nothing was attached, so every volume is unpublished
/// from every node already: unknown volumes and nodes succeed too, as the spec asks.
#[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, node_id = %req.node_id))]
pub(crate) fn unpublish(req: &ControllerUnpublishVolumeRequest) -> Result<()> {
    non_empty("volume_id", &req.volume_id)?;
    tracing::info!("unpublished");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn volume_ids_name_their_node() {
        let id = new_volume_id("node-1");
        assert!(id.starts_with("node-1_"), "{id}");
        assert_eq!(node_of(&id), Some("node-1"));
        let id = new_volume_id("ip-10-0-0-1.ec2.internal");
        assert_eq!(node_of(&id), Some("ip-10-0-0-1.ec2.internal"));
    }

    #[test]
    fn node_ids_that_cannot_be_in_a_path_give_bare_uuids() {
        for node in ["a/b", "..", "node_1", "", &"n".repeat(65)] {
            let id = new_volume_id(node);
            assert!(uuid::Uuid::try_parse(&id).is_ok(), "{node:?}: {id}");
            assert_eq!(node_of(&id), None);
        }
    }

    #[test]
    fn ids_of_other_forms_name_no_node() {
        for id in [
            "5c0b1f9e-0000-4000-8000-000000000000",
            "node-1_not-a-uuid",
            "_5c0b1f9e-0000-4000-8000-000000000000",
            "csi-0123abcd",
            "a/b_5c0b1f9e-0000-4000-8000-000000000000",
        ] {
            assert_eq!(node_of(id), None, "{id}");
        }
    }
}
