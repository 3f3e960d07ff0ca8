//! Azure File: `kubernetes.io/azure-file` <-> `file.csi.azure.com`.
//!
//! The CSI handle is `<resource group>#<storage account>#<share>#<pv name>#<secret namespace>`;
//! the account comes from the secret name `azure-storage-account-<account>-secret` (or is the
//! secret name itself). The resource group is kept in the annotation
//! `kubernetes.io/azure-file-resource-group`. The secret namespace of a PV comes from the source,
//! else from the claim; without either the PV cannot be translated.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume, SecretReference,
    Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use regex_lite::Regex;

use super::{
    InTreePlugin, PluginNames, go_bool, inline_source, named_pv, pv_source, required_csi_source,
    spec,
};
use crate::{Error, Result};

/// In-tree plugin name.
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/azure-file";
/// CSI driver name.
pub const DRIVER_NAME: &str = "file.csi.azure.com";
/// PV annotation holding the resource group of the storage account.
pub const RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";

const SEPARATOR: char = '#';
const ATTR_SHARE_NAME: &str = "sharename";
const ATTR_SECRET_NAME: &str = "secretname";
const ATTR_SECRET_NAMESPACE: &str = "secretnamespace";
const DEFAULT_SECRET_NAMESPACE: &str = "default";
const SECRET_NAME_PATTERN: &str = "azure-storage-account-(.+)-secret";

// A constant pattern that the tests compile; a failure is a programming error.
#[allow(clippy::expect_used)]
static SECRET_NAME_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(SECRET_NAME_PATTERN).expect("constant pattern compiles"));

/// The Azure File plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct AzureFile;

/// The parts of an Azure File volume ID.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileShareInfo {
    /// Resource group (may be empty).
    pub resource_group: String,
    /// Storage account.
    pub account_name: String,
    /// File share.
    pub file_share_name: String,
    /// Fourth part, if any (a disk name for dynamically provisioned volumes).
    pub disk_name: String,
}

/// Splits `rg#account#share[#disk...]`.
pub fn file_share_info(id: &str) -> Result<FileShareInfo> {
    let parts: Vec<&str> = id.split(SEPARATOR).collect();
    if parts.len() < 3 {
        return Err(Error::AzureFileVolumeId(id.to_string()));
    }
    Ok(FileShareInfo {
        resource_group: parts[0].to_string(),
        account_name: parts[1].to_string(),
        file_share_name: parts[2].to_string(),
        disk_name: parts.get(3).map(|s| s.to_string()).unwrap_or_default(),
    })
}

/// The storage account in a secret name `azure-storage-account-<account>-secret`.
pub fn storage_account_name(secret_name: &str) -> Result<String> {
    SECRET_NAME_RE
        .captures(secret_name)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_string())
        .ok_or_else(|| Error::AzureStorageAccount {
            secret: secret_name.to_string(),
            pattern: SECRET_NAME_PATTERN,
        })
}

fn volume_id(
    resource_group: &str,
    secret_name: &str,
    share: &str,
    name: &str,
    namespace: &str,
) -> String {
    // A secret that does not follow the naming scheme is used as the account name itself.
    let account = storage_account_name(secret_name).unwrap_or_else(|_| secret_name.to_string());
    format!("{resource_group}#{account}#{share}#{name}#{namespace}")
}

fn csi_source_for(
    handle: String,
    read_only: Option<bool>,
    share: &str,
    secret_name: &str,
    namespace: &str,
) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER_NAME.to_string(),
        volume_handle: handle,
        read_only: go_bool(read_only),
        volume_attributes: Some(BTreeMap::from([(
            ATTR_SHARE_NAME.to_string(),
            share.to_string(),
        )])),
        node_stage_secret_ref: Some(SecretReference {
            name: Some(secret_name.to_string()),
            namespace: Some(namespace.to_string()),
        }),
        ..Default::default()
    }
}

