//! PVC + StorageClass → CreateVolumeRequest (without secrets, topology and content source,
//! which need API reads: the controller adds them).

use std::collections::{BTreeMap, HashMap};

use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::Error;
use crate::secrets::PARAMETER_PREFIX;

/// The class parameter naming the filesystem.
pub const FSTYPE_PARAMETER: &str = "csi.storage.k8s.io/fstype";
/// Extra metadata keys (`--extra-create-metadata`).
pub const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// `<prefix>-<uid>`, the UID cut to `uuid_length` characters when given.
pub fn volume_name(prefix: &str, uid: &str, uuid_length: Option<usize>) -> String {
    let uid = match uuid_length {
        Some(n) if n < uid.len() => &uid[..n],
        _ => uid,
    };
    format!("{prefix}-{uid}")
}

/// The claim's volume mode is Block.
pub fn is_block(pvc: &PersistentVolumeClaim) -> bool {
    pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

/// The claim's access modes (Kubernetes names).
pub fn access_modes(pvc: &PersistentVolumeClaim) -> Vec<String> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default()
}

/// The filesystem of a mount volume: the class's parameter, else `--default-fstype`.
pub fn fs_type(class_params: &BTreeMap<String, String>, default_fstype: &str) -> String {
    class_params
        .get(FSTYPE_PARAMETER)
        .cloned()
        .unwrap_or_else(|| default_fstype.to_string())
}

/// Kubernetes access mode → CSI access mode.
pub fn csi_mode(mode: &str) -> Result<Mode, Error> {
    match mode {
        "ReadWriteOnce" => Ok(Mode::SingleNodeWriter),
        "ReadOnlyMany" => Ok(Mode::MultiNodeReaderOnly),
        "ReadWriteMany" => Ok(Mode::MultiNodeMultiWriter),
        "ReadWriteOncePod" => Ok(Mode::SingleNodeSingleWriter),
        other => Err(Error::InvalidClaim(format!(
            "spec.accessModes: unknown access mode {other:?}"
        ))),
    }
}

/// `(required_bytes, limit_bytes)` from `spec.resources.requests/limits.storage`.
pub fn capacity(pvc: &PersistentVolumeClaim) -> Result<(i64, i64), Error> {
    let resources = pvc.spec.as_ref().and_then(|s| s.resources.as_ref());
    let bytes = |map: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
                 field: &str| {
        map.and_then(|m| m.get("storage"))
            .map(|q| {
                crate::quantity::to_bytes(&q.0).map_err(|e| {
                    Error::InvalidClaim(format!("spec.resources.{field}.storage: {e}"))
                })
            })
            .transpose()
    };
    let required =
        bytes(resources.and_then(|r| r.requests.as_ref()), "requests")?.ok_or_else(|| {
            Error::InvalidClaim(
                "spec.resources.requests.storage: required for dynamic provisioning".into(),
            )
        })?;
    let limit = bytes(resources.and_then(|r| r.limits.as_ref()), "limits")?.unwrap_or(0);
    if limit > 0 && limit < required {
        return Err(Error::InvalidClaim(format!(
            "spec.resources.limits.storage ({limit} bytes) is smaller than the request ({required} bytes)"
        )));
    }
    Ok((required, limit))
}

/// What [`build`] needs besides the claim and class.
#[derive(Debug, Clone)]
pub struct Settings<'a> {
    pub volume_name: &'a str,
    pub default_fstype: &'a str,
    pub extra_create_metadata: bool,
}

