use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use volume_plugins::SkipAttachMode;

use super::*;

const EBS: &str = "kubernetes.io/aws-ebs";

struct World {
    pvcs: ObjectCache<PersistentVolumeClaim>,
    pvs: ObjectCache<PersistentVolume>,
    csinodes: ObjectCache<CSINode>,
    csi: CsiPlugin,
    migrated: MigratedPlugins,
}

impl World {
    fn new(
        mode: SkipAttachMode,
        drivers: Vec<CSIDriver>,
        csinodes: Vec<CSINode>,
        migrated: bool,
    ) -> Self {
        // The plugin never calls the API here: lookups only.
        component_runtime::install_crypto_provider();
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        let pv = |name: &str, spec: serde_json::Value| -> PersistentVolume {
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
        };
        let pvc = |name: &str, volume: &str, bound: bool| -> PersistentVolumeClaim {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"volumeName": volume},
                "status": {"phase": if bound { "Bound" } else { "Pending" }}
            }))
            .unwrap()
        };
        // Generic ephemeral volumes' claims: pod p's own (uid-p controls it), and a claim of
        // the name p-foreign that pod p does not control.
        let owned = |name: &str, volume: &str, owner_uid: &str| -> PersistentVolumeClaim {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner_uid,
                    "controller": true}]},
                "spec": {"volumeName": volume},
                "status": {"phase": "Bound"}
            }))
            .unwrap()
        };
        Self {
            pvcs: ObjectCache::from_objects([
                pvc("csi-claim", "pv-csi", true),
                pvc("rwx-claim", "pv-rwx", true),
                pvc("pending", "", false),
                pvc("ebs-claim", "pv-ebs", true),
                pvc("gce-claim", "pv-gce", true),
                pvc("thief", "pv-owned", true),
                owned("p-scratch", "pv-eph", "uid-p"),
                owned("p-foreign", "pv-eph", "uid-other"),
            ]),
            pvs: ObjectCache::from_objects([
                pv(
                    "pv-owned",
                    json!({"claimRef": {"namespace": "default", "name": "owner"}, "csi": {"driver": "d.csi", "volumeHandle": "h3"}}),
                ),
                pv(
                    "pv-eph",
                    json!({"accessModes": ["ReadWriteOnce"], "csi": {"driver": "d.csi", "volumeHandle": "h-eph"}}),
                ),
                pv(
                    "pv-csi",
                    json!({"accessModes": ["ReadWriteOnce"], "csi": {"driver": "d.csi", "volumeHandle": "h1"}}),
                ),
                pv(
                    "pv-rwx",
                    json!({"accessModes": ["ReadWriteMany"], "csi": {"driver": "d.csi", "volumeHandle": "h2"}}),
                ),
                pv(
                    "pv-ebs",
                    json!({"accessModes": ["ReadWriteOnce"], "awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-1"}}),
                ),
                pv(
                    "pv-gce",
                    json!({"accessModes": ["ReadWriteOnce"], "gcePersistentDisk": {"pdName": "disk-1"}}),
                ),
            ]),
            csinodes: ObjectCache::from_objects(csinodes),
            csi: CsiPlugin::new(
                client,
                ObjectCache::from_objects(drivers),
                ObjectCache::from_objects(Vec::<VolumeAttachment>::new()),
                mode,
            ),
            migrated: if migrated {
                MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap()
            } else {
                MigratedPlugins::none()
            },
        }
    }

    fn resolve(&self, volume: serde_json::Value) -> SpecOutcome {
        let ctx = SpecContext {
            pvcs: &self.pvcs,
            pvs: &self.pvs,
            csinodes: &self.csinodes,
            csi: &self.csi,
            migrated: &self.migrated,
        };
        let volume: Volume = serde_json::from_value(volume).unwrap();
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                uid: Some("uid-p".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                volumes: Some(vec![volume.clone()]),
                ..Default::default()
            }),
            status: None,
        };
        volume_to_attach(&ctx, &pod, &volume, "node-1")
    }
}

fn claim(name: &str) -> serde_json::Value {
    json!({"name": "data", "persistentVolumeClaim": {"claimName": name}})
}

fn csinode(annotation: Option<&str>) -> CSINode {
    serde_json::from_value(json!({
        "metadata": {"name": "node-1", "annotations": annotation.map(|a| json!({csi_translation::MIGRATED_PLUGINS_ANNOTATION: a}))},
        "spec": {"drivers": []}
    }))
    .unwrap()
}

fn attach(outcome: SpecOutcome) -> VolumeToAttach {
    match outcome {
        SpecOutcome::Attach(v) => v,
        other => panic!("want Attach, got {other:?}"),
    }
}