impl InTreePlugin for AzureFile {
    fn names(&self) -> PluginNames {
        PluginNames::new(IN_TREE_PLUGIN_NAME, DRIVER_NAME, "azure-file")
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        spec(pv).is_some_and(|s| s.azure_file.is_some())
    }

    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.azure_file.is_some()
    }

    fn translate_in_tree_storage_class_to_csi(&self, sc: &StorageClass) -> Result<StorageClass> {
        // The CSI driver understands the in-tree parameters as they are.
        Ok(sc.clone())
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let src = inline_source(volume.azure_file.as_ref(), "azureFile", IN_TREE_PLUGIN_NAME)?;
        let namespace = if pod_namespace.is_empty() {
            DEFAULT_SECRET_NAMESPACE
        } else {
            pod_namespace
        };
        let handle = volume_id(
            "",
            &src.secret_name,
            &src.share_name,
            &volume.name,
            namespace,
        );
        let csi = csi_source_for(
            handle.clone(),
            src.read_only,
            &src.share_name,
            &src.secret_name,
            namespace,
        );
        Ok(named_pv(handle, csi, "ReadWriteMany"))
    }

    fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let src = pv_source(pv, "spec.azureFile", IN_TREE_PLUGIN_NAME, |s| {
            s.azure_file.as_ref()
        })?;
        let resource_group = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RESOURCE_GROUP_ANNOTATION))
            .map_or("", String::as_str);
        // The secret is needed at mount time, when there may be no pod to take a namespace from.
        let namespace = match &src.secret_namespace {
            Some(ns) => ns.as_str(),
            None => spec(pv)
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|c| c.namespace.as_deref())
                .unwrap_or(""),
        };
        if namespace.is_empty() {
            return Err(Error::Unsupported {
                field: "spec.azureFile.secretNamespace",
                reason: "could not find a secret namespace in spec.azureFile.secretNamespace or spec.claimRef.namespace"
                    .into(),
            });
        }
        let name = pv.metadata.name.as_deref().unwrap_or("");
        let handle = volume_id(
            resource_group,
            &src.secret_name,
            &src.share_name,
            name,
            namespace,
        );
        let csi = csi_source_for(
            handle,
            src.read_only,
            &src.share_name,
            &src.secret_name,
            namespace,
        );
        let mut out = pv.clone();
        let spec = out.spec.get_or_insert_with(Default::default);
        spec.azure_file = None;
        spec.csi = Some(csi);
        Ok(out)
    }

    fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let csi = required_csi_source(pv, DRIVER_NAME)?;
        let mut src = AzureFilePersistentVolumeSource {
            read_only: go_bool(csi.read_only),
            ..Default::default()
        };
        for (k, v) in csi.volume_attributes.iter().flatten() {
            match k.to_lowercase().as_str() {
                ATTR_SHARE_NAME => src.share_name = v.clone(),
                ATTR_SECRET_NAME => src.secret_name = v.clone(),
                ATTR_SECRET_NAMESPACE => src.secret_namespace = Some(v.clone()),
                _ => {}
            }
        }
        if let Some(secret) = csi
            .node_stage_secret_ref
            .as_ref()
            .filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty()))
        {
            src.secret_name = secret.name.clone().unwrap_or_default();
            src.secret_namespace = Some(secret.namespace.clone().unwrap_or_default());
        }
        let mut resource_group = String::new();
        if src.share_name.is_empty() || src.secret_name.is_empty() {
            let info = file_share_info(&csi.volume_handle)?;
            if src.share_name.is_empty() {
                src.share_name = info.file_share_name;
            }
            if src.secret_name.is_empty() {
                src.secret_name = format!("azure-storage-account-{}-secret", info.account_name);
            }
            resource_group = info.resource_group;
        }
        if src.secret_namespace.is_none() {
            src.secret_namespace = Some(DEFAULT_SECRET_NAMESPACE.to_string());
        }
        let mut out = pv.clone();
        if !resource_group.is_empty() {
            out.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(RESOURCE_GROUP_ANNOTATION.to_string(), resource_group);
        }
        let spec = out.spec.get_or_insert_with(Default::default);
        spec.csi = None;
        spec.azure_file = Some(src);
        Ok(out)
    }
}
