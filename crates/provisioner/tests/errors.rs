//! Failures: CreateVolume timing out then succeeding, a driver error's Event, a restart in the
//! middle of CreateVolume, a claim deleted while provisioning, a PV that exists already (409).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use csi_mock::{ANY_VOLUME, Method, Step};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

const MOCK: &str = "mock.csi.rs";

fn short_timeout() -> provisioner::Options {
    provisioner::Options {
        timeout: Duration::from_secs(1),
        ..fast_options()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_timing_out_then_succeeding_makes_one_volume_and_one_pv() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("fast", MOCK, &[])).await;
    env.mock().script(
        Method::CreateVolume,
        ANY_VOLUME,
        vec![Step::Hang, Step::Hang],
    );
    env.start(short_timeout()).await;
    let claim = env.create_pvc(pvc("slow", "fast", "1Gi", Some(MOCK))).await;
    let name = pv_name(&claim);
    env.wait_pv(&name).await;
    let calls = env.mock().calls_of(Method::CreateVolume);
    assert_eq!(calls.len(), 3, "two timeouts, then success: {calls:?}");
    assert!(
        calls.iter().all(|c| c.volume_id == name),
        "the same name every time"
    );
    assert_eq!(env.mock().created_volumes().len(), 1);
    let m = env
        .wait_event("slow", "ProvisioningFailed", "DeadlineExceeded")
        .await;
    assert!(m.starts_with("failed to provision volume with StorageClass \"fast\": rpc error: code = DeadlineExceeded"), "{m}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_error_is_a_provisioning_failed_event_and_is_retried() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("fast", MOCK, &[])).await;
    env.mock().script(
        Method::CreateVolume,
        ANY_VOLUME,
        vec![Step::Fail(
            tonic::Code::InvalidArgument,
            "parameter type: unknown volume type".into(),
        )],
    );
    env.start(fast_options()).await;
    let claim = env.create_pvc(pvc("bad", "fast", "1Gi", Some(MOCK))).await;
    let m = env
        .wait_event("bad", "ProvisioningFailed", "InvalidArgument")
        .await;
    assert_eq!(
        m,
        "failed to provision volume with StorageClass \"fast\": rpc error: code = InvalidArgument desc = parameter type: unknown volume type"
    );
    // A final error is still retried with backoff (the class may be fixed meanwhile).
    env.wait_pv(&pv_name(&claim)).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_create_volume_makes_one_volume_and_one_pv() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("fast", MOCK, &[])).await;
    env.mock().script(
        Method::CreateVolume,
        ANY_VOLUME,
        vec![Step::Delay(Duration::from_secs(30))],
    );
    env.start(fast_options()).await;
    let claim = env.create_pvc(pvc("data", "fast", "1Gi", Some(MOCK))).await;
    let name = pv_name(&claim);
    eventually("CreateVolume in flight", || async {
        (!env.mock().calls_of(Method::CreateVolume).is_empty()).then_some(())
    })
    .await;
    env.stop().await;
    assert!(env.pv(&name).await.is_none());
    env.start(fast_options()).await;
    env.wait_pv(&name).await;
    let calls = env.mock().calls_of(Method::CreateVolume);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        calls[0].code,
        tonic::Code::Cancelled,
        "the first call was abandoned"
    );
    assert!(calls.iter().all(|c| c.volume_id == name));
    assert_eq!(env.mock().created_volumes().len(), 1);
    let pvs = Api::<PersistentVolume>::all(env.kube.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(pvs.items.len(), 1);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_during_create_volume_leaves_no_volume() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("fast", MOCK, &[])).await;
    env.mock().script(
        Method::CreateVolume,
        ANY_VOLUME,
        vec![Step::Delay(Duration::from_secs(2))],
    );
    env.start(fast_options()).await;
    let claim = env.create_pvc(pvc("gone", "fast", "1Gi", Some(MOCK))).await;
    let name = pv_name(&claim);
    eventually("CreateVolume in flight", || async {
        (!env.mock().calls_of(Method::CreateVolume).is_empty()).then_some(())
    })
    .await;
    env.delete_pvc("gone").await;
    eventually("DeleteVolume of the abandoned volume", || async {
        (!env.mock().calls_of(Method::DeleteVolume).is_empty()).then_some(())
    })
    .await;
    eventually("no volume left", || async {
        env.mock().created_volumes().is_empty().then_some(())
    })
    .await;
    assert!(env.pv(&name).await.is_none(), "no PV for a deleted claim");
    assert_eq!(env.mock().calls_of(Method::DeleteVolume)[0].volume_id, name);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_while_create_volume_is_uncertain_leaves_no_volume() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("fast", MOCK, &[])).await;
    // Timeouts until after the claim is gone: the volume may exist, nobody knows its ID.
    env.mock().script(
        Method::CreateVolume,
        ANY_VOLUME,
        vec![Step::Hang, Step::Hang, Step::Hang],
    );
    env.start(short_timeout()).await;
    let claim = env
        .create_pvc(pvc("uncertain", "fast", "1Gi", Some(MOCK)))
        .await;
    let name = pv_name(&claim);
    env.wait_event("uncertain", "ProvisioningFailed", "DeadlineExceeded")
        .await;
    env.delete_pvc("uncertain").await;
    eventually("the uncertain volume finished and deleted", || async {
        let deleted = !env.mock().calls_of(Method::DeleteVolume).is_empty();
        (deleted && env.mock().created_volumes().is_empty()).then_some(())
    })
    .await;
    assert!(
        env.mock()
            .calls_of(Method::CreateVolume)
            .iter()
            .all(|c| c.volume_id == name)
    );
    assert!(env.pv(&name).await.is_none());
    env.stop().await;
}

