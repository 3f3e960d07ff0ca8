#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::aws_ebs::fake_cloud::FakeCloud;
use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};

fn claim(request: &str) -> PersistentVolumeClaim {
    let mut requests = BTreeMap::new();
    requests.insert("storage".to_string(), Quantity(request.to_string()));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("ns1".into()),
            uid: Some("1234".into()),
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(requests),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: Some("ebs".into()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn request<'a>(
    claim: &'a PersistentVolumeClaim,
    parameters: &'a BTreeMap<String, String>,
) -> ProvisionRequest<'a> {
    ProvisionRequest {
        pv_name: "pvc-1234",
        claim,
        storage_class_name: "ebs",
        parameters,
        reclaim_policy: "Delete",
        mount_options: &[],
        cluster_name: "kubernetes",
        selected_node_zone: None,
        allowed_zones: &[],
    }
}

#[test]
fn quantities_round_up_to_bytes_and_gib() {
    for (q, bytes) in [
        ("1Gi", 1u128 << 30),
        ("1.5Gi", 3 << 29),
        ("10G", 10_000_000_000),
        ("1e3", 1000),
        ("500m", 1),
        ("100", 100),
        ("2Ki", 2048),
    ] {
        assert_eq!(quantity_to_bytes(q), Some(bytes), "{q}");
    }
    for bad in ["", "Gi", "1x", "1.2.3Gi", "-1Gi"] {
        assert_eq!(quantity_to_bytes(bad), None, "{bad}");
    }
    assert_eq!(round_up_to_gib(1), 1);
    assert_eq!(round_up_to_gib(1 << 30), 1);
    assert_eq!(round_up_to_gib((1 << 30) + 1), 2);
    assert_eq!(round_up_to_gib(10_000_000_000), 10);
}

#[test]
fn parameters_as_the_in_tree_plugin_read_them() {
    let p = parse_parameters(&BTreeMap::new()).unwrap();
    assert_eq!(
        (p.volume_type.as_str(), p.fs_type.as_str()),
        ("gp2", "ext4")
    );
    let p = parse_parameters(&params(&[
        ("Type", "io1"),
        ("iopsPerGB", "10"),
        ("encrypted", "true"),
        ("kmsKeyId", "arn:key"),
        ("zones", "us-east-1a, us-east-1b"),
        ("fsType", "xfs"),
    ]))
    .unwrap();
    assert_eq!(p.volume_type, "io1");
    assert_eq!(p.iops_per_gb, Some(10));
    assert!(p.encrypted);
    assert_eq!(p.kms_key_id.as_deref(), Some("arn:key"));
    assert_eq!(p.zones, vec!["us-east-1a", "us-east-1b"]);
    assert_eq!(p.fs_type, "xfs");
    let e = parse_parameters(&params(&[("throughput", "125")])).unwrap_err();
    assert!(
        e.to_string().contains("invalid option \"throughput\""),
        "{e}"
    );
    let e = parse_parameters(&params(&[("encrypted", "yes")])).unwrap_err();
    assert!(e.to_string().contains("encrypted"), "{e}");
    let e = parse_parameters(&params(&[("zone", "a"), ("zones", "b")])).unwrap_err();
    assert!(e.to_string().contains("zone and zones"), "{e}");
}

#[test]
fn iops_per_gb_is_clamped_for_io1_only() {
    let mut p = parse_parameters(&params(&[("type", "io1"), ("iopsPerGB", "1")])).unwrap();
    assert_eq!(iops(&p, 10), Some(10));
    p.allow_iops_increase = true;
    assert_eq!(iops(&p, 10), Some(100));
    p.iops_per_gb = Some(1000);
    assert_eq!(iops(&p, 1000), Some(64_000));
    p.volume_type = "gp2".into();
    assert_eq!(iops(&p, 10), None);
}

