//! The CSI handler: ControllerPublishVolume / ControllerUnpublishVolume with finalizers.
//!
//! Attach, in this order (the external-attacher design, docs/design/external-attacher.md; each
//! write skipped when its effect is already there):
//! 1. check everything that can be checked without writing: the source, the PV (exists, not
//!    being deleted, CSI or migratable in-tree, our driver), the capability, the secrets, the
//!    node ID — so a hopeless VolumeAttachment never gets a finalizer that blocks its deletion;
//! 2. our finalizer on the PV (the detach needs the PV);
//! 3. our finalizer and the node-ID annotation on the VolumeAttachment, in one patch;
//! 4. ControllerPublishVolume;
//! 5. one status patch: attached, attachmentMetadata, attachError cleared.
//!
//! Detach: ControllerUnpublishVolume, then one patch removing our finalizer.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::slim_objects::Pv;
use crate::slim_objects::Va;
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, Secret};
use kube::Api;

use super::Handler;
use crate::context::{Capabilities, Ctx, writes};
use crate::csi::{CsiClient, Publish};
use crate::migration::{self, CsiVolume};
use crate::{Error, capability};

/// Where a VolumeAttachment's volume comes from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source<'a> {
    Pv(&'a str),
    Inline(&'a k8s_openapi::api::core::v1::PersistentVolumeSpec),
}

/// Exactly one of `persistentVolumeName` and `inlineVolumeSpec`, else an error on the object.
pub(crate) fn source_of(va: &Va) -> Result<Source<'_>, Error> {
    let src = &va.spec.source;
    let err = |reason: &str| Error::InvalidVolumeAttachment {
        name: va.metadata.name.clone().unwrap_or_default(),
        reason: reason.to_string(),
    };
    match (&src.persistent_volume_name, &src.inline_volume_spec) {
        (Some(_), Some(_)) => Err(err(
            "spec.source has both persistentVolumeName and inlineVolumeSpec; exactly one is required",
        )),
        (None, None) => Err(err(
            "spec.source has neither persistentVolumeName nor inlineVolumeSpec; exactly one is required",
        )),
        (Some(name), None) if name.is_empty() => {
            Err(err("spec.source.persistentVolumeName is empty"))
        }
        (Some(name), None) => Ok(Source::Pv(name)),
        (None, Some(spec)) => Ok(Source::Inline(spec.as_ref())),
    }
}

pub(crate) struct CsiHandler {
    ctx: Arc<Ctx>,
    csi: CsiClient,
    caps: Capabilities,
}

impl CsiHandler {
    pub(crate) fn new(ctx: Arc<Ctx>, csi: CsiClient, caps: Capabilities) -> Self {
        Self { ctx, csi, caps }
    }

    /// The volume to publish, translated to CSI, and its PV (None for inline volumes).
    async fn volume_of(&self, va: &Va) -> Result<(CsiVolume, Option<Arc<Pv>>), Error> {
        match source_of(va)? {
            Source::Pv(name) => {
                let pv = self.ctx.get_pv(name).await?.ok_or_else(|| {
                    Error::PersistentVolumeNotFound {
                        name: name.to_string(),
                    }
                })?;
                let volume = migration::pv_volume(&pv.to_full(), &self.ctx.driver)?;
                Ok((volume, Some(pv)))
            }
            Source::Inline(spec) => {
                let name = va.metadata.name.as_deref().unwrap_or_default();
                Ok((
                    migration::inline_volume(name, spec, &self.ctx.driver)?,
                    None,
                ))
            }
        }
    }

    /// `controllerPublishSecretRef` read with a GET (secrets are never watched or cached).
    async fn secrets(
        &self,
        csi: &CSIPersistentVolumeSource,
    ) -> Result<BTreeMap<String, String>, Error> {
        let Some(r) = &csi.controller_publish_secret_ref else {
            return Ok(BTreeMap::new());
        };
        let name = r.name.clone().unwrap_or_default();
        let namespace = r.namespace.clone().unwrap_or_default();
        if name.is_empty() || namespace.is_empty() {
            return Err(Error::Secret {
                namespace,
                name,
                reason: "both name and namespace are required".into(),
            });
        }
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &namespace);
        let secret = api.get(&name).await.map_err(|e| Error::Secret {
            namespace: namespace.clone(),
            name: name.clone(),
            reason: if writes::is_not_found(&e) {
                "not found".into()
            } else {
                e.to_string()
            },
        })?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    /// The driver's node ID from the node's CSINode; for a detach the VolumeAttachment's
    /// annotation stands in when the node (or its driver registration) is gone.
    async fn node_id(&self, va: &Va, detaching: bool) -> Result<String, Error> {
        let node = &va.spec.node_name;
        let from_csinode = match self.ctx.get_csinode(node) {
            Some(csinode) => csinode
                .node_id(&self.ctx.driver)
                .map(str::to_string)
                .ok_or_else(|| Error::DriverNotOnNode {
                    node: node.clone(),
                    driver: self.ctx.driver.clone(),
                }),
            None => Err(Error::CsiNodeNotFound {
                node: node.clone(),
                driver: self.ctx.driver.clone(),
            }),
        };
        match from_csinode {
            Ok(id) => Ok(id),
            Err(e) if detaching => va.node_id.clone().ok_or(e),
            Err(e) => Err(e),
        }
    }
}

