//! Provisioning: the CreateVolume request and the PV, field by field (mock), and the real
//! hostpath driver for Immediate, WaitForFirstConsumer and raw block claims.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::*;
use csi_mock::Method;
use csi_spec::v1::volume_capability::AccessType;
use csi_spec::v1::volume_capability::access_mode::Mode;
use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};

const MOCK: &str = "mock.csi.rs";
const ZONE: &str = "topology.mock.csi.rs/zone";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_claim_gets_the_request_and_the_pv_field_by_field() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_node("node-a", MOCK, &[(ZONE, "zone-a")], &[ZONE])
        .await;
    let mut sc = class(
        "fast",
        MOCK,
        &[
            ("type", "gp3"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("csi.storage.k8s.io/something-else", "dropped"),
        ],
    );
    sc.mount_options = Some(vec!["noatime".into()]);
    sc.reclaim_policy = Some("Delete".into());
    env.create_class(sc).await;
    env.start(provisioner::Options {
        extra_create_metadata: true,
        ..fast_options()
    })
    .await;
    let claim = env.create_pvc(pvc("data", "fast", "2Gi", Some(MOCK))).await;
    let name = pv_name(&claim);
    let pv = env.wait_pv(&name).await;

    let calls = env.mock().calls_of(Method::CreateVolume);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let req = calls[0].create_request.clone().unwrap();
    assert_eq!(req.name, name);
    assert_eq!(req.capacity_range.unwrap().required_bytes, 2 << 30);
    assert_eq!(req.volume_capabilities.len(), 1);
    let cap = &req.volume_capabilities[0];
    assert_eq!(cap.mode(), Some(Mode::SingleNodeWriter));
    match &cap.access_type {
        Some(AccessType::Mount(m)) => {
            assert_eq!(m.fs_type, "xfs");
            assert_eq!(m.mount_flags, vec!["noatime".to_string()]);
        }
        other => panic!("mount capability expected, got {other:?}"),
    }
    let expected: HashMap<String, String> = [
        ("type", "gp3"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", NS),
        ("csi.storage.k8s.io/pv/name", name.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(req.parameters, expected);
    let topo = req.accessibility_requirements.unwrap();
    assert_eq!(topo.requisite.len(), 1);
    assert_eq!(
        topo.requisite[0].segments.get(ZONE).map(String::as_str),
        Some("zone-a")
    );

    // The PV.
    let annotations = pv.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations
            .get(PROVISIONED_BY_ANNOTATION)
            .map(String::as_str),
        Some(MOCK)
    );
    assert_eq!(
        pv.metadata.finalizers.clone().unwrap(),
        vec![PV_FINALIZER.to_string()]
    );
    let spec = pv.spec.clone().unwrap();
    let csi = spec.csi.clone().unwrap();
    assert_eq!(csi.driver, MOCK);
    assert_eq!(
        csi.volume_handle, name,
        "the mock's volume ID is the request name"
    );
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert_eq!(spec.capacity.unwrap()["storage"].0, "2Gi");
    assert_eq!(
        spec.access_modes.unwrap(),
        vec!["ReadWriteOnce".to_string()]
    );
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(spec.mount_options.unwrap(), vec!["noatime".to_string()]);
    let claim_ref = spec.claim_ref.unwrap();
    assert_eq!(claim_ref.kind.as_deref(), Some("PersistentVolumeClaim"));
    assert_eq!(claim_ref.api_version.as_deref(), Some("v1"));
    assert_eq!(claim_ref.namespace.as_deref(), Some(NS));
    assert_eq!(claim_ref.name.as_deref(), Some("data"));
    assert_eq!(claim_ref.uid, claim.metadata.uid);
    let terms = spec
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms;
    assert_eq!(terms.len(), 1);
    let expr = &terms[0].match_expressions.as_ref().unwrap()[0];
    assert_eq!((expr.key.as_str(), expr.operator.as_str()), (ZONE, "In"));
    assert_eq!(expr.values.clone().unwrap(), vec!["zone-a".to_string()]);

    let ok = env.wait_event("data", "ProvisioningSucceeded", &name).await;
    assert_eq!(ok, format!("Successfully provisioned volume {name}"));
    let started = env
        .wait_event("data", "Provisioning", "External provisioner")
        .await;
    assert_eq!(
        started,
        format!("External provisioner is provisioning volume for claim \"{NS}/data\"")
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_topologies_become_the_requisite_and_other_claims_are_left_alone() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_node("node-a", MOCK, &[(ZONE, "zone-a")], &[ZONE])
        .await;
    let mut sc = class("zoned", MOCK, &[]);
    sc.allowed_topologies = Some(vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: ZONE.into(),
            values: vec!["zone-b".into(), "zone-c".into()],
        }]),
    }]);
    env.create_class(sc).await;
    env.create_class(class("other", "other.csi.example.com", &[]))
        .await;
    env.start(fast_options()).await;
    // Another provisioner's claim, and a claim of ours without the annotation: never touched.
    let foreign = env
        .create_pvc(pvc(
            "foreign",
            "other",
            "1Gi",
            Some("other.csi.example.com"),
        ))
        .await;
    let unannotated = env
        .create_pvc(pvc("unannotated", "zoned", "1Gi", None))
        .await;
    let claim = env
        .create_pvc(pvc("zoned", "zoned", "1Gi", Some(MOCK)))
        .await;
    let pv = env.wait_pv(&pv_name(&claim)).await;
    let req = env.mock().calls_of(Method::CreateVolume)[0]
        .create_request
        .clone()
        .unwrap();
    let topo = req.accessibility_requirements.unwrap();
    let zones = |ts: &[csi_spec::v1::Topology]| {
        let mut v: Vec<String> = ts.iter().map(|t| t.segments[ZONE].clone()).collect();
        v.sort();
        v
    };
    assert_eq!(zones(&topo.requisite), vec!["zone-b", "zone-c"]);
    assert_eq!(zones(&topo.preferred), vec!["zone-b", "zone-c"]);
    // The mock answers the first preferred segment; the PV follows it.
    let term = &pv
        .spec
        .unwrap()
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms[0];
    let value = term.match_expressions.as_ref().unwrap()[0]
        .values
        .clone()
        .unwrap();
    assert_eq!(value, vec![topo.preferred[0].segments[ZONE].clone()]);
    // The claim above was queued after the other two: by the time its PV exists they were
    // looked at (a skip takes no API call) and left alone.
    assert_eq!(env.mock().calls_of(Method::CreateVolume).len(), 1);
    assert!(env.pv(&pv_name(&foreign)).await.is_none());
    assert!(env.pv(&pv_name(&unannotated)).await.is_none());
    env.stop().await;
}

