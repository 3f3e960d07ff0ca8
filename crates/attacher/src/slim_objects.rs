//! What the attacher keeps of the objects it watches: the fields it reads, not whole objects.
//!
//! The caches hold every VolumeAttachment and PV of the cluster. As k8s-openapi types each is
//! large even when nearly empty: `PersistentVolumeSpec` carries ~30 volume sources inline, and
//! a `VolumeAttachment` carries one inline for `spec.source.inlineVolumeSpec`; real API servers
//! add `metadata.managedFields` to every object. [`Va`] and [`Pv`] are decoded from the same
//! JSON (a whole object is built once per event and projected at once) and keep only what the
//! controller reads; both implement `kube::Resource`, so the reflectors, the watches and the
//! PATCH answers use them directly (the attacher's memory target, docs/benchmarks.md: peak RSS at
//! 1,000 VolumeAttachments).
//!
//! What is kept:
//! - metadata without `managedFields`, labels, owner references and annotations (a
//!   VolumeAttachment's node-ID annotation becomes a field; an in-tree PV keeps its labels and
//!   annotations, which the translation and the rollback check read);
//! - VolumeAttachment: spec (the inline volume spec boxed, it is rare) and status;
//! - PV: `spec.csi`, access modes, mount options and volume mode; a PV without `spec.csi` (an
//!   in-tree PV, perhaps migrated to us) keeps its whole spec for the translation library.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use crate::names::NODE_ID_ANNOTATION;

/// Annotation `kubectl apply` writes: a copy of the whole object, never read here.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no controller decision depends on: `managedFields` and `kubectl apply`'s copy
/// (large on real clusters), labels (a map per object; only an in-tree PV's topology labels
/// matter, to the translation library, and [`Pv`] keeps those), owner references, the
/// generate-name, self-link and creation time.
fn slim_meta(mut meta: ObjectMeta) -> ObjectMeta {
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.generate_name = None;
    meta.self_link = None;
    meta.creation_timestamp = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
    meta
}

/// A VolumeAttachment as the attacher caches it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Va {
    /// Without annotations: the one the attacher reads is [`Va::node_id`].
    pub metadata: ObjectMeta,
    /// The `csi.alpha.kubernetes.io/node-id` annotation (a map per object costs more than
    /// the value).
    pub node_id: Option<String>,
    pub spec: VaSpec,
    pub status: Option<VolumeAttachmentStatus>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct VaSpec {
    pub attacher: String,
    pub node_name: String,
    pub source: VaSource,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct VaSource {
    pub persistent_volume_name: Option<String>,
    /// Boxed: almost every VolumeAttachment has none, and inline it would make each one as
    /// large as a whole PV spec.
    pub inline_volume_spec: Option<Box<PersistentVolumeSpec>>,
}

impl From<VolumeAttachment> for Va {
    fn from(va: VolumeAttachment) -> Self {
        let mut metadata = slim_meta(va.metadata);
        let node_id = metadata
            .annotations
            .take()
            .and_then(|mut a| a.remove(NODE_ID_ANNOTATION));
        Self {
            metadata,
            node_id,
            spec: VaSpec {
                attacher: va.spec.attacher,
                node_name: va.spec.node_name,
                source: VaSource {
                    persistent_volume_name: va.spec.source.persistent_volume_name,
                    inline_volume_spec: va.spec.source.inline_volume_spec.map(Box::new),
                },
            },
            status: va.status,
        }
    }
}

impl<'de> Deserialize<'de> for Va {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        VolumeAttachment::deserialize(d).map(Self::from)
    }
}

/// A PersistentVolume as the attacher caches it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Pv {
    pub metadata: ObjectMeta,
    pub spec: PvSpec,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum PvSpec {
    /// A CSI PV: the fields the capability and the publish call are built from.
    Csi {
        csi: Box<CSIPersistentVolumeSource>,
        access_modes: Option<Vec<String>>,
        mount_options: Option<Vec<String>>,
        volume_mode: Option<String>,
    },
    /// No `spec.csi`: the whole spec, for the in-tree → CSI translation.
    InTree(Box<PersistentVolumeSpec>),
    /// No spec at all.
    #[default]
    None,
}

