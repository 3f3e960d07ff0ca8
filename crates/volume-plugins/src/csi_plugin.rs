//! The CSI volume plugin's attach side (the operations of the skip-attach design,
//! docs/design/skip-attach.md), as the attach/detach controller and the kubelet run it: `attach`
//! and `detach` create and delete VolumeAttachments for an external attacher to fulfil,
//! `volumes_are_attached` and `wait_for_attach` read them. Whether a volume needs any of that comes
//! from the driver's CSIDriver in a cache, through [`crate::attach_path`].
//!
//! Every operation is one idempotent step that can be repeated after a timeout or a restart: an
//! existing VolumeAttachment for the same volume and node is reused, a missing one on detach is
//! success.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use k8s_openapi::api::storage::v1::{
    CSIDriver, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::names::volume_attachment_name;
use crate::skip_attach::{AttachPath, DriverAttach, SkipAttachMode, attach_path};
use crate::{Error, Result};
use component_runtime::ObjectCache;

/// What a VolumeAttachment points at (`spec.source`).
#[derive(Debug, Clone, PartialEq)]
pub enum AttachSource {
    /// A PersistentVolume by name (a CSI PV, or an in-tree PV migrated to CSI).
    PersistentVolume(String),
    /// An inline in-tree volume of a pod, migrated to CSI: the translated PV spec.
    Inline(Box<PersistentVolumeSpec>),
}

/// One CSI volume to attach to a node.
#[derive(Debug, Clone, PartialEq)]
pub struct CsiVolume {
    pub driver: String,
    pub volume_handle: String,
    pub source: AttachSource,
}

/// The result of a successful attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// What goes into `node.status.volumesAttached[].devicePath`: always empty for CSI, as
    /// Kubernetes writes it (the device is the driver's business, found at NodeStage).
    pub device_path: String,
    /// The VolumeAttachment that carries the attachment, or `None` for a no-op attach.
    pub volume_attachment: Option<String>,
    /// The VolumeAttachment's `status.attachmentMetadata` (NodeStage's publish_context).
    pub attachment_metadata: BTreeMap<String, String>,
}

/// The CSI plugin over a CSIDriver cache and a VolumeAttachment cache.
#[derive(Debug, Clone)]
pub struct CsiPlugin {
    vas: Api<VolumeAttachment>,
    drivers: ObjectCache<CSIDriver>,
    attachments: ObjectCache<VolumeAttachment>,
    mode: SkipAttachMode,
}

impl CsiPlugin {
    pub fn new(
        client: Client,
        drivers: ObjectCache<CSIDriver>,
        attachments: ObjectCache<VolumeAttachment>,
        mode: SkipAttachMode,
    ) -> Self {
        Self {
            vas: Api::all(client),
            drivers,
            attachments,
            mode,
        }
    }

    /// The skip-attach mode this plugin runs in.
    pub fn mode(&self) -> SkipAttachMode {
        self.mode
    }

    /// How volumes of `driver` are attached, from its CSIDriver as cached now.
    pub fn attach_path(&self, driver: &str) -> AttachPath {
        attach_path(
            self.mode,
            DriverAttach::from_csidriver(self.drivers.get(driver).as_deref()),
        )
    }

    /// Whether the attach/detach controller handles volumes of `driver` at all (false only
    /// for `attachRequired: false` in the default mode).
    pub fn can_attach(&self, driver: &str) -> bool {
        self.attach_path(driver).adc_manages()
    }

