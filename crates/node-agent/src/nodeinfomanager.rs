//! The CSINode object and the node's CSI labels (the kubelet's CSI `nodeinfomanager`).
//!
//! - At start ([`NodeInfoManager::init_csinode`]): the CSINode named after the node exists,
//!   is owned by the Node (so it goes when the Node goes) and carries the
//!   `storage.alpha.kubernetes.io/migrated-plugins` annotation that tells the attach/detach
//!   controller which in-tree plugins this node serves through CSI (the migration design,
//!   docs/design/migration.md).
//! - A driver registers ([`NodeInfoManager::install_driver`]): its topology segments become
//!   Node labels (a label already there with another value is refused, as the kubelet refuses
//!   it), its node ID goes into the Node's `csi.volume.kubernetes.io/nodeid` annotation (the
//!   kubelet still writes it; older attachers read it), and its entry (nodeID, topologyKeys,
//!   allocatable.count) replaces any entry of the same name in `CSINode.spec.drivers`.
//! - A driver goes away ([`NodeInfoManager::uninstall_driver`]): its CSINode entry and node ID
//!   annotation entry go; topology labels stay, as in the kubelet.
//!
//! Writes are JSON merge patches carrying the `resourceVersion` they were computed from, so a
//! concurrent writer makes them fail with 409 instead of being overwritten; a 409 re-reads the
//! object and tries again (the kubelet's backoff: 10 ms × 5 per step, 5 attempts).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};
use volume_plugins::MigratedPlugins;

use crate::Error;
use crate::drivers::RegisteredDriver;

/// The CSINode annotation naming the in-tree plugins this node serves through CSI.
pub const MIGRATED_PLUGINS_ANNOTATION: &str = "storage.alpha.kubernetes.io/migrated-plugins";

/// The Node annotation with a JSON map of driver name → the driver's node ID (the kubelet's).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// Attempts of one read-modify-write that keeps meeting 409 Conflict.
const CONFLICT_ATTEMPTS: u32 = 5;
/// The pause after the first 409; each later one is 5× longer (10, 50, 250, 1250 ms).
const FIRST_CONFLICT_PAUSE: Duration = Duration::from_millis(10);

/// Keeps the node's CSINode and CSI labels; cheap to clone (clones share one write lock).
#[derive(Clone)]
pub struct NodeInfoManager {
    client: kube::Client,
    node_name: String,
    migrated: MigratedPlugins,
    /// One read-modify-write at a time from this agent (the kubelet keeps a lock too): fewer
    /// 409s between two drivers registering at once.
    write_lock: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for NodeInfoManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeInfoManager")
            .field("node_name", &self.node_name)
            .field("migrated", &self.migrated)
            .finish_non_exhaustive()
    }
}

impl NodeInfoManager {
    pub fn new(client: kube::Client, node_name: &str, migrated: MigratedPlugins) -> Self {
        Self {
            client,
            node_name: node_name.to_owned(),
            migrated,
            write_lock: Arc::default(),
        }
    }

    /// The node (and CSINode) name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Creates the CSINode named after the node (owned by the Node, no drivers, the
    /// migrated-plugins annotation), or adopts an existing one: a wrong annotation is corrected
    /// and a missing (or stale: an older Node of the same name) owner reference is set. Called
    /// once at start, after the Node exists. Returns the CSINode as stored.
    pub async fn init_csinode(&self) -> Result<CSINode, Error> {
        let _guard = self.write_lock.lock().await;
        let csinode = with_conflict_retries(move || self.try_init_csinode()).await?;
        tracing::info!(
            node = %self.node_name,
            annotation = %self.migrated.annotation_value(),
            "CSINode initialized"
        );
        Ok(csinode)
    }

    /// Records a registered driver: topology labels and node ID annotation on the Node, then
    /// its entry in the CSINode (replacing an entry of the same name; the CSINode is created if
    /// it is missing). A topology label already on the Node with another value is an error
    /// naming both values and nothing is written.
    pub async fn install_driver(&self, driver: &RegisteredDriver) -> Result<(), Error> {
        if driver.node_id.is_empty() {
            return Err(Error::Registration(format!(
                "CSI driver {:?}: NodeGetInfo returned an empty node_id (required)",
                driver.name
            )));
        }
        let _guard = self.write_lock.lock().await;
        with_conflict_retries(move || self.try_update_node(driver)).await?;
        with_conflict_retries(move || self.try_install_in_csinode(driver)).await?;
        tracing::info!(
            node = %self.node_name,
            driver = %driver.name,
            node_id = %driver.node_id,
            topology = ?driver.topology,
            "CSI driver recorded on the Node and its CSINode"
        );
        Ok(())
    }

