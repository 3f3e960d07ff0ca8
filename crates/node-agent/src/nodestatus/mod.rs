//! The Node object (the kubelet's node registration and node status): created or adopted at
//! start, with the `controller-managed-attach-detach` annotation that hands this node's
//! attach/detach to the attach/detach controller; its `Ready` condition, which stays False
//! until the CSINode's `migrated-plugins` annotation says what this agent's feature gates say
//! (the migration design, docs/design/migration.md: the attach/detach controller must not decide
//! with a stale annotation); and the node Lease heartbeat ([`lease`]).

pub mod lease;

use std::collections::BTreeMap;
use std::time::Duration;

use component_runtime::ObjectCache;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use volume_plugins::{MigratedPlugins, NodeMigrationInfo};

use crate::Error;
use crate::config::Options;

/// The annotation that hands the node's attach/detach to the attach/detach controller.
pub const CONTROLLER_MANAGED_ANNOTATION: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The labels every kubelet sets on its Node.
fn default_labels(node_name: &str) -> BTreeMap<String, String> {
    [
        ("kubernetes.io/hostname", node_name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", std::env::consts::ARCH),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", std::env::consts::ARCH),
    ]
    .into_iter()
    .map(|(k, v)| {
        // Go's GOARCH names.
        let v = match v {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        (k.to_string(), v.to_string())
    })
    .collect()
}

/// Creates the Node, or adopts an existing one: labels and the annotation are merged in, the
/// provider ID is set if the Node has none (it is immutable once set).
pub async fn register_node(client: &Client, options: &Options) -> Result<Node, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = &options.node_name;
    let mut labels = default_labels(name);
    labels.extend(options.node_labels.clone());
    let annotations: BTreeMap<String, String> = [(
        CONTROLLER_MANAGED_ANNOTATION.to_string(),
        "true".to_string(),
    )]
    .into();
    match nodes
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("get Node {name}"), e))?
    {
        None => {
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                spec: Some(NodeSpec {
                    provider_id: options.provider_id.clone(),
                    ..Default::default()
                }),
                status: None,
            };
            match nodes.create(&PostParams::default(), &node).await {
                Ok(n) => {
                    tracing::info!(node = %name, "registered the Node");
                    Ok(n)
                }
                // Created by someone else meanwhile: adopt it.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    Box::pin(register_node(client, options)).await
                }
                Err(e) => Err(Error::kube(format!("create Node {name}"), e)),
            }
        }
        Some(existing) => {
            let mut patch = json!({"metadata": {"labels": labels, "annotations": annotations}});
            let has_provider = existing
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| !p.is_empty());
            if let (Some(p), false) = (&options.provider_id, has_provider) {
                patch["spec"] = json!({"providerID": p});
            }
            let node = nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::kube(format!("patch Node {name}"), e))?;
            tracing::info!(node = %name, "adopted the existing Node");
            Ok(node)
        }
    }
}

