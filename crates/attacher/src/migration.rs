//! In-tree → CSI migration (the migration design, docs/design/migration.md): a VolumeAttachment for
//! our driver may point at an in-tree PV (e.g. `spec.awsElasticBlockStore`) whose plugin migrated
//! to us, or carry an in-tree inline spec. Both are translated with `csi-translation` before
//! publishing, so the driver only ever sees CSI volumes. Also decides the rollback case: an in-tree
//! PV that lost (or never had) the `pv.kubernetes.io/migrated-to: <us>` annotation belongs to the
//! in-tree plugin again, and our finalizer must not hold it.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::Error;
use crate::names::MIGRATED_TO_ANNOTATION;

/// A volume as the driver sees it: CSI source and the spec the capability is built from.
#[derive(Debug, Clone)]
pub(crate) struct CsiVolume {
    /// For messages: `PersistentVolume pv-1` or `VolumeAttachment va-1 inline volume`.
    pub what: String,
    pub spec: PersistentVolumeSpec,
    pub csi: CSIPersistentVolumeSource,
    /// Translated from an in-tree source (labels the operation metrics `migrated="true"`).
    pub migrated: bool,
}

/// The CSI view of `pv`, translating an in-tree source; the driver must be `driver`.
pub(crate) fn pv_volume(pv: &PersistentVolume, driver: &str) -> Result<CsiVolume, Error> {
    let what = format!(
        "PersistentVolume {}",
        pv.metadata.name.as_deref().unwrap_or_default()
    );
    resolve(what, pv, driver)
}

/// The CSI view of a VolumeAttachment's `spec.source.inlineVolumeSpec`: normally already CSI
/// (the attach/detach controller translates inline volumes), else translated here.
pub(crate) fn inline_volume(
    va_name: &str,
    spec: &PersistentVolumeSpec,
    driver: &str,
) -> Result<CsiVolume, Error> {
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(format!("{va_name}-inline")),
            ..Default::default()
        },
        spec: Some(spec.clone()),
        status: None,
    };
    let mut v = resolve(
        format!("VolumeAttachment {va_name} spec.source.inlineVolumeSpec"),
        &pv,
        driver,
    )?;
    // Inline volumes count as migrated, as in the Go sidecar: they only exist for migration.
    v.migrated = true;
    Ok(v)
}

fn resolve(what: String, pv: &PersistentVolume, driver: &str) -> Result<CsiVolume, Error> {
    let spec = pv.spec.clone().unwrap_or_default();
    let (spec, migrated) = if spec.csi.is_some() {
        (spec, false)
    } else if csi_translation::is_pv_migratable(pv) {
        let translated = csi_translation::translate_in_tree_pv_to_csi(pv).map_err(|source| {
            Error::Translation {
                what: what.clone(),
                source,
            }
        })?;
        (translated.spec.unwrap_or_default(), true)
    } else {
        return Err(Error::InvalidVolume {
            what,
            reason: "has no spec.csi and no in-tree source that migrates to CSI".into(),
        });
    };
    let Some(csi) = spec.csi.clone() else {
        return Err(Error::InvalidVolume {
            what,
            reason: "translation gave no spec.csi".into(),
        });
    };
    if csi.driver != driver {
        return Err(Error::InvalidVolume {
            what,
            reason: format!(
                "spec.csi.driver is {:?}, but this attacher handles {driver:?}",
                csi.driver
            ),
        });
    }
    if csi.volume_handle.is_empty() {
        return Err(Error::InvalidVolume {
            what,
            reason: "spec.csi.volumeHandle is empty".into(),
        });
    }
    Ok(CsiVolume {
        what,
        spec,
        csi,
        migrated,
    })
}

/// True for an in-tree PV of a migratable plugin that is not (or no longer) annotated
/// `pv.kubernetes.io/migrated-to: <driver>`: migration was rolled back, the in-tree plugin owns
/// it, and our finalizer must go (once no VolumeAttachment uses it).
pub(crate) fn rolled_back(pv: &PersistentVolume, driver: &str) -> bool {
    if !csi_translation::is_pv_migratable(pv) {
        return false;
    }
    let migrated_to = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIGRATED_TO_ANNOTATION));
    migrated_to.map(String::as_str) != Some(driver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource;

    const EBS: &str = "ebs.csi.aws.com";

    fn ebs_pv(annotation: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv-ebs".into()),
                annotations: annotation.map(|a| {
                    [(MIGRATED_TO_ANNOTATION.to_string(), a.to_string())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "aws://us-east-1a/vol-0123456789abcdef0".into(),
                    fs_type: Some("xfs".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn csi_pv(driver: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv-csi".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: driver.into(),
                    volume_handle: "vol-1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn csi_pvs_pass_through() {
        let v = pv_volume(&csi_pv(EBS), EBS).expect("csi");
        assert!(!v.migrated);
        assert_eq!(v.csi.volume_handle, "vol-1");
        assert_eq!(v.what, "PersistentVolume pv-csi");
    }

    #[test]
    fn in_tree_ebs_pvs_are_translated_for_the_ebs_driver() {
        let v = pv_volume(&ebs_pv(Some(EBS)), EBS).expect("translated");
        assert!(v.migrated);
        assert_eq!(v.csi.driver, EBS);
        assert_eq!(v.csi.volume_handle, "vol-0123456789abcdef0");
        assert_eq!(v.csi.fs_type.as_deref(), Some("xfs"));
    }

    #[test]
    fn a_pv_of_another_driver_is_refused() {
        let e = pv_volume(&csi_pv("other.csi.io"), EBS).expect_err("other driver");
        assert!(e.to_string().contains("other.csi.io"), "{e}");
        let e = pv_volume(&ebs_pv(None), "mock.csi.rs").expect_err("ebs PV for the mock");
        assert!(e.to_string().contains("ebs.csi.aws.com"), "{e}");
    }

    #[test]
    fn a_pv_with_neither_csi_nor_a_migratable_source_is_refused() {
        let mut pv = csi_pv(EBS);
        if let Some(s) = pv.spec.as_mut() {
            s.csi = None;
        }
        let e = pv_volume(&pv, EBS).expect_err("no source");
        assert!(e.to_string().contains("no spec.csi"), "{e}");
    }

    #[test]
    fn inline_specs_are_resolved_and_count_as_migrated() {
        let spec = csi_pv(EBS).spec.unwrap_or_default();
        let v = inline_volume("va-1", &spec, EBS).expect("inline");
        assert!(v.migrated);
        assert_eq!(v.what, "VolumeAttachment va-1 spec.source.inlineVolumeSpec");
        let spec = ebs_pv(None).spec.unwrap_or_default();
        let v = inline_volume("va-2", &spec, EBS).expect("in-tree inline");
        assert_eq!(v.csi.volume_handle, "vol-0123456789abcdef0");
    }

    #[test]
    fn rollback_is_an_in_tree_pv_without_our_migrated_to_annotation() {
        assert!(rolled_back(&ebs_pv(None), EBS));
        assert!(rolled_back(&ebs_pv(Some("other.csi.io")), EBS));
        assert!(!rolled_back(&ebs_pv(Some(EBS)), EBS));
        assert!(
            !rolled_back(&csi_pv(EBS), EBS),
            "CSI PVs are never rolled back"
        );
    }
}