    /// Removes the driver's CSINode entry and its node ID annotation entry. Topology labels
    /// stay (the kubelet leaves them too). A missing CSINode or Node is nothing to do.
    pub async fn uninstall_driver(&self, driver_name: &str) -> Result<(), Error> {
        let _guard = self.write_lock.lock().await;
        with_conflict_retries(move || self.try_uninstall_from_csinode(driver_name)).await?;
        with_conflict_retries(move || self.try_remove_node_id(driver_name)).await?;
        tracing::info!(node = %self.node_name, driver = %driver_name, "CSI driver removed from the CSINode");
        Ok(())
    }

    fn csinodes(&self) -> Api<CSINode> {
        Api::all(self.client.clone())
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn get_node(&self) -> Result<Node, Error> {
        self.nodes().get(&self.node_name).await.map_err(|e| {
            Error::kube(
                format!(
                    "reading Node {} (its CSINode is owned by it, so the Node must exist first)",
                    self.node_name
                ),
                e,
            )
        })
    }

    async fn get_csinode(&self) -> Result<Option<CSINode>, Error> {
        self.csinodes()
            .get_opt(&self.node_name)
            .await
            .map_err(|e| Error::kube(format!("reading CSINode {}", self.node_name), e))
    }

    async fn try_init_csinode(&self) -> Result<CSINode, Error> {
        let Some(existing) = self.get_csinode().await? else {
            return self.create_csinode().await;
        };
        let node = self.get_node().await?;
        let mut metadata = Map::new();
        if let Some(value) = annotation_fix(&existing.metadata, &self.migrated) {
            metadata.insert(
                "annotations".into(),
                json!({ MIGRATED_PLUGINS_ANNOTATION: value }),
            );
        }
        let owner = node_owner_reference(&node, &self.node_name);
        if let Some(refs) = fixed_owner_references(
            existing
                .metadata
                .owner_references
                .as_deref()
                .unwrap_or_default(),
            &owner,
        ) {
            metadata.insert(
                "ownerReferences".into(),
                serde_json::to_value(refs).unwrap_or_default(),
            );
        }
        if metadata.is_empty() {
            return Ok(existing);
        }
        tracing::info!(
            node = %self.node_name,
            fixes = ?metadata.keys().collect::<Vec<_>>(),
            "adopting the existing CSINode"
        );
        metadata.insert(
            "resourceVersion".into(),
            json!(existing.metadata.resource_version),
        );
        self.patch_csinode(Value::Object(Map::from_iter([(
            "metadata".to_owned(),
            Value::Object(metadata),
        )])))
        .await
    }

    async fn create_csinode(&self) -> Result<CSINode, Error> {
        let node = self.get_node().await?;
        let csinode = CSINode {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                owner_references: Some(vec![node_owner_reference(&node, &self.node_name)]),
                annotations: Some(BTreeMap::from([(
                    MIGRATED_PLUGINS_ANNOTATION.to_owned(),
                    self.migrated.annotation_value(),
                )])),
                ..ObjectMeta::default()
            },
            spec: CSINodeSpec { drivers: vec![] },
        };
        let created = self
            .csinodes()
            .create(&PostParams::default(), &csinode)
            .await
            .map_err(|e| Error::kube(format!("creating CSINode {}", self.node_name), e))?;
        tracing::info!(node = %self.node_name, "created the CSINode");
        Ok(created)
    }