fn existing_pv(
    name: &str,
    claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
    by: &str,
) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some([(PROVISIONED_BY_ANNOTATION.to_string(), by.to_string())].into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(
                [(
                    "storage".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
                )]
                .into(),
            ),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            claim_ref: Some(ObjectReference {
                namespace: claim.metadata.namespace.clone(),
                name: claim.metadata.name.clone(),
                uid: claim.metadata.uid.clone(),
                ..Default::default()
            }),
            csi: Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: MOCK.into(),
                volume_handle: name.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pv_that_exists_already_is_success_if_ours_and_a_failure_if_not() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("fast", MOCK, &[])).await;
    // Ours: created (as by an earlier run) while CreateVolume runs, so our create gets 409.
    let ours = env.create_pvc(pvc("ours", "fast", "1Gi", Some(MOCK))).await;
    env.mock().script(
        Method::CreateVolume,
        &pv_name(&ours),
        vec![Step::Delay(Duration::from_secs(2))],
    );
    let foreign = env
        .create_pvc(pvc("foreign", "fast", "1Gi", Some(MOCK)))
        .await;
    let api = Api::<PersistentVolume>::all(env.kube.clone());
    // A PV of the foreign claim's name that belongs to another claim.
    let mut other = existing_pv(&pv_name(&foreign), &ours, MOCK);
    other.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("another-uid".into());
    api.create(&PostParams::default(), &other).await.unwrap();
    env.start(fast_options()).await;
    eventually("CreateVolume of the first claim in flight", || async {
        env.mock()
            .calls_of(Method::CreateVolume)
            .iter()
            .any(|c| c.volume_id == pv_name(&ours))
            .then_some(())
    })
    .await;
    api.create(
        &PostParams::default(),
        &existing_pv(&pv_name(&ours), &ours, MOCK),
    )
    .await
    .unwrap();
    let m = env
        .wait_event("ours", "ProvisioningSucceeded", &pv_name(&ours))
        .await;
    assert_eq!(
        m,
        format!("Successfully provisioned volume {}", pv_name(&ours))
    );
    let m = env
        .wait_event("foreign", "ProvisioningFailed", "exists")
        .await;
    assert!(m.contains(&pv_name(&foreign)), "{m}");
    assert!(
        env.events_of("ours")
            .await
            .iter()
            .all(|(r, _)| r != "ProvisioningFailed")
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_data_sources_fail_naming_the_missing_capability() {
    use k8s_openapi::api::core::v1::TypedLocalObjectReference;
    let mut env = Env::with_mock(csi_mock::MockConfig {
        clone_volume: false,
        ..provisioning_mock(MOCK)
    })
    .await;
    env.create_class(class("fast", MOCK, &[])).await;
    env.start(fast_options()).await;
    let mut from_snapshot = pvc("from-snapshot", "fast", "1Gi", Some(MOCK));
    from_snapshot.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: Some("snapshot.storage.k8s.io".into()),
        kind: "VolumeSnapshot".into(),
        name: "snap-1".into(),
    });
    env.create_pvc(from_snapshot).await;
    let mut clone = pvc("clone", "fast", "1Gi", Some(MOCK));
    clone.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: "source".into(),
    });
    env.create_pvc(clone).await;
    let m = env
        .wait_event(
            "from-snapshot",
            "ProvisioningFailed",
            "CREATE_DELETE_SNAPSHOT",
        )
        .await;
    assert!(m.contains("snap-1"), "{m}");
    let m = env
        .wait_event("clone", "ProvisioningFailed", "CLONE_VOLUME")
        .await;
    assert!(m.contains("source"), "{m}");
    assert!(env.mock().calls_of(Method::CreateVolume).is_empty());
    env.stop().await;
}
