//! Deleting: a Released PV with reclaim Delete goes (DeleteVolume once, our finalizer off, PV
//! gone; the hostpath volume's directory too), a Retain one stays, a PV deleted by a user
//! while Bound keeps our finalizer until it is Released. Also a PVC clone on hostpath.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use csi_mock::Method;
use k8s_openapi::api::core::v1::{PersistentVolume, TypedLocalObjectReference};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

const MOCK: &str = "mock.csi.rs";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_retain_and_a_bound_pv_deleted_by_a_user() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("delete", MOCK, &[])).await;
    let mut retain = class("retain", MOCK, &[]);
    retain.reclaim_policy = Some("Retain".into());
    env.create_class(retain).await;
    env.start(fast_options()).await;
    let kept = env
        .create_pvc(pvc("kept", "retain", "1Gi", Some(MOCK)))
        .await;
    let bound = env
        .create_pvc(pvc("bound", "delete", "1Gi", Some(MOCK)))
        .await;
    let released = env
        .create_pvc(pvc("released", "delete", "1Gi", Some(MOCK)))
        .await;
    let (kept, bound, released) = (pv_name(&kept), pv_name(&bound), pv_name(&released));
    let retained_pv = env.wait_pv(&kept).await;
    assert!(
        retained_pv
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty(),
        "no finalizer on a Retain PV"
    );
    env.wait_pv(&bound).await;
    env.wait_pv(&released).await;

    env.set_pv_phase(&kept, "Released").await;
    env.set_pv_phase(&bound, "Bound").await;
    // A user deletes a bound PV: our finalizer holds it.
    Api::<PersistentVolume>::all(env.kube.clone())
        .delete(&bound, &DeleteParams::default())
        .await
        .unwrap();
    env.set_pv_phase(&released, "Released").await;
    eventually("the released PV deleted", || async {
        env.pv(&released).await.is_none().then_some(())
    })
    .await;
    let deleted: Vec<String> = env
        .mock()
        .calls_of(Method::DeleteVolume)
        .into_iter()
        .map(|c| c.volume_id)
        .collect();
    assert_eq!(
        deleted,
        vec![released.clone()],
        "DeleteVolume once, for the released Delete PV only"
    );
    let pv = env.pv(&bound).await.expect("the bound PV is held");
    assert!(pv.metadata.deletion_timestamp.is_some());
    assert!(
        pv.metadata
            .finalizers
            .unwrap()
            .contains(&PV_FINALIZER.to_string())
    );
    assert!(env.pv(&kept).await.is_some(), "a Retain PV stays");

    // Released at last: deleted through the driver.
    env.set_pv_phase(&bound, "Released").await;
    eventually("the user-deleted PV gone", || async {
        env.pv(&bound).await.is_none().then_some(())
    })
    .await;
    assert_eq!(env.mock().calls_of(Method::DeleteVolume).len(), 2);
    assert!(env.pv(&kept).await.is_some());
    assert!(env.mock().created_volumes().contains_key(&kept));
    env.stop().await;
}

/// A provisioned PV whose first DeleteVolume will fail with `code`, then Released: the
/// environment and the PV's name.
async fn released_after_a_failed_delete(code: tonic::Code, message: &str) -> (Env, String) {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("delete", MOCK, &[])).await;
    env.start(fast_options()).await;
    let claim = env
        .create_pvc(pvc("data", "delete", "1Gi", Some(MOCK)))
        .await;
    let name = pv_name(&claim);
    env.wait_pv(&name).await;
    let fail = csi_mock::Step::Fail(code, message.into());
    env.mock().script(Method::DeleteVolume, &name, vec![fail]);
    env.set_pv_phase(&name, "Released").await;
    (env, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_already_gone_from_the_driver_still_lets_the_pv_go() {
    let (mut env, name) =
        released_after_a_failed_delete(tonic::Code::NotFound, "no such volume").await;
    eventually("the PV deleted", || async {
        env.pv(&name).await.is_none().then_some(())
    })
    .await;
    assert_eq!(env.mock().calls_of(Method::DeleteVolume).len(), 1);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delete_is_an_event_and_is_retried() {
    let (mut env, name) =
        released_after_a_failed_delete(tonic::Code::FailedPrecondition, "volume in use").await;
    eventually("the PV deleted after a retry", || async {
        env.pv(&name).await.is_none().then_some(())
    })
    .await;
    assert_eq!(env.mock().calls_of(Method::DeleteVolume).len(), 2);
    let events = env.events_of(&name).await;
    assert!(
        events.iter().any(|(r, m)| r == "VolumeFailedDelete"
            && m.contains("FailedPrecondition desc = volume in use")),
        "{events:?}"
    );
    env.stop().await;
}

const HOSTPATH: &str = hostpath_driver::DEFAULT_DRIVER_NAME;
const HOSTPATH_KEY: &str = hostpath_driver::TOPOLOGY_KEY;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_clone_then_delete_removes_the_volumes() {
    let mut env = Env::with_hostpath("node-1").await;
    env.create_node(
        "node-1",
        HOSTPATH,
        &[(HOSTPATH_KEY, "node-1")],
        &[HOSTPATH_KEY],
    )
    .await;
    env.create_class(class("local", HOSTPATH, &[])).await;
    env.start(fast_options()).await;
    let source = env
        .create_pvc(pvc("source", "local", "10Mi", Some(HOSTPATH)))
        .await;
    let source_pv = env.wait_pv(&pv_name(&source)).await;
    let source_handle = source_pv.spec.unwrap().csi.unwrap().volume_handle;
    let state = env.hostpath.as_ref().unwrap().state_dir.clone();
    std::fs::write(
        state.join("volumes").join(&source_handle).join("hello"),
        b"world",
    )
    .unwrap();
    // Bind it as the PV controller would, so it can be cloned.
    let patch = serde_json::json!({"spec": {"volumeName": pv_name(&source)}});
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(env.kube.clone(), NS)
        .patch("source", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let mut clone = pvc("clone", "local", "10Mi", Some(HOSTPATH));
    clone.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: "source".into(),
    });
    let clone = env.create_pvc(clone).await;
    let clone_pv = env.wait_pv(&pv_name(&clone)).await;
    let clone_handle = clone_pv.spec.unwrap().csi.unwrap().volume_handle;
    let copied = std::fs::read(state.join("volumes").join(&clone_handle).join("hello")).unwrap();
    assert_eq!(copied, b"world", "the clone has the source's data");

    env.set_pv_phase(&pv_name(&clone), "Released").await;
    eventually("the clone's PV deleted", || async {
        env.pv(&pv_name(&clone)).await.is_none().then_some(())
    })
    .await;
    assert!(
        !state.join("volumes").join(&clone_handle).exists(),
        "the hostpath volume is gone"
    );
    assert!(state.join("volumes").join(&source_handle).exists());
    env.stop().await;
}