#[tokio::test]
async fn csi_pvs_by_claim() {
    let w = World::new(SkipAttachMode::BypassAdc, vec![], vec![], false);
    let v = attach(w.resolve(claim("csi-claim")));
    assert_eq!(v.unique_name, "kubernetes.io/csi/d.csi^h1");
    assert_eq!(v.spec_name, "pv-csi");
    assert!(!v.multi_attach && v.attachable && !v.migrated());
    match &v.backend {
        Backend::Csi { volume, .. } => {
            assert_eq!(
                volume.source,
                AttachSource::PersistentVolume("pv-csi".into())
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(attach(w.resolve(claim("rwx-claim"))).multi_attach);
    assert!(matches!(
        w.resolve(claim("pending")),
        SpecOutcome::Pending(_)
    ));
    assert!(matches!(
        w.resolve(claim("no-such-claim")),
        SpecOutcome::Pending(_)
    ));
    let ephemeral = json!({"name": "e", "csi": {"driver": "d.csi"}});
    assert_eq!(w.resolve(ephemeral), SpecOutcome::NotAttachable);
    let config_map = json!({"name": "c", "configMap": {"name": "x"}});
    assert_eq!(w.resolve(config_map), SpecOutcome::NotAttachable);
}

#[tokio::test]
async fn generic_ephemeral_volumes_attach_the_pods_own_claim() {
    let w = World::new(SkipAttachMode::BypassAdc, vec![], vec![], false);
    let eph =
        |name: &str| json!({"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}});
    let v = attach(w.resolve(eph("scratch")));
    assert_eq!(v.unique_name, "kubernetes.io/csi/d.csi^h-eph");
    assert_eq!(v.spec_name, "pv-eph");
    match w.resolve(eph("foreign")) {
        SpecOutcome::Failed { reason, .. } => assert_eq!(
            reason,
            "PVC default/p-foreign was not created for pod default/p (pod is not owner)"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(w.resolve(eph("later")), SpecOutcome::Pending(_)));
}

#[tokio::test]
async fn attach_required_false_in_both_modes() {
    let driver = CSIDriver {
        metadata: ObjectMeta {
            name: Some("d.csi".into()),
            ..Default::default()
        },
        spec: CSIDriverSpec {
            attach_required: Some(false),
            ..Default::default()
        },
    };
    let bypass = World::new(
        SkipAttachMode::BypassAdc,
        vec![driver.clone()],
        vec![],
        false,
    );
    assert!(!attach(bypass.resolve(claim("csi-claim"))).attachable);
    let through = World::new(SkipAttachMode::ThroughAdc, vec![driver], vec![], false);
    assert!(attach(through.resolve(claim("csi-claim"))).attachable);
}

#[tokio::test]
async fn in_tree_ebs_follows_the_migration_decision() {
    // No CSINode: in-tree, named by the spec's volumeID.
    let w = World::new(SkipAttachMode::BypassAdc, vec![], vec![], true);
    let v = attach(w.resolve(claim("ebs-claim")));
    assert_eq!(
        v.unique_name,
        "kubernetes.io/aws-ebs/aws://us-east-1a/vol-1"
    );
    assert_eq!(
        v.backend,
        Backend::AwsEbs {
            volume_id: "aws://us-east-1a/vol-1".into()
        }
    );
    // Both migrated: CSI, the VolumeAttachment points at the PV.
    let w = World::new(
        SkipAttachMode::BypassAdc,
        vec![],
        vec![csinode(Some(EBS))],
        true,
    );
    let v = attach(w.resolve(claim("ebs-claim")));
    assert_eq!(v.unique_name, "kubernetes.io/csi/ebs.csi.aws.com^vol-1");
    assert!(v.migrated());
    match &v.backend {
        Backend::Csi { volume, .. } => {
            assert_eq!(
                volume.source,
                AttachSource::PersistentVolume("pv-ebs".into())
            )
        }
        other => panic!("{other:?}"),
    }
    // Inline, both migrated: the translated spec goes into the VolumeAttachment.
    let inline = json!({"name": "inline", "awsElasticBlockStore": {"volumeID": "vol-2"}});
    let v = attach(w.resolve(inline.clone()));
    assert_eq!(v.unique_name, "kubernetes.io/csi/ebs.csi.aws.com^vol-2");
    assert_eq!(v.spec_name, "inline");
    match &v.backend {
        Backend::Csi { volume, .. } => assert!(matches!(volume.source, AttachSource::Inline(_))),
        other => panic!("{other:?}"),
    }
    // The node migrated, this controller did not: refused, naming the gate.
    let w = World::new(
        SkipAttachMode::BypassAdc,
        vec![],
        vec![csinode(Some(EBS))],
        false,
    );
    match w.resolve(claim("ebs-claim")) {
        SpecOutcome::Failed { volume, reason } => {
            assert_eq!(volume, "pv-ebs");
            assert!(reason.contains("CSIMigrationAWS=true"), "{reason}");
        }
        other => panic!("want refused, got {other:?}"),
    }
    // The annotation lacks the plugin: in-tree, inline too.
    let w = World::new(
        SkipAttachMode::BypassAdc,
        vec![],
        vec![csinode(Some(""))],
        true,
    );
    let v = attach(w.resolve(inline));
    assert_eq!(v.unique_name, "kubernetes.io/aws-ebs/vol-2");
    assert!(!v.multi_attach);
}

#[tokio::test]
async fn other_in_tree_plugins_only_when_migrated() {
    let w = World::new(SkipAttachMode::BypassAdc, vec![], vec![], true);
    assert_eq!(w.resolve(claim("gce-claim")), SpecOutcome::NotAttachable);
    let gates = MigratedPlugins::from_feature_gates("CSIMigrationGCE=true").unwrap();
    let mut w = World::new(
        SkipAttachMode::BypassAdc,
        vec![],
        vec![csinode(Some("kubernetes.io/gce-pd"))],
        false,
    );
    w.migrated = gates;
    let v = attach(w.resolve(claim("gce-claim")));
    assert!(
        v.unique_name
            .starts_with("kubernetes.io/csi/pd.csi.storage.gke.io^"),
        "{}",
        v.unique_name
    );
}

#[tokio::test]
async fn a_claim_naming_a_pv_bound_elsewhere_is_refused() {
    let w = World::new(SkipAttachMode::BypassAdc, vec![], vec![], false);
    match w.resolve(claim("thief")) {
        SpecOutcome::Failed { volume, reason } => {
            assert_eq!(volume, "pv-owned");
            assert!(reason.contains("claimRef"), "{reason}");
        }
        other => panic!("want Failed, got {other:?}"),
    }
}