impl From<PersistentVolume> for Pv {
    fn from(mut pv: PersistentVolume) -> Self {
        let spec = match pv.spec {
            Some(PersistentVolumeSpec {
                csi: Some(csi),
                access_modes,
                mount_options,
                volume_mode,
                ..
            }) => PvSpec::Csi {
                csi: Box::new(csi),
                access_modes,
                mount_options,
                volume_mode,
            },
            Some(spec) => PvSpec::InTree(Box::new(spec)),
            None => PvSpec::None,
        };
        let labels = pv.metadata.labels.take();
        let mut metadata = slim_meta(pv.metadata);
        if matches!(spec, PvSpec::InTree(_)) {
            // Zone and region labels become the CSI PV's topology in the translation.
            metadata.labels = labels;
        } else {
            // Only an in-tree PV's annotations are read (pv.kubernetes.io/migrated-to).
            metadata.annotations = None;
        }
        Self { metadata, spec }
    }
}

impl<'de> Deserialize<'de> for Pv {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PersistentVolume::deserialize(d).map(Self::from)
    }
}

impl Pv {
    /// The PV as a k8s-openapi object with every field kept here (for translation and the
    /// capability; built only on the attach path).
    pub(crate) fn to_full(&self) -> PersistentVolume {
        let spec = match &self.spec {
            PvSpec::Csi {
                csi,
                access_modes,
                mount_options,
                volume_mode,
            } => Some(PersistentVolumeSpec {
                csi: Some(csi.as_ref().clone()),
                access_modes: access_modes.clone(),
                mount_options: mount_options.clone(),
                volume_mode: volume_mode.clone(),
                ..Default::default()
            }),
            PvSpec::InTree(spec) => Some(spec.as_ref().clone()),
            PvSpec::None => None,
        };
        PersistentVolume {
            metadata: self.metadata.clone(),
            spec,
            status: None,
        }
    }

    /// See [`crate::migration::rolled_back`]; a CSI PV never is.
    pub(crate) fn rolled_back(&self, driver: &str) -> bool {
        matches!(self.spec, PvSpec::InTree(_))
            && crate::migration::rolled_back(&self.to_full(), driver)
    }
}

/// A CSINode as the attacher caches it: name and the node IDs per driver.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CsiNode {
    pub metadata: ObjectMeta,
    /// `(driver name, node ID)` of each `spec.drivers` entry.
    pub drivers: Vec<(String, String)>,
}

impl CsiNode {
    /// The node ID `driver` registered on this node.
    pub(crate) fn node_id(&self, driver: &str) -> Option<&str> {
        self.drivers
            .iter()
            .find(|(name, _)| name == driver)
            .map(|(_, id)| id.as_str())
    }
}

impl<'de> Deserialize<'de> for CsiNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let node = k8s_openapi::api::storage::v1::CSINode::deserialize(d)?;
        Ok(Self {
            metadata: slim_meta(node.metadata),
            drivers: node
                .spec
                .drivers
                .into_iter()
                .map(|d| (d.name, d.node_id))
                .collect(),
        })
    }
}