#[async_trait::async_trait]
impl Handler for CsiHandler {
    async fn attach(&self, va: Arc<Va>, force: bool) -> Result<(), Error> {
        if !force && va.status.as_ref().is_some_and(|s| s.attached) {
            return Ok(());
        }
        let ctx = &self.ctx;
        let (volume, pv) = self.volume_of(&va).await?;
        if let Some(pv) = pv
            .as_ref()
            .filter(|pv| pv.metadata.deletion_timestamp.is_some())
        {
            return Err(Error::PersistentVolumeDeleting {
                name: pv.metadata.name.clone().unwrap_or_default(),
            });
        }
        let capability = capability::volume_capability(
            &volume.what,
            &volume.spec,
            &volume.csi,
            self.caps.single_node_multi_writer,
            &ctx.opts.default_fstype,
        )?;
        // "CO MUST set this field to false if SP does not have the PUBLISH_READONLY capability."
        let readonly = self.caps.publish_readonly && volume.csi.read_only.unwrap_or(false);
        let secrets = self.secrets(&volume.csi).await?;
        let node_id = self.node_id(&va, false).await?;

        if let Some(pv) = pv {
            writes::add_pv_finalizer(&ctx.pv_objects(), pv, &ctx.finalizer).await?;
        }
        let va = writes::prepare_va(&ctx.va_objects(), va, &ctx.finalizer, &node_id).await?;

        tracing::debug!(volume = %volume.csi.volume_handle, node = %node_id, "ControllerPublishVolume");
        let metadata = self
            .csi
            .publish(Publish {
                volume_id: volume.csi.volume_handle.clone(),
                node_id,
                capability,
                readonly,
                secrets,
                volume_context: volume.csi.volume_attributes.clone().unwrap_or_default(),
                migrated: volume.migrated,
            })
            .await?;
        writes::mark_attached(&ctx.va_api, &ctx.fresh_vas, &va, metadata).await
    }

    async fn detach(&self, va: Arc<Va>, force: bool) -> Result<(), Error> {
        let ctx = &self.ctx;
        if !force && !writes::has_finalizer(va.as_ref(), &ctx.finalizer) {
            // Never attached by us (or already detached): nothing holds the object.
            return Ok(());
        }
        let (volume, _pv) = self.volume_of(&va).await?;
        let secrets = self.secrets(&volume.csi).await?;
        let node_id = self.node_id(&va, true).await?;
        tracing::debug!(volume = %volume.csi.volume_handle, node = %node_id, "ControllerUnpublishVolume");
        self.csi
            .unpublish(
                volume.csi.volume_handle.clone(),
                node_id,
                secrets,
                volume.migrated,
            )
            .await?;
        writes::mark_detached(&ctx.va_objects(), va, &ctx.finalizer).await
    }

    fn kind(&self) -> &'static str {
        "csi"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeSpec;
    use k8s_openapi::api::storage::v1::{
        VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn va(pv: Option<&str>, inline: bool) -> Va {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some("va-1".into()),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: "mock.csi.rs".into(),
                node_name: "node-1".into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: pv.map(str::to_string),
                    inline_volume_spec: inline.then(PersistentVolumeSpec::default),
                },
            },
            status: None,
        }
        .into()
    }

    #[test]
    fn exactly_one_source_is_required() {
        assert_eq!(
            source_of(&va(Some("pv-1"), false)).ok(),
            Some(Source::Pv("pv-1"))
        );
        assert!(matches!(source_of(&va(None, true)), Ok(Source::Inline(_))));
        let e = source_of(&va(Some("pv-1"), true)).expect_err("both");
        assert_eq!(
            e.to_string(),
            "VolumeAttachment va-1: spec.source has both persistentVolumeName and inlineVolumeSpec; exactly one is required"
        );
        let e = source_of(&va(None, false)).expect_err("neither");
        assert!(e.to_string().contains("neither"), "{e}");
        assert!(source_of(&va(Some(""), false)).is_err());
    }
}
