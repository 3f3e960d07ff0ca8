//! Portworx: `kubernetes.io/portworx-volume` <-> `pxd.portworx.com`.
//!
//! The CSI handle is the Portworx volume ID. OpenStorage auth secrets (StorageClass parameters
//! or PV annotations `openstorage.io/auth-secret-name` / `-namespace`) become the CSI secret
//! references of every operation. Unlike the other plugins, the StorageClass provisioner is
//! switched to the CSI driver here, as upstream does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PortworxVolumeSource, SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{
    InTreePlugin, PluginNames, edit_spec, go_bool, go_string, inline_source, named_pv, parameters,
    pv_source, required_csi_source, spec,
};
use crate::Result;

/// In-tree plugin name.
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/portworx-volume";
/// CSI driver name.
pub const DRIVER_NAME: &str = "pxd.portworx.com";
/// StorageClass parameter / PV annotation with the auth secret name.
pub const AUTH_SECRET_NAME_KEY: &str = "openstorage.io/auth-secret-name";
/// StorageClass parameter / PV annotation with the auth secret namespace.
pub const AUTH_SECRET_NAMESPACE_KEY: &str = "openstorage.io/auth-secret-namespace";

const CSI_SECRET_OPERATIONS: [&str; 6] = [
    "provisioner",
    "controller-publish",
    "node-publish",
    "node-stage",
    "controller-expand",
    "node-expand",
];

/// The Portworx plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Portworx;

impl InTreePlugin for Portworx {
    fn names(&self) -> PluginNames {
        PluginNames::new(IN_TREE_PLUGIN_NAME, DRIVER_NAME, "portworx")
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        spec(pv).is_some_and(|s| s.portworx_volume.is_some())
    }

    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.portworx_volume.is_some()
    }

    fn translate_in_tree_storage_class_to_csi(&self, sc: &StorageClass) -> Result<StorageClass> {
        let mut params = BTreeMap::new();
        for (k, v) in parameters(sc) {
            // Matched in any case, as upstream does (`OpenStorage.io/auth-secret-name` works).
            let suffix = match k.to_lowercase().as_str() {
                AUTH_SECRET_NAME_KEY => "name",
                AUTH_SECRET_NAMESPACE_KEY => "namespace",
                _ => {
                    params.insert(k.clone(), v.clone());
                    continue;
                }
            };
            for op in CSI_SECRET_OPERATIONS {
                params.insert(
                    format!("csi.storage.k8s.io/{op}-secret-{suffix}"),
                    v.clone(),
                );
            }
        }
        let mut out = sc.clone();
        out.parameters = sc.parameters.as_ref().map(|_| params);
        out.provisioner = DRIVER_NAME.to_string();
        Ok(out)
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let src = inline_source(
            volume.portworx_volume.as_ref(),
            "portworxVolume",
            IN_TREE_PLUGIN_NAME,
        )?;
        // As upstream: read-only is the access mode, not `csi.readOnly`. The PV becomes the
        // VolumeAttachment's inlineVolumeSpec, which must be what kube-controller-manager writes.
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: src.volume_id.clone(),
            fs_type: go_string(src.fs_type.as_ref()),
            volume_attributes: Some(BTreeMap::new()),
            ..Default::default()
        };
        let mode = if src.read_only == Some(true) {
            "ReadOnlyMany"
        } else {
            "ReadWriteOnce"
        };
        Ok(named_pv(
            format!("{DRIVER_NAME}-{}", src.volume_id),
            csi,
            mode,
        ))
    }

    fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let src = pv_source(pv, "spec.portworxVolume", IN_TREE_PLUGIN_NAME, |s| {
            s.portworx_volume.as_ref()
        })?;
        let annotations = pv.metadata.annotations.as_ref();
        let secret = annotations.and_then(|a| {
            Some(SecretReference {
                name: Some(a.get(AUTH_SECRET_NAME_KEY)?.clone()),
                namespace: Some(a.get(AUTH_SECRET_NAMESPACE_KEY)?.clone()),
            })
        });
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: src.volume_id.clone(),
            fs_type: go_string(src.fs_type.as_ref()),
            // Upstream drops readOnly here, publishing a read-only volume read-write; it is
            // kept (only `true`: Go's encoder has no `false`).
            read_only: go_bool(src.read_only),
            volume_attributes: Some(BTreeMap::new()),
            controller_publish_secret_ref: secret.clone(),
            node_stage_secret_ref: secret.clone(),
            node_publish_secret_ref: secret.clone(),
            controller_expand_secret_ref: secret.clone(),
            node_expand_secret_ref: secret,
        };
        Ok(edit_spec(pv, |s| {
            s.portworx_volume = None;
            s.csi = Some(csi);
        }))
    }

    fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let csi = required_csi_source(pv, DRIVER_NAME)?;
        let px = PortworxVolumeSource {
            volume_id: csi.volume_handle.clone(),
            fs_type: go_string(csi.fs_type.as_ref()),
            read_only: go_bool(csi.read_only),
        };
        Ok(edit_spec(pv, |s| {
            s.csi = None;
            s.portworx_volume = Some(px);
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn auth_secret_parameters_match_in_any_case() {
        let sc: StorageClass = serde_json::from_value(json!({
            "provisioner": IN_TREE_PLUGIN_NAME,
            "parameters": {
                "OpenStorage.io/Auth-Secret-Name": "px-user",
                "OPENSTORAGE.IO/AUTH-SECRET-NAMESPACE": "portworx",
                "repl": "2"
            }
        }))
        .unwrap();
        let out = Portworx
            .translate_in_tree_storage_class_to_csi(&sc)
            .unwrap();
        let params = out.parameters.unwrap();
        assert_eq!(params.len(), 13, "{params:?}");
        for op in CSI_SECRET_OPERATIONS {
            assert_eq!(
                params[&format!("csi.storage.k8s.io/{op}-secret-name")],
                "px-user"
            );
            assert_eq!(
                params[&format!("csi.storage.k8s.io/{op}-secret-namespace")],
                "portworx"
            );
        }
        assert_eq!(params["repl"], "2");
        assert!(
            !params
                .keys()
                .any(|k| k.to_lowercase().starts_with("openstorage.io/"))
        );
        assert_eq!(out.provisioner, DRIVER_NAME);
    }

    #[test]
    fn read_only_inline_volume_is_read_only_many_like_upstream() {
        let v: Volume = serde_json::from_value(json!({
            "name": "px", "portworxVolume": {"volumeID": "123", "readOnly": true}
        }))
        .unwrap();
        let pv = Portworx
            .translate_in_tree_inline_volume_to_csi(&v, "ns")
            .unwrap();
        let spec = pv.spec.unwrap();
        assert_eq!(spec.access_modes, Some(vec!["ReadOnlyMany".to_string()]));
        assert_eq!(spec.csi.unwrap().read_only, None);
    }
}
