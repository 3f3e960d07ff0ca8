//! The in-tree `kubernetes.io/aws-ebs` plugin as the controller uses it: the node's EC2
//! instance from `spec.providerID`, the volume ID from the spec, and the caveat of the migration
//! design (docs/design/migration.md): every in-tree detach also deletes the VolumeAttachment the
//! CSI path would have made.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use volume_plugins::aws_ebs::{self, AwsEbsPlugin};

/// The plugin, with or without a cloud.
#[derive(Clone)]
pub(crate) struct InTree {
    plugin: Arc<AwsEbsPlugin>,
}

impl std::fmt::Debug for InTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InTree")
            .field("cloud", &self.plugin.has_cloud())
            .finish()
    }
}

/// The EC2 instance of a node, from `spec.providerID` (`aws:///us-east-1a/i-0123`).
pub(crate) fn instance_of(node: &Node) -> Result<String, volume_plugins::Error> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default();
    aws_ebs::instance_id_from_provider_id(provider_id).ok_or_else(|| {
        volume_plugins::Error::InvalidSpec(format!(
            "node {name}: spec.providerID {provider_id:?} does not name an EC2 instance (want aws:///<zone>/i-…)"
        ))
    })
}

impl InTree {
    pub(crate) fn new(cloud: Option<Arc<dyn ebs_cloud::Cloud>>) -> Self {
        Self {
            plugin: Arc::new(AwsEbsPlugin::new(cloud)),
        }
    }

    /// Attaches the volume (`volumeID` as in the spec) to the node's instance; returns the
    /// devicePath and the instance. Without a cloud that is the plugin's NoCloud error first,
    /// whatever the node looks like: it says what to configure.
    pub(crate) async fn attach(
        &self,
        spec_volume_id: &str,
        node_name: &str,
        node: Option<&Node>,
        timeout: Duration,
    ) -> Result<(String, String), volume_plugins::Error> {
        let volume_id = aws_ebs::volume_id_from_spec(spec_volume_id)?;
        if !self.plugin.has_cloud() {
            return Err(volume_plugins::Error::NoCloud {
                operation: "attach",
                volume_id,
            });
        }
        let node = node.ok_or_else(|| {
            volume_plugins::Error::InvalidSpec(format!("node {node_name} not found"))
        })?;
        let instance = instance_of(node)?;
        let device = self.plugin.attach(&volume_id, &instance, timeout).await?;
        Ok((device, instance))
    }

    /// Detaches the volume from the instance.
    pub(crate) async fn detach(
        &self,
        spec_volume_id: &str,
        instance_id: &str,
        timeout: Duration,
    ) -> Result<bool, volume_plugins::Error> {
        let volume_id = aws_ebs::volume_id_from_spec(spec_volume_id)?;
        self.plugin.detach(&volume_id, instance_id, timeout).await
    }

    /// The EBS volume ID (`vol-…`) of a spec's `volumeID`.
    pub(crate) fn volume_id(spec_volume_id: &str) -> Result<String, volume_plugins::Error> {
        aws_ebs::volume_id_from_spec(spec_volume_id)
    }
}