/// The request for `pvc` of `class` (a migrated class already translated to CSI).
pub fn build(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    s: &Settings<'_>,
) -> Result<CreateVolumeRequest, Error> {
    let class_params = class.parameters.clone().unwrap_or_default();
    let selector = pvc.spec.as_ref().and_then(|s| s.selector.as_ref());
    if selector.is_some_and(|l| {
        l.match_labels.as_ref().is_some_and(|m| !m.is_empty())
            || l.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
    }) {
        // A selector picks among existing PVs; a new volume cannot honour it (as in Go).
        return Err(Error::InvalidClaim(
            "claim Selector is not supported".into(),
        ));
    }
    let modes = access_modes(pvc);
    if modes.is_empty() {
        return Err(Error::InvalidClaim(
            "spec.accessModes: at least one access mode is required".into(),
        ));
    }
    if modes.iter().any(|m| m == "ReadWriteOncePod") && modes.len() > 1 {
        return Err(Error::InvalidClaim(
            "spec.accessModes: ReadWriteOncePod cannot be combined with other access modes".into(),
        ));
    }
    let block = is_block(pvc);
    let fs = fs_type(&class_params, s.default_fstype);
    let mount_flags = class.mount_options.clone().unwrap_or_default();
    let volume_capabilities = modes
        .iter()
        .map(|m| {
            let mode = csi_mode(m)?;
            Ok(if block {
                VolumeCapability::block(mode)
            } else {
                VolumeCapability::mount(fs.clone(), mount_flags.clone(), mode)
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let (required_bytes, limit_bytes) = capacity(pvc)?;
    let mut parameters: HashMap<String, String> = class_params
        .into_iter()
        .filter(|(k, _)| !k.starts_with(PARAMETER_PREFIX))
        .collect();
    if s.extra_create_metadata {
        parameters.insert(
            PVC_NAME_KEY.into(),
            pvc.metadata.name.clone().unwrap_or_default(),
        );
        parameters.insert(
            PVC_NAMESPACE_KEY.into(),
            pvc.metadata.namespace.clone().unwrap_or_default(),
        );
        parameters.insert(PV_NAME_KEY.into(), s.volume_name.to_string());
    }
    Ok(CreateVolumeRequest {
        name: s.volume_name.to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes,
            limit_bytes,
        }),
        volume_capabilities,
        parameters,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use csi_spec::v1::volume_capability::AccessType;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pvc(modes: &[&str], block: bool) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| (*m).into()).collect()),
                volume_mode: block.then(|| "Block".into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity("2Gi".into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn class() -> StorageClass {
        StorageClass {
            provisioner: "d".into(),
            parameters: Some(
                [
                    ("type", "gp3"),
                    (FSTYPE_PARAMETER, "xfs"),
                    ("csi.storage.k8s.io/provisioner-secret-name", "s"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            mount_options: Some(vec!["noatime".into()]),
            ..Default::default()
        }
    }

    #[test]
    fn names_are_prefix_and_uid() {
        assert_eq!(volume_name("pvc", "1234-5678", None), "pvc-1234-5678");
        assert_eq!(volume_name("vol", "1234-5678", Some(4)), "vol-1234");
        assert_eq!(volume_name("vol", "12", Some(4)), "vol-12");
    }

    #[test]
    fn request_carries_capacity_modes_fs_and_clean_parameters() {
        let s = Settings {
            volume_name: "pvc-1",
            default_fstype: "ext4",
            extra_create_metadata: true,
        };
        let r = build(
            &pvc(&["ReadWriteOnce", "ReadOnlyMany"], false),
            &class(),
            &s,
        )
        .unwrap();
        assert_eq!(r.name, "pvc-1");
        assert_eq!(r.capacity_range.unwrap().required_bytes, 2 << 30);
        let modes: Vec<_> = r
            .volume_capabilities
            .iter()
            .map(|c| c.mode().unwrap())
            .collect();
        assert_eq!(
            modes,
            vec![Mode::SingleNodeWriter, Mode::MultiNodeReaderOnly]
        );
        match &r.volume_capabilities[0].access_type {
            Some(AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "xfs");
                assert_eq!(m.mount_flags, vec!["noatime".to_string()]);
            }
            other => panic!("{other:?}"),
        }
        let expected: HashMap<String, String> = [
            ("type", "gp3"),
            (PVC_NAME_KEY, "data"),
            (PVC_NAMESPACE_KEY, "ns"),
            (PV_NAME_KEY, "pvc-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(r.parameters, expected);
        let block = build(&pvc(&["ReadWriteOncePod"], true), &class(), &s).unwrap();
        assert!(block.volume_capabilities[0].is_block());
        assert_eq!(
            block.volume_capabilities[0].mode(),
            Some(Mode::SingleNodeSingleWriter)
        );
    }

    #[test]
    fn bad_claims_are_refused_naming_the_field() {
        let s = Settings {
            volume_name: "v",
            default_fstype: "",
            extra_create_metadata: false,
        };
        let e = build(
            &pvc(&["ReadWriteOncePod", "ReadWriteOnce"], false),
            &class(),
            &s,
        )
        .unwrap_err();
        assert!(e.to_string().contains("spec.accessModes"), "{e}");
        let mut p = pvc(&["ReadWriteOnce"], false);
        p.spec.as_mut().unwrap().resources = None;
        let e = build(&p, &class(), &s).unwrap_err();
        assert!(
            e.to_string().contains("spec.resources.requests.storage"),
            "{e}"
        );
        let mut p = pvc(&["ReadWriteOnce"], false);
        p.spec.as_mut().unwrap().selector = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("a".to_string(), "b".to_string())].into()),
                ..Default::default()
            },
        );
        let e = build(&p, &class(), &s).unwrap_err();
        assert_eq!(e.to_string(), "claim Selector is not supported");
    }
}