    /// Attaches `volume` to `node`: a no-op for a driver with `attachRequired: false`;
    /// otherwise creates (or reuses) the VolumeAttachment and waits up to `timeout` for the
    /// attacher's `status.attached`. A `status.attachError` ends the wait at once with its
    /// message. If the driver's CSIDriver appears with `attachRequired: false` while waiting
    /// (the VolumeAttachment was made because it was missing), the volume is attached: the
    /// VolumeAttachment stays until the detach deletes it.
    pub async fn attach(
        &self,
        volume: &CsiVolume,
        node: &str,
        timeout: Duration,
    ) -> Result<Attached> {
        if !self.attach_path(&volume.driver).creates_volume_attachment() {
            return Ok(no_op_attach());
        }
        let name = volume_attachment_name(&volume.volume_handle, &volume.driver, node);
        let va = new_volume_attachment(&name, volume, node);
        match self.vas.create(&PostParams::default(), &va).await {
            Ok(_) => tracing::debug!(va = %name, node, "created VolumeAttachment"),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(va = %name, node, "VolumeAttachment exists; reusing it")
            }
            Err(source) => {
                return Err(Error::Api {
                    action: format!("create VolumeAttachment {name}"),
                    source,
                });
            }
        }
        self.wait_attached(&name, &volume.driver, node, true, timeout)
            .await
    }

    /// The kubelet's wait: returns once the volume's VolumeAttachment says attached (with
    /// its attachment metadata), at once for a driver that needs no attach.
    pub async fn wait_for_attach(
        &self,
        driver: &str,
        volume_handle: &str,
        node: &str,
        timeout: Duration,
    ) -> Result<Attached> {
        if !self.attach_path(driver).creates_volume_attachment() {
            return Ok(no_op_attach());
        }
        let name = volume_attachment_name(volume_handle, driver, node);
        self.wait_attached(&name, driver, node, false, timeout)
            .await
    }

    async fn wait_attached(
        &self,
        name: &str,
        driver: &str,
        node: &str,
        created_by_us: bool,
        timeout: Duration,
    ) -> Result<Attached> {
        let deadline = Instant::now() + timeout;
        // A scoped cache may hold a copy seconds old; attached there may mean being deleted
        // (detached any moment) here. Mount only on what the API server says now.
        self.attachments
            .refresh(None, name, timeout.min(Duration::from_secs(10)))
            .await;
        let va_changed = self.attachments.name_changed(name);
        let mut drivers_changed = self.drivers.changed();
        // False once the CSIDriver cache has stopped (shutdown): its channel then only errs.
        let mut drivers_live = true;
        loop {
            let notified = va_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.attach_path(driver).creates_volume_attachment() {
                tracing::info!(va = %name, driver, "the CSIDriver now says attachRequired: false; attached without waiting");
                return Ok(no_op_attach());
            }
            let state = match self.attachments.get(name) {
                None => None,
                Some(va) => {
                    if va.metadata.deletion_timestamp.is_some() {
                        return Err(Error::BeingDeleted {
                            volume_attachment: name.to_string(),
                        });
                    }
                    let status = va.status.clone().unwrap_or_default();
                    if status.attached {
                        return Ok(Attached {
                            device_path: String::new(),
                            volume_attachment: Some(name.to_string()),
                            attachment_metadata: status.attachment_metadata.unwrap_or_default(),
                        });
                    }
                    if let Some(message) = status.attach_error.and_then(|e| e.message) {
                        return Err(Error::AttachFailed {
                            volume_attachment: name.to_string(),
                            message,
                        });
                    }
                    Some(())
                }
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                let why = match (state, created_by_us) {
                    (Some(()), _) => format!(
                        "the attacher of {driver} has not set status.attached (is csi-attacher for {driver} running?)"
                    ),
                    (None, true) => {
                        "it is not in the cache yet (is the watch on VolumeAttachments working?)"
                            .to_string()
                    }
                    (None, false) => {
                        "it does not exist (the attach/detach controller has not created it)"
                            .to_string()
                    }
                };
                return Err(Error::Timeout {
                    what: format!(
                        "VolumeAttachment {name} of volume on node {node} to be attached: {why}"
                    ),
                    waited: timeout,
                });
            }
            tokio::select! {
                () = &mut notified => {}
                r = drivers_changed.changed(), if drivers_live => drivers_live = r.is_ok(),
                () = tokio::time::sleep(remaining) => {}
            }
        }
    }

    /// Detaches the volume from `node`: deletes its VolumeAttachment **whatever the driver's
    /// CSIDriver says** (one made before the CSIDriver existed, by an older controller, or by
    /// the CSI path of a migrated in-tree volume must go too), then waits up to `timeout` until
    /// it is gone. A `status.detachError` ends the wait with its message. No VolumeAttachment
    /// is success. Returns whether one was deleted.
    pub async fn detach(
        &self,
        driver: &str,
        volume_handle: &str,
        node: &str,
        timeout: Duration,
    ) -> Result<bool> {
        let name = volume_attachment_name(volume_handle, driver, node);
        match self.vas.delete(&name, &DeleteParams::default()).await {
            // No finalizer held it: gone already.
            Ok(deleted) if deleted.is_right() => return Ok(true),
            Ok(_) => tracing::debug!(va = %name, node, "deleting VolumeAttachment"),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(source) => {
                return Err(Error::Api {
                    action: format!("delete VolumeAttachment {name}"),
                    source,
                });
            }
        }
        let deadline = Instant::now() + timeout;
        let changed = self.attachments.name_changed(&name);
        loop {
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The cache may not have seen a VolumeAttachment created a moment ago: absence
            // there is confirmed with the API server before the detach counts as done.
            let va = match self.attachments.get(&name) {
                Some(va) => va,
                None => match self.vas.get_opt(&name).await {
                    Ok(None) => return Ok(true),
                    Ok(Some(va)) => std::sync::Arc::new(va),
                    Err(source) => {
                        return Err(Error::Api {
                            action: format!("get VolumeAttachment {name}"),
                            source,
                        });
                    }
                },
            };
            if let Some(message) = va
                .status
                .as_ref()
                .and_then(|s| s.detach_error.as_ref())
                .and_then(|e| e.message.clone())
            {
                return Err(Error::DetachFailed {
                    volume_attachment: name,
                    message,
                });
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::Timeout {
                    what: format!(
                        "VolumeAttachment {name} on node {node} to be deleted: the attacher of {driver} has not detached it (is csi-attacher for {driver} running?)"
                    ),
                    waited: timeout,
                });
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep(remaining) => {}
            }
        }
    }

    /// Whether each `(driver, volume_handle)` is attached to `node` as far as the cache knows:
    /// a driver that needs no attach is always attached; otherwise its VolumeAttachment must
    /// say `status.attached`.
    pub fn volumes_are_attached(&self, volumes: &[(String, String)], node: &str) -> Vec<bool> {
        volumes
            .iter()
            .map(|(driver, handle)| {
                if !self.attach_path(driver).creates_volume_attachment() {
                    return true;
                }
                self.attachments
                    .get(&volume_attachment_name(handle, driver, node))
                    .is_some_and(|va| va.status.as_ref().is_some_and(|s| s.attached))
            })
            .collect()
    }
}