    async fn patch_csinode(&self, patch: Value) -> Result<CSINode, Error> {
        self.csinodes()
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| Error::kube(format!("patching CSINode {}", self.node_name), e))
    }

    async fn try_update_node(&self, driver: &RegisteredDriver) -> Result<(), Error> {
        let node = self.get_node().await?;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let new_labels = topology_labels(&driver.name, &self.node_name, &labels, &driver.topology)?;
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let mut ids = node_id_map(&self.node_name, &annotations)?;
        let ids_changed = ids.get(&driver.name) != Some(&driver.node_id);
        if new_labels.is_empty() && !ids_changed {
            return Ok(());
        }
        let mut metadata = Map::new();
        metadata.insert(
            "resourceVersion".into(),
            json!(node.metadata.resource_version),
        );
        if !new_labels.is_empty() {
            metadata.insert("labels".into(), json!(new_labels));
        }
        if ids_changed {
            ids.insert(driver.name.clone(), driver.node_id.clone());
            metadata.insert(
                "annotations".into(),
                json!({ NODE_ID_ANNOTATION: serde_json::to_string(&ids).unwrap_or_default() }),
            );
        }
        self.patch_node(json!({ "metadata": metadata })).await
    }

    async fn try_remove_node_id(&self, driver_name: &str) -> Result<(), Error> {
        let Some(node) = self
            .nodes()
            .get_opt(&self.node_name)
            .await
            .map_err(|e| Error::kube(format!("reading Node {}", self.node_name), e))?
        else {
            return Ok(());
        };
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let mut ids = node_id_map(&self.node_name, &annotations)?;
        if ids.remove(driver_name).is_none() {
            return Ok(());
        }
        let value = if ids.is_empty() {
            Value::Null
        } else {
            json!(serde_json::to_string(&ids).unwrap_or_default())
        };
        self.patch_node(json!({
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": { NODE_ID_ANNOTATION: value },
            }
        }))
        .await
    }

    async fn patch_node(&self, patch: Value) -> Result<(), Error> {
        self.nodes()
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| Error::kube(format!("patching Node {}", self.node_name), e))?;
        Ok(())
    }

    async fn try_install_in_csinode(&self, driver: &RegisteredDriver) -> Result<(), Error> {
        let csinode = match self.get_csinode().await? {
            Some(csinode) => csinode,
            None => self.create_csinode().await?,
        };
        let entry = driver_entry(driver);
        let drivers = with_driver(&csinode.spec.drivers, entry);
        let annotation = annotation_fix(&csinode.metadata, &self.migrated);
        if drivers.is_none() && annotation.is_none() {
            return Ok(());
        }
        let mut metadata = Map::new();
        metadata.insert(
            "resourceVersion".into(),
            json!(csinode.metadata.resource_version),
        );
        if let Some(value) = annotation {
            metadata.insert(
                "annotations".into(),
                json!({ MIGRATED_PLUGINS_ANNOTATION: value }),
            );
        }
        let drivers = drivers.unwrap_or_else(|| csinode.spec.drivers.clone());
        self.patch_csinode(json!({ "metadata": metadata, "spec": { "drivers": drivers } }))
            .await?;
        Ok(())
    }

    async fn try_uninstall_from_csinode(&self, driver_name: &str) -> Result<(), Error> {
        let Some(csinode) = self.get_csinode().await? else {
            return Ok(());
        };
        let before = csinode.spec.drivers.len();
        let drivers: Vec<&CSINodeDriver> = csinode
            .spec
            .drivers
            .iter()
            .filter(|d| d.name != driver_name)
            .collect();
        if drivers.len() == before {
            return Ok(());
        }
        self.patch_csinode(json!({
            "metadata": { "resourceVersion": csinode.metadata.resource_version },
            "spec": { "drivers": drivers },
        }))
        .await?;
        Ok(())
    }
}

/// Runs one read-modify-write until it does not meet 409 Conflict (a stale resourceVersion,
/// or a create that lost to another writer), at most [`CONFLICT_ATTEMPTS`] times.
async fn with_conflict_retries<T, F, Fut>(mut attempt: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut pause = FIRST_CONFLICT_PAUSE;
    for _ in 1..CONFLICT_ATTEMPTS {
        match attempt().await {
            Err(e) if is_conflict(&e) => {
                tracing::debug!(error = %e, "conflict; reading the object again");
                tokio::time::sleep(pause).await;
                pause *= 5;
            }
            other => return other,
        }
    }
    attempt().await
}

fn is_conflict(e: &Error) -> bool {
    matches!(e, Error::Kube { source: kube::Error::Api(status), .. } if status.code == 409)
}

/// The owner reference the kubelet puts on its CSINode: the Node (v1), by name and uid.
fn node_owner_reference(node: &Node, node_name: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: node
            .metadata
            .name
            .clone()
            .unwrap_or_else(|| node_name.to_owned()),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        ..OwnerReference::default()
    }
}

/// `None` when `existing` already names the Node (by uid); otherwise the references to write:
/// the others kept, a stale one to an older Node of the same name replaced by `owner`.
fn fixed_owner_references(
    existing: &[OwnerReference],
    owner: &OwnerReference,
) -> Option<Vec<OwnerReference>> {
    if existing
        .iter()
        .any(|r| r.kind == owner.kind && r.uid == owner.uid)
    {
        return None;
    }
    let mut refs: Vec<OwnerReference> = existing
        .iter()
        .filter(|r| !(r.kind == owner.kind && r.name == owner.name))
        .cloned()
        .collect();
    refs.push(owner.clone());
    Some(refs)
}

