use super::*;
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, CSIVolumeSource,
    ConfigMapVolumeSource, ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    PersistentVolumeClaimVolumeSource, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn pod(volumes: Vec<Volume>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            uid: Some("uid-1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            volumes: Some(volumes),
            ..Default::default()
        }),
        status: None,
    }
}

fn claim_volume(claim: &str, read_only: bool) -> Volume {
    Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: Some(read_only),
        }),
        ..Default::default()
    }
}

fn pvc(name: &str, pv: Option<&str>, bound: bool) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("{name}-uid")),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: pv.map(str::to_string),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some(if bound { "Bound" } else { "Pending" }.into()),
            ..Default::default()
        }),
    }
}

fn pv(name: &str, claim: &str, spec: PersistentVolumeSpec) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            claim_ref: Some(ObjectReference {
                name: Some(claim.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("{claim}-uid")),
                ..Default::default()
            }),
            ..spec
        }),
        status: None,
    }
}

fn csi_pv_spec(block: bool) -> PersistentVolumeSpec {
    PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        mount_options: Some(vec!["noatime".into()]),
        volume_mode: Some(if block { "Block" } else { "Filesystem" }.into()),
        csi: Some(CSIPersistentVolumeSource {
            driver: "hostpath.csi.k8s.io".into(),
            volume_handle: "vol-1".into(),
            fs_type: Some("ext4".into()),
            volume_attributes: Some([("k".to_string(), "v".to_string())].into()),
            node_stage_secret_ref: Some(SecretReference {
                name: Some("s".into()),
                namespace: Some("secrets".into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ebs_pv_spec() -> PersistentVolumeSpec {
    PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
            volume_id: "aws://us-east-1a/vol-0123456789abcdef0".into(),
            fs_type: Some("ext4".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn resolve(
    pvcs: Vec<PersistentVolumeClaim>,
    pvs: Vec<PersistentVolume>,
    migrated: &MigratedPlugins,
    volume: Volume,
) -> SpecOutcome {
    let pvcs = ObjectCache::from_objects(pvcs);
    let pvs = ObjectCache::from_objects(pvs);
    let csidrivers = ObjectCache::from_objects([hostpath_csidriver()]);
    let ctx = SpecContext {
        pvcs: &pvcs,
        pvs: &pvs,
        csidrivers: &csidrivers,
        migrated,
        first_seen: None,
    };
    let p = pod(vec![volume.clone()]);
    volume_to_mount(&ctx, &p, &volume)
}

fn mount(outcome: SpecOutcome) -> VolumeToMount {
    match outcome {
        SpecOutcome::Mount(v) => *v,
        other => panic!("expected a mount, got {other:?}"),
    }
}

#[test]
fn a_bound_csi_pv_is_mounted_with_everything_nodestage_needs() {
    let v = mount(resolve(
        vec![pvc("c", Some("pv-1"), true)],
        vec![pv("pv-1", "c", csi_pv_spec(false))],
        &MigratedPlugins::none(),
        claim_volume("c", true),
    ));
    assert_eq!(v.unique_name, "kubernetes.io/csi/hostpath.csi.k8s.io^vol-1");
    assert_eq!(
        (v.spec_name.as_str(), v.outer_name.as_str()),
        ("pv-1", "data")
    );
    assert!(v.read_only, "the claim's readOnly counts");
    let c = v.csi().unwrap();
    assert_eq!(c.fs_type, "ext4");
    assert_eq!(c.mount_options, vec!["noatime"]);
    assert_eq!(c.access_mode, AccessMode::SingleNodeWriter);
    assert!(!c.block && !c.ephemeral && !c.migrated);
    assert_eq!(
        c.stage_secret,
        Some(SecretRef {
            namespace: "secrets".into(),
            name: "s".into()
        })
    );
    assert_eq!(c.volume_context.get("k").map(String::as_str), Some("v"));

    let v = mount(resolve(
        vec![pvc("c", Some("pv-1"), true)],
        vec![pv("pv-1", "c", csi_pv_spec(true))],
        &MigratedPlugins::none(),
        claim_volume("c", false),
    ));
    assert!(v.csi().unwrap().block && !v.read_only);
}

#[test]
fn unbound_or_missing_claims_wait_and_a_foreign_pv_is_refused() {
    let out = resolve(
        vec![],
        vec![],
        &MigratedPlugins::none(),
        claim_volume("c", false),
    );
    assert!(
        matches!(&out, SpecOutcome::Pending(m) if m.contains("PVC ns/c not found")),
        "{out:?}"
    );
    let out = resolve(
        vec![pvc("c", None, false)],
        vec![],
        &MigratedPlugins::none(),
        claim_volume("c", false),
    );
    assert!(
        matches!(&out, SpecOutcome::Pending(m) if m.contains("not bound")),
        "{out:?}"
    );
    let out = resolve(
        vec![pvc("c", Some("pv-1"), true)],
        vec![pv("pv-1", "other", csi_pv_spec(false))],
        &MigratedPlugins::none(),
        claim_volume("c", false),
    );
    assert!(
        matches!(&out, SpecOutcome::Failed(m) if m.contains("claimRef")),
        "{out:?}"
    );
}

#[test]
fn in_tree_ebs_follows_this_nodes_migration_gate() {
    let pvcs = || vec![pvc("c", Some("pv-ebs"), true)];
    let pvs = || vec![pv("pv-ebs", "c", ebs_pv_spec())];
    let in_tree = mount(resolve(
        pvcs(),
        pvs(),
        &MigratedPlugins::none(),
        claim_volume("c", false),
    ));
    assert_eq!(
        in_tree.unique_name,
        "kubernetes.io/aws-ebs/aws://us-east-1a/vol-0123456789abcdef0"
    );
    assert!(matches!(in_tree.kind, MountKind::AwsEbs { .. }));

    let aws = MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap();
    let migrated = mount(resolve(pvcs(), pvs(), &aws, claim_volume("c", false)));
    let c = migrated.csi().unwrap();
    assert_eq!(c.driver, "ebs.csi.aws.com");
    assert_eq!(c.handle, "vol-0123456789abcdef0");
    assert!(c.migrated);
    assert_eq!(
        migrated.unique_name,
        "kubernetes.io/csi/ebs.csi.aws.com^vol-0123456789abcdef0"
    );

    let inline = Volume {
        name: "inline".into(),
        aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
            volume_id: "vol-0123456789abcdef0".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let v = mount(resolve(vec![], vec![], &aws, inline.clone()));
    assert_eq!(v.spec_name, "inline");
    assert!(v.csi().unwrap().migrated);
    let v = mount(resolve(vec![], vec![], &MigratedPlugins::none(), inline));
    assert_eq!(v.unique_name, "kubernetes.io/aws-ebs/vol-0123456789abcdef0");
}

#[test]
fn ephemeral_inline_volumes_get_the_kubelets_handle_and_other_volumes_are_not_ours() {
    let eph = Volume {
        name: "scratch".into(),
        csi: Some(CSIVolumeSource {
            driver: "hostpath.csi.k8s.io".into(),
            volume_attributes: Some([("size".to_string(), "1Mi".to_string())].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let v = mount(resolve(vec![], vec![], &MigratedPlugins::none(), eph));
    let c = v.csi().unwrap();
    assert!(c.ephemeral);
    assert_eq!(c.handle, ephemeral_volume_handle("uid-1", "scratch"));
    assert!(c.handle.starts_with("csi-") && c.handle.len() == 4 + 64);
    // The ephemeral flag goes with the pod's info at publish, not in the volume's context.
    assert_eq!(c.volume_context.get(EPHEMERAL_CONTEXT_KEY), None);
    assert_eq!(
        c.volume_context.get("size").map(String::as_str),
        Some("1Mi")
    );

    let cm = Volume {
        name: "cm".into(),
        config_map: Some(ConfigMapVolumeSource::default()),
        ..Default::default()
    };
    assert_eq!(
        resolve(vec![], vec![], &MigratedPlugins::none(), cm),
        SpecOutcome::NotOurs
    );
}

fn hostpath_csidriver() -> CSIDriver {
    CSIDriver {
        metadata: ObjectMeta {
            name: Some("hostpath.csi.k8s.io".into()),
            ..Default::default()
        },
        spec: k8s_openapi::api::storage::v1::CSIDriverSpec {
            volume_lifecycle_modes: Some(vec!["Persistent".into(), "Ephemeral".into()]),
            ..Default::default()
        },
    }
}

#[test]
fn inline_volumes_only_for_drivers_that_list_ephemeral() {
    let inline = |driver: &str| Volume {
        name: "scratch".into(),
        csi: Some(CSIVolumeSource {
            driver: driver.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    // No CSIDriver: Persistent only.
    match resolve(
        vec![],
        vec![],
        &MigratedPlugins::none(),
        inline("other.csi.example"),
    ) {
        SpecOutcome::Failed(why) => assert_eq!(
            why,
            "volume mode \"Ephemeral\" not supported by driver other.csi.example (only supports [\"Persistent\"])"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        resolve(
            vec![],
            vec![],
            &MigratedPlugins::none(),
            inline("hostpath.csi.k8s.io")
        ),
        SpecOutcome::Mount(_)
    ));
}

fn ephemeral_volume() -> Volume {
    Volume {
        name: "scratch".into(),
        ephemeral: Some(k8s_openapi::api::core::v1::EphemeralVolumeSource::default()),
        ..Default::default()
    }
}

fn owned_by(
    mut claim: PersistentVolumeClaim,
    uid: &str,
    controller: bool,
) -> PersistentVolumeClaim {
    claim.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "p".into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        },
    ]);
    claim
}

#[test]
fn a_generic_ephemeral_volume_is_the_claim_made_for_the_pod() {
    let none = MigratedPlugins::none();
    // The claim is not there yet: pending, naming it.
    match resolve(vec![], vec![], &none, ephemeral_volume()) {
        SpecOutcome::Pending(why) => assert!(why.contains("PVC ns/p-scratch"), "{why}"),
        other => panic!("{other:?}"),
    }
    let pv1 = pv("pv-1", "p-scratch", csi_pv_spec(false));
    // A claim of that name the pod does not control is never mounted.
    for claim in [
        pvc("p-scratch", Some("pv-1"), true),
        owned_by(pvc("p-scratch", Some("pv-1"), true), "uid-1", false),
        owned_by(pvc("p-scratch", Some("pv-1"), true), "another-pod", true),
    ] {
        match resolve(vec![claim], vec![pv1.clone()], &none, ephemeral_volume()) {
            SpecOutcome::Failed(why) => assert_eq!(
                why,
                "PVC ns/p-scratch was not created for pod ns/p (pod is not owner)"
            ),
            other => panic!("{other:?}"),
        }
    }
    let ours = owned_by(pvc("p-scratch", Some("pv-1"), true), "uid-1", true);
    let v = mount(resolve(vec![ours], vec![pv1], &none, ephemeral_volume()));
    assert_eq!(v.spec_name, "pv-1");
    assert_eq!(v.outer_name, "scratch");
    assert!(
        !v.csi().unwrap().ephemeral,
        "a generic ephemeral volume is a persistent one"
    );
}

#[test]
fn a_claim_being_deleted_is_kept_where_mounted_and_not_mounted_anew() {
    let mut claim = pvc("c", Some("pv-1"), true);
    claim.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    match resolve(
        vec![claim],
        vec![pv("pv-1", "c", csi_pv_spec(false))],
        &MigratedPlugins::none(),
        claim_volume("c", false),
    ) {
        SpecOutcome::KeepOnly(v, why) => {
            assert_eq!(v.spec_name, "pv-1");
            assert_eq!(why, "can't start pod because PVC ns/c is being deleted");
        }
        other => panic!("{other:?}"),
    }
}