/// `kube::Resource` for a cluster-scoped slim type, so `Api`, the watcher and the reflector
/// store take it like the k8s-openapi type it stands for.
macro_rules! cluster_resource {
    ($ty:ty, $kind:literal, $group:literal, $api_version:literal, $plural:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = k8s_openapi::ClusterResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($group)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("v1")
            }
            fn api_version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($api_version)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

cluster_resource!(
    Va,
    "VolumeAttachment",
    "storage.k8s.io",
    "storage.k8s.io/v1",
    "volumeattachments"
);
cluster_resource!(Pv, "PersistentVolume", "", "v1", "persistentvolumes");
cluster_resource!(
    CsiNode,
    "CSINode",
    "storage.k8s.io",
    "storage.k8s.io/v1",
    "csinodes"
);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_volume_attachment_keeps_what_the_controller_reads() {
        let va: Va = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment",
            "metadata": {
                "name": "va-1", "uid": "u", "resourceVersion": "7",
                "finalizers": ["external-attacher/x"],
                "annotations": {"csi.alpha.kubernetes.io/node-id": "n-1", (LAST_APPLIED): "{...}"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            },
            "spec": {"attacher": "x", "nodeName": "node-1", "source": {"persistentVolumeName": "pv-1"}},
            "status": {"attached": true, "attachmentMetadata": {"k": "v"}},
        }))
        .unwrap();
        assert_eq!(va.metadata.name.as_deref(), Some("va-1"));
        assert_eq!(va.metadata.managed_fields, None);
        assert_eq!(va.metadata.annotations, None);
        assert_eq!(va.node_id.as_deref(), Some("n-1"));
        assert_eq!(va.spec.node_name, "node-1");
        assert_eq!(
            va.spec.source.persistent_volume_name.as_deref(),
            Some("pv-1")
        );
        assert!(va.spec.source.inline_volume_spec.is_none());
        assert!(va.status.unwrap().attached);
    }

    #[test]
    fn a_csi_pv_keeps_its_csi_source_and_capability_fields() {
        let pv: Pv = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1", "labels": {"a": "b"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"], "mountOptions": ["ro"], "volumeMode": "Block",
                "capacity": {"storage": "1Gi"},
                "claimRef": {"name": "c", "namespace": "default"},
                "csi": {"driver": "x", "volumeHandle": "vol-1", "fsType": "ext4"},
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap();
        let full = pv.to_full();
        let spec = full.spec.unwrap();
        assert_eq!(spec.csi.unwrap().volume_handle, "vol-1");
        assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce"]);
        assert_eq!(spec.mount_options.unwrap(), ["ro"]);
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert!(
            spec.claim_ref.is_none() && spec.capacity.is_none(),
            "not kept"
        );
        assert!(!pv.rolled_back("x"));
    }

    #[test]
    fn an_in_tree_pv_keeps_its_whole_spec() {
        let pv: Pv = serde_json::from_value(json!({
            "metadata": {"name": "pv-ebs", "labels": {"topology.kubernetes.io/zone": "z1"}},
            "spec": {"awsElasticBlockStore": {"volumeID": "vol-1"}, "accessModes": ["ReadWriteOnce"]},
        }))
        .unwrap();
        assert!(matches!(pv.spec, PvSpec::InTree(_)));
        let full = pv.to_full();
        assert_eq!(
            full.spec
                .unwrap()
                .aws_elastic_block_store
                .unwrap()
                .volume_id,
            "vol-1"
        );
        // No pv.kubernetes.io/migrated-to annotation: the in-tree plugin owns it.
        assert!(pv.rolled_back("ebs.csi.aws.com"));
    }

    #[test]
    fn a_csinode_keeps_the_node_ids() {
        let node: CsiNode = serde_json::from_value(json!({
            "metadata": {"name": "node-1"},
            "spec": {"drivers": [
                {"name": "a", "nodeID": "id-a", "topologyKeys": ["zone"]},
                {"name": "b", "nodeID": "id-b"},
            ]},
        }))
        .unwrap();
        assert_eq!(node.node_id("b"), Some("id-b"));
        assert_eq!(node.node_id("c"), None);
    }

    #[test]
    fn cached_objects_are_smaller_than_k8s_openapi_ones() {
        // What one cache entry costs before its strings: the reason for this module.
        assert!(std::mem::size_of::<Va>() * 4 < std::mem::size_of::<VolumeAttachment>());
        assert!(std::mem::size_of::<Pv>() * 4 < std::mem::size_of::<PersistentVolume>());
    }
}
