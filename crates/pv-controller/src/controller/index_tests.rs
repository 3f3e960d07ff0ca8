#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use serde_json::json;

fn pv(v: serde_json::Value) -> Arc<PersistentVolume> {
    Arc::new(serde_json::from_value(v).unwrap())
}

/// An Available volume: name, size, modes, class.
fn avail(name: &str, size: &str, modes: &[&str], class: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "labels": {"tier": "gold"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": modes,
            "storageClassName": class,
            "hostPath": {"path": "/x"}
        },
        "status": {"phase": "Available"}
    })
}

fn claim(size: &str, modes: &[&str], class: Option<&str>) -> PersistentVolumeClaim {
    let mut spec = json!({
        "accessModes": modes,
        "resources": {"requests": {"storage": size}}
    });
    if let Some(c) = class {
        spec["storageClassName"] = json!(c);
    }
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": spec
    }))
    .unwrap()
}

fn best(
    claim: &PersistentVolumeClaim,
    volumes: &[Arc<PersistentVolume>],
    node: Option<&NodeInfo>,
    delay: bool,
) -> Option<String> {
    find_best_match_for_claim(claim, volumes, node, delay)
        .unwrap()
        .and_then(|v| v.metadata.name.clone())
}

#[test]
fn matching_table() {
    let rwo = ["ReadWriteOnce"];
    let rwx = ["ReadWriteMany"];
    let both = ["ReadWriteOnce", "ReadWriteMany"];
    let mut block = avail("block", "1Gi", &rwo, "");
    block["spec"]["volumeMode"] = json!("Block");
    let mut deleting = avail("deleting", "1Gi", &rwo, "");
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let mut taken = avail("taken", "1Gi", &rwo, "");
    taken["spec"]["claimRef"] = json!({"namespace": "ns", "name": "other", "uid": "u2"});
    let mut released = avail("released", "1Gi", &rwo, "");
    released["status"]["phase"] = json!("Released");

    struct Case {
        what: &'static str,
        claim: PersistentVolumeClaim,
        volumes: Vec<serde_json::Value>,
        want: Option<&'static str>,
    }
    let cases = vec![
        Case {
            what: "smallest that is big enough wins",
            claim: claim("1Gi", &rwo, None),
            volumes: vec![
                avail("big", "10Gi", &rwo, ""),
                avail("small", "512Mi", &rwo, ""),
                avail("fit", "2Gi", &rwo, ""),
            ],
            want: Some("fit"),
        },
        Case {
            what: "capacity below the request never matches",
            claim: claim("5Gi", &rwo, None),
            volumes: vec![avail("small", "4Gi", &rwo, "")],
            want: None,
        },
        Case {
            what: "class must be equal; nil class only takes class-less volumes",
            claim: claim("1Gi", &rwo, None),
            volumes: vec![avail("gold", "1Gi", &rwo, "gold")],
            want: None,
        },
        Case {
            what: "class gold takes a gold volume",
            claim: claim("1Gi", &rwo, Some("gold")),
            volumes: vec![
                avail("none", "1Gi", &rwo, ""),
                avail("gold", "5Gi", &rwo, "gold"),
            ],
            want: Some("gold"),
        },
        Case {
            what: "access modes must include all of the claim's",
            claim: claim("1Gi", &both, None),
            volumes: vec![avail("rwo", "1Gi", &rwo, ""), avail("rwx", "1Gi", &rwx, "")],
            want: None,
        },
        Case {
            what: "the fewest-modes group wins over a smaller volume with more modes",
            claim: claim("1Gi", &rwo, None),
            volumes: vec![
                avail("both", "1Gi", &both, ""),
                avail("rwo", "5Gi", &rwo, ""),
            ],
            want: Some("rwo"),
        },
        Case {
            what: "volumeMode must be equal (unset is Filesystem)",
            claim: claim("1Gi", &rwo, None),
            volumes: vec![block.clone()],
            want: None,
        },
        Case {
            what: "deleted, taken and released volumes are no candidates",
            claim: claim("1Gi", &rwo, None),
            volumes: vec![deleting, taken, released],
            want: None,
        },
    ];
    for c in cases {
        let volumes: Vec<_> = c.volumes.into_iter().map(pv).collect();
        assert_eq!(
            best(&c.claim, &volumes, None, false).as_deref(),
            c.want,
            "{}",
            c.what
        );
    }
}

