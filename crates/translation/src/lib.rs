//! In-tree Kubernetes volume plugins <-> CSI translation.
//!
//! A Rust port of the behaviour of Kubernetes' `csi-translation-lib` (the migration design,
//! docs/design/migration.md, "Translation Library"): an in-tree PersistentVolume, inline Volume or
//! StorageClass of one of the seven migrated plugins is translated into its CSI equivalent, and a
//! CSI PersistentVolume back into the in-tree form. Inputs are never mutated: every function takes
//! `&T` and returns a new object. No input makes the library panic; upstream's crash on an inline
//! vSphere volume with `storagePolicyName` is an [`Error::Unsupported`] here.
//!
//! The entry points are the free functions re-exported from [`translator`] (and the same set as
//! methods on [`Translator`]). Per-plugin rules live in [`plugins`], behind the [`InTreePlugin`]
//! trait; the zone/region helpers shared by several plugins in [`topology`].
//!
//! ```
//! use k8s_openapi::api::core::v1::PersistentVolume;
//!
//! let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "data", "labels": {"topology.kubernetes.io/zone": "us-east-1a"}},
//!     "spec": {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-0abc", "fsType": "ext4"}}
//! }))?;
//! let csi = csi_translation::translate_in_tree_pv_to_csi(&pv)?;
//! let source = csi.spec.as_ref().and_then(|s| s.csi.as_ref()).ok_or("no CSI source")?;
//! assert_eq!(source.driver, "ebs.csi.aws.com");
//! assert_eq!(source.volume_handle, "vol-0abc");
//! // And back, for a rollback.
//! let back = csi_translation::translate_csi_pv_to_in_tree(&csi)?;
//! assert!(back.spec.and_then(|s| s.aws_elastic_block_store).is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cli;
pub(crate) mod input;
pub(crate) mod plan;
pub mod plugins;
pub mod topology;
pub mod translator;
pub mod vectors;

pub use plugins::{InTreePlugin, PluginNames, plugin_by_csi_name, plugin_by_in_tree_name, plugins};
pub use translator::{
    MIGRATED_PLUGINS_ANNOTATION, Translator, csi_name_from_in_tree_name,
    in_tree_name_from_csi_name, in_tree_plugin_name_from_spec, is_inline_migratable,
    is_migratable_in_tree_plugin_by_name, is_migrated_csi_driver_by_name, is_pv_migratable,
    repair_volume_handle, translate_csi_pv_to_in_tree, translate_in_tree_inline_volume_to_csi,
    translate_in_tree_pv_to_csi, translate_in_tree_storage_class_to_csi,
};

/// Everything that can go wrong while translating or while reading input for `csi-translate`.
///
/// Messages name the object field that is missing or wrong (Kubernetes JSON names, e.g.
/// `spec.csi.volumeHandle`) and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not carry the volume source the chosen plugin translates.
    #[error("{object} has no {field}: not a {plugin} volume")]
    MissingSource {
        /// `PersistentVolume` or `Volume`.
        object: &'static str,
        /// The JSON path of the expected source, e.g. `spec.awsElasticBlockStore`.
        field: &'static str,
        /// The in-tree plugin name.
        plugin: &'static str,
    },
    /// No migrated in-tree plugin handles this object.
    #[error("{object} {name:?}: no in-tree plugin with CSI migration handles it ({reason})")]
    NoPlugin {
        /// Object kind.
        object: &'static str,
        /// Object name (may be empty).
        name: String,
        /// Which fields were looked at.
        reason: &'static str,
    },
    /// An in-tree plugin name that is not one of the seven migrated plugins.
    #[error(
        "unknown in-tree plugin {0:?}: expected one of kubernetes.io/aws-ebs, kubernetes.io/gce-pd, kubernetes.io/azure-disk, kubernetes.io/azure-file, kubernetes.io/cinder, kubernetes.io/vsphere-volume, kubernetes.io/portworx-volume"
    )]
    UnknownInTreePlugin(String),
    /// A CSI driver name that has no in-tree counterpart.
    #[error("CSI driver {0:?} has no in-tree plugin counterpart")]
    UnknownCsiDriver(String),
    /// A field holds a value the translation cannot use.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidField {
        /// JSON path of the field.
        field: String,
        /// The offending value.
        value: String,
        /// What was expected.
        reason: String,
    },
    /// A field that upstream cannot translate either.
    #[error("{field}: {reason}")]
    Unsupported {
        /// JSON path of the field.
        field: &'static str,
        /// Why it is not translated.
        reason: String,
    },
    /// Two fields that must not be set together.
    #[error("cannot simultaneously set {first} and {second}")]
    Conflict {
        /// First field.
        first: &'static str,
        /// Second field.
        second: &'static str,
    },
    /// A topology helper was given no usable zone.
    #[error("there are no valid zones to add to the PV: {0:?}")]
    NoValidZones(Vec<String>),
    /// Zones that do not name exactly one region.
    #[error("cannot derive one region from zones {zones:?}: {reason}")]
    Region {
        /// The zones given.
        zones: Vec<String>,
        /// What was wrong.
        reason: String,
    },
    /// Azure disk URI that does not match the managed or unmanaged disk pattern (upstream text).
    #[error("could not get disk name from {uri}, correct format: {pattern}")]
    AzureDiskName {
        /// The `diskURI` / volume handle.
        uri: String,
        /// The expected pattern.
        pattern: &'static str,
    },
    /// Azure File volume handle with fewer than three `#`-separated parts (upstream text).
    #[error("error parsing volume id: {0:?}, should at least contain two #")]
    AzureFileVolumeId(String),
    /// Azure File secret name that does not embed a storage account (upstream text).
    #[error("could not get account name from {secret}, correct format: {pattern}")]
    AzureStorageAccount {
        /// The secret name.
        secret: String,
        /// The expected pattern.
        pattern: &'static str,
    },
    /// Input for the command-line tool that is not what it should be.
    #[error("{document}: {message}")]
    Input {
        /// Which document, e.g. `document 2 (PersistentVolume "pv-a")`.
        document: String,
        /// What is wrong, naming the field.
        message: String,
    },
    /// Reading a file failed.
    #[error("cannot read {path}: {error}")]
    Io {
        /// The path (or `-` for standard input).
        path: String,
        /// The I/O error (part of the message, so not also a `source`).
        error: std::io::Error,
    },
    /// Writing output failed.
    #[error("cannot write output: {0}")]
    Output(String),
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
