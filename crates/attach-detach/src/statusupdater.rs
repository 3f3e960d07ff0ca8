//! `node.status.volumesAttached` (kube-controller-manager's node status updater): a JSON merge
//! patch on the `status` subresource, for nodes whose list changed since it was last written
//! (or since the node object was replaced), sorted by volume name.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::Error;
use crate::cache::ActualStateOfWorld;
use crate::context::Ctx;
use crate::populator::is_managed;

/// What the node's list holds: (name, devicePath).
pub(crate) type Reported = Vec<(String, String)>;

#[derive(Debug, Default)]
pub(crate) struct NodeStatusUpdater {
    /// node → (uid of the node object written, list written).
    written: HashMap<String, (String, Reported)>,
}

fn node_uid(node: &Node) -> String {
    node.metadata.uid.clone().unwrap_or_default()
}

/// The node's list as the object says.
fn listed(node: &Node) -> Reported {
    let mut list: Reported = node
        .status
        .as_ref()
        .and_then(|s| s.volumes_attached.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|v| (v.name, v.device_path))
        .collect();
    list.sort();
    list
}

/// The merge patch that sets the list (`null` removes the field, as an empty list is written).
pub(crate) fn patch_body(reported: &Reported) -> serde_json::Value {
    if reported.is_empty() {
        return json!({"status": {"volumesAttached": null}});
    }
    let list: Vec<serde_json::Value> = reported
        .iter()
        .map(|(name, device)| json!({"name": name, "devicePath": device}))
        .collect();
    json!({"status": {"volumesAttached": list}})
}

impl NodeStatusUpdater {
    /// Starts from what the managed nodes say now (after a restart nothing is rewritten
    /// needlessly).
    pub(crate) fn from_nodes(nodes: &[std::sync::Arc<Node>]) -> Self {
        let written = nodes
            .iter()
            .filter(|n| is_managed(n))
            .filter_map(|n| {
                let name = n.metadata.name.clone()?;
                Some((name, (node_uid(n), listed(n))))
            })
            .collect();
        Self { written }
    }

    /// Nodes whose list must be written: (name, list).
    pub(crate) fn changed(
        &mut self,
        ctx: &Ctx,
        asw: &ActualStateOfWorld,
    ) -> Vec<(String, Reported)> {
        let mut names = asw.nodes();
        names.extend(self.written.keys().cloned());
        let mut out = Vec::new();
        for name in names {
            let Some(node) = ctx.caches.nodes.get(&name) else {
                // Gone: nothing to write; a node of the same name starts afresh.
                self.written.remove(&name);
                continue;
            };
            let reported = asw.reported(&name);
            let uid = node_uid(&node);
            let same = self
                .written
                .get(&name)
                .is_some_and(|(u, list)| *u == uid && *list == reported);
            if !same {
                out.push((name, reported));
            }
        }
        out
    }

    /// The patch of one node's list, without remembering it (see [`Self::written`]): lets a
    /// pass patch several nodes at once.
    pub(crate) async fn patch(ctx: &Ctx, node: &str, reported: &Reported) -> Result<Node, Error> {
        let api: Api<Node> = Api::all(ctx.client.clone());
        ctx.metrics.api_write("patch", "nodes");
        let updated = api
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(&patch_body(reported)),
            )
            .await
            .map_err(|e| Error::kube(format!("patch node {node} status.volumesAttached"), e))?;
        tracing::debug!(
            node,
            volumes = reported.len(),
            "node status.volumesAttached written"
        );
        Ok(updated)
    }

    /// Remembers what a successful patch wrote.
    pub(crate) fn written(&mut self, node: &str, updated: &Node, reported: Reported) {
        self.written
            .insert(node.to_string(), (node_uid(updated), reported));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_sets_or_removes_the_list() {
        let body = patch_body(&vec![
            ("kubernetes.io/aws-ebs/vol-1".into(), "/dev/xvdba".into()),
            ("kubernetes.io/csi/d^h".into(), String::new()),
        ]);
        assert_eq!(
            body,
            json!({"status": {"volumesAttached": [
                {"name": "kubernetes.io/aws-ebs/vol-1", "devicePath": "/dev/xvdba"},
                {"name": "kubernetes.io/csi/d^h", "devicePath": ""}
            ]}})
        );
        assert_eq!(
            patch_body(&Vec::new()),
            json!({"status": {"volumesAttached": null}})
        );
    }
}