#[test]
fn block_claims_take_block_volumes() {
    let mut c = claim("1Gi", &["ReadWriteOnce"], None);
    c.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let mut block = avail("block", "1Gi", &["ReadWriteOnce"], "");
    block["spec"]["volumeMode"] = json!("Block");
    let volumes = vec![pv(avail("fs", "1Gi", &["ReadWriteOnce"], "")), pv(block)];
    assert_eq!(best(&c, &volumes, None, false).as_deref(), Some("block"));
}

#[test]
fn selectors_match_labels_and_expressions() {
    let mut c = claim("1Gi", &["ReadWriteOnce"], None);
    let mut silver = avail("silver", "1Gi", &["ReadWriteOnce"], "");
    silver["metadata"]["labels"] = json!({"tier": "silver"});
    let volumes = vec![pv(avail("gold", "2Gi", &["ReadWriteOnce"], "")), pv(silver)];
    c.spec.as_mut().unwrap().selector =
        Some(serde_json::from_value(json!({"matchLabels": {"tier": "gold"}})).unwrap());
    assert_eq!(best(&c, &volumes, None, false).as_deref(), Some("gold"));
    c.spec.as_mut().unwrap().selector = Some(
        serde_json::from_value(json!({"matchExpressions": [
            {"key": "tier", "operator": "NotIn", "values": ["gold"]}
        ]}))
        .unwrap(),
    );
    assert_eq!(best(&c, &volumes, None, false).as_deref(), Some("silver"));
    c.spec.as_mut().unwrap().selector = Some(
        serde_json::from_value(json!({"matchExpressions": [
            {"key": "zone", "operator": "Exists"}
        ]}))
        .unwrap(),
    );
    assert_eq!(best(&c, &volumes, None, false), None);
    c.spec.as_mut().unwrap().selector = Some(
        serde_json::from_value(json!({"matchExpressions": [
            {"key": "tier", "operator": "Near", "values": ["x"]}
        ]}))
        .unwrap(),
    );
    let e = find_best_match_for_claim(&c, &volumes, None, false).unwrap_err();
    assert!(e.contains("Near"), "{e}");
}

#[test]
fn pre_bound_volumes_win_whatever_their_class_and_phase_when_big_enough() {
    let c = claim("1Gi", &["ReadWriteOnce"], None);
    let mut pre = avail("pre", "100Gi", &["ReadWriteOnce"], "other-class");
    pre["spec"]["claimRef"] = json!({"namespace": "ns", "name": "c"});
    pre["status"]["phase"] = json!("Pending");
    let volumes = vec![
        pv(avail("fit", "1Gi", &["ReadWriteOnce"], "")),
        pv(pre.clone()),
    ];
    assert_eq!(best(&c, &volumes, None, false).as_deref(), Some("pre"));
    // A ref with another uid is another claim of the same name.
    pre["spec"]["claimRef"]["uid"] = json!("someone-else");
    let volumes = vec![pv(avail("fit", "1Gi", &["ReadWriteOnce"], "")), pv(pre)];
    assert_eq!(best(&c, &volumes, None, false).as_deref(), Some("fit"));
}