fn no_op_attach() -> Attached {
    Attached {
        device_path: String::new(),
        volume_attachment: None,
        attachment_metadata: BTreeMap::new(),
    }
}

/// The VolumeAttachment Kubernetes' CSI plugin creates.
pub fn new_volume_attachment(name: &str, volume: &CsiVolume, node: &str) -> VolumeAttachment {
    let source = match &volume.source {
        AttachSource::PersistentVolume(pv) => VolumeAttachmentSource {
            persistent_volume_name: Some(pv.clone()),
            inline_volume_spec: None,
        },
        AttachSource::Inline(spec) => VolumeAttachmentSource {
            persistent_volume_name: None,
            inline_volume_spec: Some((**spec).clone()),
        },
    };
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: volume.driver.clone(),
            node_name: node.to_string(),
            source,
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::CSIDriverSpec;

    fn driver(name: &str, attach_required: Option<bool>) -> CSIDriver {
        CSIDriver {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: CSIDriverSpec {
                attach_required,
                ..CSIDriverSpec::default()
            },
        }
    }

    #[test]
    fn volume_attachment_as_kubernetes_writes_it() {
        let volume = CsiVolume {
            driver: "ebs.csi.aws.com".into(),
            volume_handle: "vol-1".into(),
            source: AttachSource::PersistentVolume("pv-1".into()),
        };
        let name = volume_attachment_name("vol-1", "ebs.csi.aws.com", "node-1");
        let va = new_volume_attachment(&name, &volume, "node-1");
        assert_eq!(va.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(va.spec.attacher, "ebs.csi.aws.com");
        assert_eq!(va.spec.node_name, "node-1");
        assert_eq!(
            va.spec.source.persistent_volume_name.as_deref(),
            Some("pv-1")
        );
        assert!(va.spec.source.inline_volume_spec.is_none());
        assert!(va.status.is_none());
    }

    /// Attach paths as the plugin sees them through its cache; the API is never called, so an
    /// unreachable client is fine.
    #[tokio::test]
    async fn no_op_attach_and_volumes_are_attached_follow_the_cache() {
        // A workspace build enables both of rustls' providers: pick one before any client.
        apiserver::install_crypto_provider();
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let drivers = ObjectCache::from_objects([
            driver("local.csi", Some(false)),
            driver("ebs.csi.aws.com", None),
        ]);
        let vas = ObjectCache::from_objects(Vec::<VolumeAttachment>::new());
        let seed = CsiPlugin::new(
            client.clone(),
            drivers.clone(),
            vas.clone(),
            SkipAttachMode::ThroughAdc,
        );
        let today = CsiPlugin::new(client, drivers, vas, SkipAttachMode::BypassAdc);
        assert!(seed.can_attach("local.csi"));
        assert!(!today.can_attach("local.csi"));
        assert!(today.can_attach("ebs.csi.aws.com") && today.can_attach("missing.csi"));
        let local = CsiVolume {
            driver: "local.csi".into(),
            volume_handle: "h".into(),
            source: AttachSource::PersistentVolume("pv".into()),
        };
        let attached = seed
            .attach(&local, "n", Duration::from_millis(10))
            .await
            .unwrap();
        assert_eq!(attached.volume_attachment, None);
        let volumes = [
            ("local.csi".to_string(), "h".to_string()),
            ("ebs.csi.aws.com".to_string(), "vol-1".to_string()),
        ];
        assert_eq!(seed.volumes_are_attached(&volumes, "n"), [true, false]);
        // The kubelet's wait for an attachable volume whose VA never comes names the VA.
        let err = today
            .wait_for_attach("ebs.csi.aws.com", "vol-1", "n", Duration::from_millis(20))
            .await
            .unwrap_err();
        let name = volume_attachment_name("vol-1", "ebs.csi.aws.com", "n");
        assert!(err.to_string().contains(&name), "{err}");
    }
}