#[tokio::test]
async fn provisions_the_in_tree_pv_and_is_idempotent() {
    let cloud = FakeCloud::with_instances(&[]);
    let claim = claim("1.5Gi");
    let parameters = params(&[
        ("type", "gp3"),
        ("zone", "us-east-1b"),
        ("encrypted", "true"),
    ]);
    let mount_options = vec!["debug".to_string()];
    let mut req = request(&claim, &parameters);
    req.mount_options = &mount_options;
    let first = provision(cloud.as_ref(), &req).await.unwrap();
    assert!(first.created);
    assert_eq!(first.size_gib, 2);
    assert_eq!(first.zone, "us-east-1b");
    let disk = cloud.volume(&first.volume_id).unwrap();
    assert_eq!(disk.volume_type, "gp3");
    assert!(disk.encrypted);
    assert_eq!(disk.tags[TAG_PVC_NAME], "data");
    assert_eq!(disk.tags[TAG_PVC_NAMESPACE], "ns1");
    assert_eq!(disk.tags[TAG_PV_NAME], "pvc-1234");
    assert_eq!(disk.tags["kubernetes.io/cluster/kubernetes"], "owned");
    assert_eq!(disk.tags[ebs_cloud::VOLUME_NAME_TAG], "pvc-1234");

    let pv = &first.pv;
    let meta = &pv.metadata;
    assert_eq!(meta.name.as_deref(), Some("pvc-1234"));
    let ann = meta.annotations.as_ref().unwrap();
    assert_eq!(ann[ANN_PROVISIONED_BY], "kubernetes.io/aws-ebs");
    assert_eq!(ann[ANN_CREATED_BY], "aws-ebs-dynamic-provisioner");
    let labels = meta.labels.as_ref().unwrap();
    assert_eq!(labels[LABEL_ZONE], "us-east-1b");
    assert_eq!(labels[LABEL_REGION], "us-east-1");
    let spec = pv.spec.as_ref().unwrap();
    let ebs = spec.aws_elastic_block_store.as_ref().unwrap();
    assert_eq!(
        ebs.volume_id,
        format!("aws://us-east-1b/{}", first.volume_id)
    );
    assert_eq!(ebs.fs_type.as_deref(), Some("ext4"));
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "2Gi");
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_string()][..])
    );
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("ebs"));
    assert_eq!(spec.mount_options.as_deref(), Some(&mount_options[..]));
    let claim_ref = spec.claim_ref.as_ref().unwrap();
    assert_eq!(claim_ref.uid.as_deref(), Some("1234"));
    assert_eq!(claim_ref.name.as_deref(), Some("data"));
    let term = &spec
        .node_affinity
        .as_ref()
        .unwrap()
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms[0];
    let expr = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (expr.key.as_str(), expr.operator.as_str()),
        (LABEL_ZONE, "In")
    );
    assert_eq!(
        expr.values.as_deref(),
        Some(&["us-east-1b".to_string()][..])
    );

    // A restart between CreateVolume and the PV's creation: the same volume, no second one.
    let again = provision(cloud.as_ref(), &req).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.volume_id, first.volume_id);
    assert_eq!(cloud.volume_ids().len(), 1);
    assert_eq!(cloud.calls("CreateVolume"), 1);

    // The deleter: gone once, then already gone.
    assert!(delete(cloud.as_ref(), pv).await.unwrap());
    assert!(!delete(cloud.as_ref(), pv).await.unwrap());
    assert!(cloud.volume_ids().is_empty());
}

#[tokio::test]
async fn zone_follows_the_selected_node_or_a_stable_hash() {
    let cloud = FakeCloud::with_instances(&[]);
    let claim = claim("1Gi");
    let parameters = params(&[("zones", "us-east-1a,us-east-1c")]);
    let mut req = request(&claim, &parameters);
    req.selected_node_zone = Some("us-east-1c");
    let p = provision(cloud.as_ref(), &req).await.unwrap();
    assert_eq!(p.zone, "us-east-1c");
    let p = parse_parameters(&parameters).unwrap();
    let mut req = request(&claim, &parameters);
    req.pv_name = "pvc-other";
    let a = choose_zone(cloud.as_ref(), &p, &req).await.unwrap();
    let b = choose_zone(cloud.as_ref(), &p, &req).await.unwrap();
    assert_eq!(a, b);
    assert!(a == "us-east-1a" || a == "us-east-1c", "{a}");
}

#[tokio::test]
async fn refusals_name_the_reason() {
    let cloud = FakeCloud::with_instances(&[]);
    let mut c = claim("1Gi");
    let parameters = params(&[("bogus", "1")]);
    let e = provision(cloud.as_ref(), &request(&c, &parameters))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("invalid option \"bogus\""), "{e}");
    let empty = BTreeMap::new();
    c.spec.as_mut().unwrap().selector = Some(Default::default());
    let e = provision(cloud.as_ref(), &request(&c, &empty))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Selector is not supported"), "{e}");
    assert_eq!(cloud.calls("CreateVolume"), 0);
    cloud.fail(
        "CreateVolume",
        ebs_cloud::CloudError::other("CreateVolume", "Unavailable", "try later"),
    );
    let e = provision(cloud.as_ref(), &request(&claim("1Gi"), &empty))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("try later"), "{e}");
    let pv = PersistentVolume::default();
    let e = delete(cloud.as_ref(), &pv).await.unwrap_err();
    assert!(e.to_string().contains("awsElasticBlockStore"), "{e}");
}