#[test]
fn a_pre_bound_volume_that_cannot_serve_its_claim_does_not_win() {
    let c = claim("1Gi", &["ReadWriteOnce"], None);
    let pre = |name: &str, size: &str, modes: &[&str]| {
        let mut v = avail(name, size, modes, "");
        v["spec"]["claimRef"] = json!({"namespace": "ns", "name": "c"});
        v
    };
    let fit = || pv(avail("fit", "1Gi", &["ReadWriteOnce"], ""));
    // Too small: the claim gets another volume, or none.
    let small = pv(pre("small", "512Mi", &["ReadWriteOnce"]));
    assert_eq!(best(&c, std::slice::from_ref(&small), None, false), None);
    assert_eq!(
        best(&c, &[small, fit()], None, false).as_deref(),
        Some("fit")
    );
    // Of the other volume mode.
    let mut block = pre("block", "1Gi", &["ReadWriteOnce"]);
    block["spec"]["volumeMode"] = json!("Block");
    assert_eq!(best(&c, &[pv(block)], None, false), None);
    // Being deleted.
    let mut dying = pre("dying", "1Gi", &["ReadWriteOnce"]);
    dying["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    assert_eq!(best(&c, &[pv(dying)], None, false), None);
    // Without the claim's access mode.
    let rox = pv(pre("rox", "1Gi", &["ReadOnlyMany"]));
    assert_eq!(best(&c, &[rox], None, false), None);
    // Exactly big enough: wins.
    let exact = pv(pre("exact", "1024Mi", &["ReadWriteOnce"]));
    assert_eq!(best(&c, &[exact], None, false).as_deref(), Some("exact"));
}

#[test]
fn delayed_binding_and_node_affinity() {
    let c = claim("1Gi", &["ReadWriteOnce"], None);
    let mut a = avail("zone-a", "1Gi", &["ReadWriteOnce"], "");
    a["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
    ]}});
    let mut b = avail("node-b", "2Gi", &["ReadWriteOnce"], "");
    b["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}
    ]}});
    let volumes = vec![pv(a), pv(b)];
    // WaitForFirstConsumer without a node: nothing.
    assert_eq!(best(&c, &volumes, None, true), None);
    let node_a = NodeInfo {
        name: "node-a".into(),
        labels: BTreeMap::from([("topology.kubernetes.io/zone".into(), "a".into())]),
    };
    assert_eq!(
        best(&c, &volumes, Some(&node_a), true).as_deref(),
        Some("zone-a")
    );
    let node_b = NodeInfo {
        name: "node-b".into(),
        labels: BTreeMap::from([("topology.kubernetes.io/zone".into(), "b".into())]),
    };
    assert_eq!(
        best(&c, &volumes, Some(&node_b), true).as_deref(),
        Some("node-b")
    );
    let node_c = NodeInfo {
        name: "node-c".into(),
        labels: BTreeMap::new(),
    };
    assert_eq!(best(&c, &volumes, Some(&node_c), true), None);
}

#[test]
fn a_pre_bound_volume_is_bound_whatever_the_selected_node_s_labels() {
    let c = claim("1Gi", &["ReadWriteOnce"], None);
    let mut pre = avail("provisioned", "1Gi", &["ReadWriteOnce"], "");
    pre["spec"]["claimRef"] = json!({"namespace": "ns", "name": "c"});
    pre["status"]["phase"] = json!("Pending");
    pre["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.hostpath.csi/node", "operator": "In", "values": ["n1"]}]}
    ]}});
    // The node's labels have not caught up (no topology label yet): kcm binds anyway.
    let unlabelled = NodeInfo {
        name: "n1".into(),
        labels: BTreeMap::new(),
    };
    let volumes = vec![pv(pre)];
    assert_eq!(
        best(&c, &volumes, Some(&unlabelled), true).as_deref(),
        Some("provisioned")
    );
    assert_eq!(
        best(&c, &volumes, None, true).as_deref(),
        Some("provisioned")
    );
}

#[test]
fn class_is_read_from_the_beta_annotation_first() {
    let mut c = claim("1Gi", &["ReadWriteOnce"], Some("spec-class"));
    assert_eq!(claim_class(&c), "spec-class");
    c.metadata.annotations = Some(BTreeMap::from([(
        ANN_BETA_STORAGE_CLASS.to_string(),
        "beta".to_string(),
    )]));
    assert_eq!(claim_class(&c), "beta");
    let bad = claim("lots", &["ReadWriteOnce"], None);
    assert!(find_best_match_for_claim(&bad, &[], None, false).is_err());
}