/// Whether the CSINode tells the control plane what this agent does (the migration design), and if
/// not, why.
pub fn migration_in_sync(csinode: Option<&CSINode>, own: &MigratedPlugins) -> Result<(), String> {
    let Some(csinode) = csinode else {
        return Err("the CSINode object does not exist yet".into());
    };
    let theirs = NodeMigrationInfo::from_csinode(Some(csinode)).migrated_plugins;
    let ours: std::collections::BTreeSet<String> = own.iter().map(str::to_string).collect();
    if theirs == ours {
        Ok(())
    } else {
        Err(format!(
            "the CSINode annotation {} lists [{}] but this node's feature gates migrate [{}]",
            csi_translation::MIGRATED_PLUGINS_ANNOTATION,
            theirs.into_iter().collect::<Vec<_>>().join(","),
            ours.into_iter().collect::<Vec<_>>().join(",")
        ))
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Posts the node's conditions and addresses (status subresource).
async fn post_status(
    nodes: &Api<Node>,
    name: &str,
    max_pods: u32,
    ready: &Result<(), String>,
    transition: &str,
) -> Result<(), kube::Error> {
    let heartbeat = now();
    let (status, reason, message) = match ready {
        Ok(()) => (
            "True",
            "KubeletReady",
            "csi-node-agent is posting ready status".to_string(),
        ),
        Err(why) => ("False", "KubeletNotReady", why.clone()),
    };
    let condition = |t: &str, s: &str, reason: &str, message: &str| {
        json!({
            "type": t, "status": s, "reason": reason, "message": message,
            "lastHeartbeatTime": heartbeat, "lastTransitionTime": transition,
        })
    };
    let body = json!({"status": {
        "conditions": [
            condition("Ready", status, reason, &message),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ],
        "capacity": {"pods": max_pods.to_string(), "cpu": "2", "memory": "4Gi"},
        "allocatable": {"pods": max_pods.to_string(), "cpu": "2", "memory": "4Gi"},
        "nodeInfo": {
            "kubeletVersion": concat!("v1.34.0-csi-rs-", env!("CARGO_PKG_VERSION")),
            "operatingSystem": "linux",
            "architecture": default_labels(name).get("kubernetes.io/arch").cloned().unwrap_or_default(),
            "containerRuntimeVersion": "none://0",
            "kernelVersion": "", "osImage": "", "kubeProxyVersion": "",
            "machineID": "", "systemUUID": "", "bootID": "",
        },
    }});
    // A strategic merge patch: conditions and addresses merge by `type`, as the kubelet
    // writes them, so a condition another component owns (NetworkUnavailable from the
    // network plugin, a node-problem-detector's) survives; a JSON merge patch would replace
    // the whole list with these four.
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&body))
        .await?;
    Ok(())
}

/// Keeps the Ready condition right until `stop`: posted when it changes (at once when the
/// CSINode changes) and at least every `report_frequency`.
pub async fn run_status(
    client: Client,
    options: Options,
    csinodes: ObjectCache<CSINode>,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let name = options.node_name.clone();
    let mut csinode_changed = csinodes.changed();
    let mut last: Option<(Result<(), String>, tokio::time::Instant)> = None;
    let mut transition = now();
    loop {
        let ready = migration_in_sync(csinodes.get(&name).as_deref(), &options.migrated);
        let due = match &last {
            None => true,
            Some((prev, at)) => {
                *prev != ready || at.elapsed() >= options.node_status_report_frequency
            }
        };
        if due {
            if last
                .as_ref()
                .is_some_and(|(prev, _)| prev.is_ok() != ready.is_ok())
            {
                transition = now();
            }
            match post_status(&nodes, &name, options.max_pods, &ready, &transition).await {
                Ok(()) => {
                    match &ready {
                        Ok(()) => tracing::info!(node = %name, "node status: Ready"),
                        Err(why) => {
                            tracing::info!(node = %name, why = %why, "node status: NotReady")
                        }
                    }
                    last = Some((ready, tokio::time::Instant::now()));
                }
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "posting node status failed; retrying")
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            _ = csinode_changed.changed() => {}
            () = tokio::time::sleep(options.node_status_update_frequency.min(Duration::from_secs(10))) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csinode(annotation: Option<&str>) -> CSINode {
        CSINode {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                annotations: annotation.map(|a| {
                    [(
                        csi_translation::MIGRATED_PLUGINS_ANNOTATION.to_string(),
                        a.to_string(),
                    )]
                    .into()
                }),
                ..Default::default()
            },
            spec: Default::default(),
        }
    }

    #[test]
    fn ready_only_when_the_annotation_matches_the_gates() {
        let aws = MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap();
        let none = MigratedPlugins::none();
        assert!(migration_in_sync(None, &none).is_err(), "no CSINode yet");
        assert!(migration_in_sync(Some(&csinode(None)), &none).is_ok());
        assert!(migration_in_sync(Some(&csinode(Some(""))), &none).is_ok());
        let e = migration_in_sync(Some(&csinode(None)), &aws).unwrap_err();
        assert!(e.contains("kubernetes.io/aws-ebs"), "{e}");
        assert!(migration_in_sync(Some(&csinode(Some("kubernetes.io/aws-ebs"))), &aws).is_ok());
        assert!(migration_in_sync(Some(&csinode(Some("kubernetes.io/aws-ebs"))), &none).is_err());
    }

    #[test]
    fn default_labels_use_go_arch_names() {
        let l = default_labels("n1");
        assert_eq!(l["kubernetes.io/hostname"], "n1");
        assert_ne!(l["kubernetes.io/arch"], "x86_64");
    }
}
