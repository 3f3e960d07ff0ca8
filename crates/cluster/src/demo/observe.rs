//! What the API and EC2 say about a volume: the node's `volumesAttached`, the node's CSINode
//! and its `migrated-plugins` annotation, the VolumeAttachments, the EC2 attachment.

use std::time::Duration;

use ebs_cloud::Cloud as _;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::CSINode;
use kube::{Api, Client};

use crate::Error;
use crate::kube_ops::{self, wait_for};

/// The CSINode annotation in which a node agent lists the plugins it migrated.
pub const MIGRATED_PLUGINS: &str = "storage.alpha.kubernetes.io/migrated-plugins";
/// The in-tree plugin's name, as the annotation lists it.
pub const AWS_EBS_PLUGIN: &str = "kubernetes.io/aws-ebs";

/// The EBS volume ID of a PV, in-tree (`aws://zone/vol-...` or `vol-...`) or CSI.
pub fn volume_id(pv: &PersistentVolume) -> Result<String, Error> {
    let spec = pv.spec.as_ref();
    let name = pv.metadata.name.as_deref().unwrap_or("?");
    if let Some(ebs) = spec.and_then(|s| s.aws_elastic_block_store.as_ref()) {
        return Ok(ebs
            .volume_id
            .rsplit('/')
            .next()
            .unwrap_or(&ebs.volume_id)
            .to_string());
    }
    if let Some(csi) = spec.and_then(|s| s.csi.as_ref()) {
        return Ok(csi.volume_handle.clone());
    }
    Err(Error::Check(format!(
        "PersistentVolume {name} has neither spec.awsElasticBlockStore nor spec.csi"
    )))
}

/// Node `node`'s `status.volumesAttached` names.
pub async fn volumes_attached(client: &Client, node: &str) -> Result<Vec<String>, Error> {
    let n = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .map_err(|e| Error::kube(format!("reading node {node}"), e))?;
    Ok(n.status
        .and_then(|s| s.volumes_attached)
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect())
}

/// Node `node`'s CSINode: `None` when there is none, else whether its `migrated-plugins`
/// annotation lists the in-tree aws-ebs plugin.
pub async fn csinode_migrated(client: &Client, node: &str) -> Result<Option<bool>, Error> {
    let c = Api::<CSINode>::all(client.clone())
        .get_opt(node)
        .await
        .map_err(|e| Error::kube(format!("reading CSINode {node}"), e))?;
    Ok(c.map(|c| {
        c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MIGRATED_PLUGINS))
            .is_some_and(|v| v.split(',').any(|p| p.trim() == AWS_EBS_PLUGIN))
    }))
}

/// Waits until node `node`'s CSINode exists and its annotation lists aws-ebs iff `migrated`
/// (the node agent writes it when it starts).
pub async fn wait_csinode(
    client: &Client,
    node: &str,
    migrated: bool,
    patience: Duration,
) -> Result<(), Error> {
    let what = format!(
        "CSINode {node} with {MIGRATED_PLUGINS} {} {AWS_EBS_PLUGIN}",
        if migrated { "listing" } else { "not listing" }
    );
    wait_for(&what, patience, || async {
        match csinode_migrated(client, node).await? {
            Some(m) if m == migrated => Ok(Some(())),
            other => Err(Error::Check(format!("CSINode {node}: {other:?}"))),
        }
    })
    .await
}

/// Waits until volume `volume_id` (PV `pv`) is attached nowhere: no VolumeAttachment for the
/// PV, no entry in node `node`'s `volumesAttached`, and EC2 says `available`.
pub async fn wait_detached(
    client: &Client,
    ec2: &ebs_cloud_aws::AwsCloud,
    node: &str,
    pv: &str,
    volume_id: &str,
    patience: Duration,
) -> Result<(), Error> {
    wait_for(
        &format!("{volume_id} detached from {node}"),
        patience,
        || async {
            let vas = kube_ops::attachments_of(client, pv).await?;
            if !vas.is_empty() {
                return Err(Error::Check(format!(
                    "VolumeAttachments left: {}",
                    kube_ops::describe_attachments(&vas)
                )));
            }
            let listed = volumes_attached(client, node).await?;
            if listed.iter().any(|n| n.ends_with(volume_id)) {
                return Err(Error::Check(format!(
                    "node {node} still lists it: {listed:?}"
                )));
            }
            let disk = ec2
                .get_disk_by_id(volume_id)
                .await
                .map_err(|e| Error::start(format!("reading EBS volume {volume_id}"), e))?;
            if disk.state == "available" {
                Ok(Some(()))
            } else {
                Err(Error::Check(format!(
                    "EC2 says {volume_id} is {}",
                    disk.state
                )))
            }
        },
    )
    .await
}

/// Waits until EBS volume `volume_id` no longer exists in EC2.
pub async fn wait_volume_gone(
    ec2: &ebs_cloud_aws::AwsCloud,
    volume_id: &str,
    patience: Duration,
) -> Result<(), Error> {
    wait_for(
        &format!("EBS volume {volume_id} deleted"),
        patience,
        || async {
            match ec2.get_disk_by_id(volume_id).await {
                Err(e) if e.is_not_found() => Ok(Some(())),
                Ok(d) if d.state == "deleted" => Ok(Some(())),
                Ok(d) => Err(Error::Check(format!("EC2 says {volume_id} is {}", d.state))),
                Err(e) => Err(Error::start(format!("reading EBS volume {volume_id}"), e)),
            }
        },
    )
    .await
}