const HOSTPATH: &str = hostpath_driver::DEFAULT_DRIVER_NAME;
const HOSTPATH_KEY: &str = hostpath_driver::TOPOLOGY_KEY;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_wait_for_first_consumer_provisions_on_the_selected_node() {
    let mut env = Env::with_hostpath("node-1").await;
    env.create_node(
        "node-1",
        HOSTPATH,
        &[(HOSTPATH_KEY, "node-1")],
        &[HOSTPATH_KEY],
    )
    .await;
    env.create_node(
        "node-2",
        HOSTPATH,
        &[(HOSTPATH_KEY, "node-2")],
        &[HOSTPATH_KEY],
    )
    .await;
    let mut sc = class("local", HOSTPATH, &[]);
    sc.volume_binding_mode = Some("WaitForFirstConsumer".into());
    env.create_class(sc).await;
    env.create_class(class("local-now", HOSTPATH, &[])).await;
    env.start(fast_options()).await;

    let waiting = env
        .create_pvc(pvc("waiting", "local", "10Mi", Some(HOSTPATH)))
        .await;
    // An Immediate claim queued after it: once it has its PV, the waiting one was looked at.
    let now = env
        .create_pvc(pvc("now", "local-now", "10Mi", Some(HOSTPATH)))
        .await;
    let now_pv = env.wait_pv(&pv_name(&now)).await;
    assert!(
        env.pv(&pv_name(&waiting)).await.is_none(),
        "provisioned before selected-node"
    );
    // Immediate: requisite is every node's segment, but a hostpath volume lives where its
    // driver runs: the driver answers node-1.
    let term = &now_pv
        .spec
        .unwrap()
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms[0];
    assert_eq!(
        term.match_expressions.as_ref().unwrap()[0]
            .values
            .clone()
            .unwrap(),
        vec!["node-1"]
    );

    env.annotate_pvc("waiting", SELECTED_NODE_ANNOTATION, "node-1")
        .await;
    let pv = env.wait_pv(&pv_name(&waiting)).await;
    let spec = pv.spec.unwrap();
    let term = &spec
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms[0];
    let expr = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(expr.key, HOSTPATH_KEY);
    assert_eq!(expr.values.clone().unwrap(), vec!["node-1".to_string()]);
    let handle = spec.csi.unwrap().volume_handle;
    let dir = env
        .hostpath
        .as_ref()
        .unwrap()
        .state_dir
        .join("volumes")
        .join(&handle);
    assert!(dir.is_dir(), "the hostpath volume {} exists", dir.display());
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_raw_block_claim_gets_a_block_pv_without_fstype() {
    let mut env = Env::with_hostpath("node-1").await;
    env.create_node(
        "node-1",
        HOSTPATH,
        &[(HOSTPATH_KEY, "node-1")],
        &[HOSTPATH_KEY],
    )
    .await;
    env.create_class(class(
        "local",
        HOSTPATH,
        &[("csi.storage.k8s.io/fstype", "ext4")],
    ))
    .await;
    env.start(fast_options()).await;
    let mut block = pvc("raw", "local", "16Mi", Some(HOSTPATH));
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let claim = env.create_pvc(block).await;
    let pv = env.wait_pv(&pv_name(&claim)).await;
    let spec = pv.spec.unwrap();
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    let csi = spec.csi.unwrap();
    assert_eq!(csi.fs_type, None);
    assert_eq!(spec.capacity.unwrap()["storage"].0, "16Mi");
    let img = env
        .hostpath
        .as_ref()
        .unwrap()
        .state_dir
        .join("volumes")
        .join(format!("{}.img", csi.volume_handle));
    assert!(img.is_file(), "block volume file {}", img.display());
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selected_node_that_cannot_take_the_volume_is_handed_back_to_the_scheduler() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_node("node-a", MOCK, &[(ZONE, "zone-a")], &[ZONE])
        .await;
    let mut sc = class("late", MOCK, &[]);
    sc.volume_binding_mode = Some("WaitForFirstConsumer".into());
    env.create_class(sc).await;
    let full = env.create_pvc(pvc("full", "late", "1Gi", Some(MOCK))).await;
    env.mock().script(
        Method::CreateVolume,
        &pv_name(&full),
        vec![csi_mock::Step::Fail(
            tonic::Code::ResourceExhausted,
            "zone-a is full".into(),
        )],
    );
    env.start(fast_options()).await;
    let mut ghost = pvc("ghost", "late", "1Gi", Some(MOCK));
    ghost
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(SELECTED_NODE_ANNOTATION.into(), "no-such-node".into());
    env.create_pvc(ghost).await;
    env.annotate_pvc("full", SELECTED_NODE_ANNOTATION, "node-a")
        .await;
    let claims = kube::Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        env.kube.clone(),
        NS,
    );
    for name in ["ghost", "full"] {
        eventually(
            &format!("{SELECTED_NODE_ANNOTATION} removed from {name}"),
            || async {
                let c = claims.get(name).await.unwrap();
                let annotations = c.metadata.annotations.unwrap_or_default();
                (!annotations.contains_key(SELECTED_NODE_ANNOTATION)).then_some(())
            },
        )
        .await;
    }
    let m = env
        .wait_event("ghost", "ProvisioningFailed", "no-such-node")
        .await;
    assert!(m.contains("not found"), "{m}");
    env.wait_event("full", "ProvisioningFailed", "ResourceExhausted")
        .await;
    // The ghost never reached the driver (a retry of "full" may race with the watch of the
    // removal, so only the names are checked).
    let calls = env.mock().calls_of(Method::CreateVolume);
    assert!(
        !calls.is_empty() && calls.iter().all(|c| c.volume_id == pv_name(&full)),
        "{calls:?}"
    );
    assert!(env.mock().created_volumes().is_empty());
    env.stop().await;
}