/// The migrated-plugins annotation value to write, or `None` when it already is exactly
/// [`MigratedPlugins::annotation_value`]. The value is written even when empty (the kubelet
/// then removes the annotation instead; readers treat both as "none migrated"), so a reader
/// that compares strings sees this agent's value.
fn annotation_fix(meta: &ObjectMeta, migrated: &MigratedPlugins) -> Option<String> {
    let want = migrated.annotation_value();
    let current = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIGRATED_PLUGINS_ANNOTATION));
    (current != Some(&want)).then_some(want)
}

/// The CSINode entry of a driver, as the kubelet writes it.
fn driver_entry(driver: &RegisteredDriver) -> CSINodeDriver {
    // BTreeMap keys come sorted, as the kubelet's sets.String.List() sorts them.
    let topology_keys: Vec<String> = driver.topology.keys().cloned().collect();
    let allocatable = driver
        .max_volumes_per_node
        .filter(|max| *max > 0)
        .map(|max| VolumeNodeResources {
            // The API field is int32; the kubelet truncates larger limits to its maximum too.
            count: Some(i32::try_from(max).unwrap_or(i32::MAX)),
        });
    CSINodeDriver {
        name: driver.name.clone(),
        node_id: driver.node_id.clone(),
        topology_keys: Some(topology_keys),
        allocatable,
    }
}

/// `existing` with `entry` in place of every entry of the same name (appended last), or `None`
/// when `existing` already holds exactly that one entry for the name.
fn with_driver(existing: &[CSINodeDriver], entry: CSINodeDriver) -> Option<Vec<CSINodeDriver>> {
    let same_name: Vec<&CSINodeDriver> = existing.iter().filter(|d| d.name == entry.name).collect();
    if let [current] = same_name.as_slice() {
        if same_entry(current, &entry) {
            return None;
        }
    }
    let mut drivers: Vec<CSINodeDriver> = existing
        .iter()
        .filter(|d| d.name != entry.name)
        .cloned()
        .collect();
    drivers.push(entry);
    Some(drivers)
}

/// Equal, counting an absent and an empty topologyKeys list as the same (the API may drop one).
fn same_entry(a: &CSINodeDriver, b: &CSINodeDriver) -> bool {
    let keys = |d: &CSINodeDriver| d.topology_keys.clone().unwrap_or_default();
    a.name == b.name
        && a.node_id == b.node_id
        && keys(a) == keys(b)
        && a.allocatable.as_ref().and_then(|r| r.count)
            == b.allocatable.as_ref().and_then(|r| r.count)
}

/// The labels to add for a driver's topology, or the kubelet's refusal when the Node already
/// has one of the keys with a different value.
fn topology_labels(
    driver: &str,
    node: &str,
    labels: &BTreeMap<String, String>,
    topology: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, Error> {
    let mut add = BTreeMap::new();
    for (key, value) in topology {
        match labels.get(key) {
            Some(current) if current == value => {}
            Some(current) => {
                return Err(Error::Registration(format!(
                    "CSI driver {driver:?}: detected topology value collision: the driver reports \
                     {key}={value} but Node {node} already has the label {key}={current}"
                )));
            }
            None => {
                add.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(add)
}

/// The Node's node ID annotation as a map (empty when absent); an unreadable value is an error,
/// as in the kubelet, rather than being overwritten.
fn node_id_map(
    node: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, Error> {
    match annotations.get(NODE_ID_ANNOTATION) {
        None => Ok(BTreeMap::new()),
        Some(raw) if raw.is_empty() => Ok(BTreeMap::new()),
        Some(raw) => serde_json::from_str(raw).map_err(|e| {
            Error::Registration(format!(
                "Node {node}: annotation {NODE_ID_ANNOTATION}={raw:?} is not a JSON map of driver \
                 name to node ID: {e}"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(
        name: &str,
        node_id: &str,
        topology: &[(&str, &str)],
        max: Option<i64>,
    ) -> RegisteredDriver {
        RegisteredDriver {
            name: name.into(),
            endpoint: "/tmp/none.sock".into(),
            node_id: node_id.into(),
            max_volumes_per_node: max,
            topology: topology
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            stage_unstage: true,
            volume_stats: false,
            single_node_multi_writer: false,
            channel: tonic::transport::Channel::from_static("http://[::1]:1").connect_lazy(),
        }
    }

    #[tokio::test]
    async fn the_entry_has_sorted_keys_and_a_positive_limit_only() {
        let d = driver(
            "a.csi",
            "n-1",
            &[("z/zone", "1"), ("a/region", "r")],
            Some(5),
        );
        let e = driver_entry(&d);
        assert_eq!(
            e.topology_keys,
            Some(vec!["a/region".into(), "z/zone".into()])
        );
        assert_eq!(e.allocatable.and_then(|a| a.count), Some(5));
        assert!(
            driver_entry(&driver("a.csi", "n", &[], Some(0)))
                .allocatable
                .is_none()
        );
        assert!(
            driver_entry(&driver("a.csi", "n", &[], None))
                .allocatable
                .is_none()
        );
        let huge = driver_entry(&driver("a.csi", "n", &[], Some(i64::MAX)));
        assert_eq!(huge.allocatable.and_then(|a| a.count), Some(i32::MAX));
    }

    #[tokio::test]
    async fn an_entry_replaces_its_name_and_keeps_the_others() {
        let other = driver_entry(&driver("b.csi", "x", &[], None));
        let old = driver_entry(&driver("a.csi", "old", &[], None));
        let new = driver_entry(&driver("a.csi", "new", &[], None));
        let out = with_driver(&[old.clone(), other.clone(), old.clone()], new.clone()).unwrap();
        assert_eq!(
            out,
            vec![other.clone(), new.clone()],
            "duplicates of the name go too"
        );
        assert_eq!(
            with_driver(&[other.clone(), new.clone()], new.clone()),
            None
        );
        let mut no_keys = new.clone();
        no_keys.topology_keys = None;
        assert_eq!(
            with_driver(&[no_keys], new),
            None,
            "absent keys = empty keys"
        );
    }

    #[test]
    fn owner_reference_is_added_or_replaces_a_stale_node() {
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "n1".into(),
            uid: "uid-2".into(),
            ..OwnerReference::default()
        };
        assert_eq!(
            fixed_owner_references(std::slice::from_ref(&owner), &owner),
            None
        );
        let stale = OwnerReference {
            uid: "uid-1".into(),
            ..owner.clone()
        };
        let other = OwnerReference {
            kind: "Something".into(),
            name: "s".into(),
            uid: "uid-9".into(),
            ..owner.clone()
        };
        assert_eq!(
            fixed_owner_references(&[stale, other.clone()], &owner),
            Some(vec![other, owner.clone()])
        );
        assert_eq!(fixed_owner_references(&[], &owner), Some(vec![owner]));
    }

    #[test]
    fn the_annotation_is_written_exactly() {
        let aws = MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap();
        let meta = |v: Option<&str>| ObjectMeta {
            annotations: v
                .map(|v| BTreeMap::from([(MIGRATED_PLUGINS_ANNOTATION.to_owned(), v.to_owned())])),
            ..ObjectMeta::default()
        };
        assert_eq!(
            annotation_fix(&meta(Some("kubernetes.io/aws-ebs")), &aws),
            None
        );
        assert_eq!(
            annotation_fix(&meta(Some("kubernetes.io/gce-pd")), &aws).as_deref(),
            Some("kubernetes.io/aws-ebs")
        );
        assert_eq!(
            annotation_fix(&meta(None), &aws).as_deref(),
            Some("kubernetes.io/aws-ebs")
        );
        assert_eq!(
            annotation_fix(&meta(None), &MigratedPlugins::none()).as_deref(),
            Some("")
        );
        assert_eq!(
            annotation_fix(&meta(Some("")), &MigratedPlugins::none()),
            None
        );
    }

    #[test]
    fn a_topology_label_with_another_value_is_refused_naming_both() {
        let labels = BTreeMap::from([
            ("zone".to_owned(), "a".to_owned()),
            ("kubernetes.io/hostname".to_owned(), "n1".to_owned()),
        ]);
        let same = BTreeMap::from([
            ("zone".to_owned(), "a".to_owned()),
            ("rack".to_owned(), "7".to_owned()),
        ]);
        assert_eq!(
            topology_labels("d", "n1", &labels, &same).unwrap(),
            BTreeMap::from([("rack".to_owned(), "7".to_owned())])
        );
        let clash = BTreeMap::from([("zone".to_owned(), "b".to_owned())]);
        let err = topology_labels("d", "n1", &labels, &clash)
            .unwrap_err()
            .to_string();
        assert!(err.contains("zone=b") && err.contains("zone=a"), "{err}");
    }

    #[test]
    fn node_id_annotation_is_a_json_map() {
        let ann = |v: &str| BTreeMap::from([(NODE_ID_ANNOTATION.to_owned(), v.to_owned())]);
        assert!(node_id_map("n", &BTreeMap::new()).unwrap().is_empty());
        assert_eq!(
            node_id_map("n", &ann(r#"{"a.csi":"i-1"}"#)).unwrap(),
            BTreeMap::from([("a.csi".to_owned(), "i-1".to_owned())])
        );
        let err = node_id_map("n", &ann("nope")).unwrap_err().to_string();
        assert!(err.contains(NODE_ID_ANNOTATION), "{err}");
    }
}
