//! Leader election through `run_with_client`: two instances (each with its own mock of the
//! same driver name), only the leader provisions; when it stops, the other takes over.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use csi_mock::Method;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio_util::sync::CancellationToken;

const MOCK: &str = "mock.csi.rs";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_provisions_and_the_other_takes_over() {
    let env = Env::with_mock(provisioning_mock(MOCK)).await;
    let second_dir = env.dir.path().join("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    let second = csi_mock::start(&second_dir, provisioning_mock(MOCK))
        .await
        .unwrap();
    env.create_class(class("fast", MOCK, &[])).await;
    let flags = [
        "--leader-election",
        "--leader-election-namespace=default",
        "--leader-election-lease-duration=2s",
        "--leader-election-renew-deadline=1500ms",
        "--leader-election-retry-period=200ms",
        "--retry-interval-start=50ms",
        "--retry-interval-max=500ms",
        "--worker-threads=4",
    ];
    let first_config = env.config(&flags);
    let mut second_config = env.config(&flags);
    second_config.common.csi_address = second.endpoint();

    let first_stop = CancellationToken::new();
    let first = tokio::spawn(provisioner::run_with_client(
        first_config,
        env.kube.clone(),
        first_stop.clone(),
    ));
    let leases = Api::<Lease>::namespaced(env.kube.clone(), NS);
    // The Go sidecar's Lease name: the sanitized driver name.
    eventually("the first instance leads", || async {
        let lease = leases.get_opt("mock-csi-rs").await.unwrap()?;
        lease.spec?.holder_identity.filter(|h| !h.is_empty())
    })
    .await;
    let second_stop = CancellationToken::new();
    let second_task = tokio::spawn(provisioner::run_with_client(
        second_config,
        env.kube.clone(),
        second_stop.clone(),
    ));

    let a = env.create_pvc(pvc("a", "fast", "1Gi", Some(MOCK))).await;
    env.wait_pv(&pv_name(&a)).await;
    assert_eq!(env.mock().calls_of(Method::CreateVolume).len(), 1);
    assert!(
        second.calls_of(Method::CreateVolume).is_empty(),
        "the follower provisioned"
    );

    // The leader steps down (releasing the Lease): the follower provisions from now on.
    first_stop.cancel();
    first.await.unwrap().unwrap();
    let b = env.create_pvc(pvc("b", "fast", "1Gi", Some(MOCK))).await;
    env.wait_pv(&pv_name(&b)).await;
    let names: Vec<String> = second
        .calls_of(Method::CreateVolume)
        .into_iter()
        .map(|c| c.volume_id)
        .collect();
    assert_eq!(names, vec![pv_name(&b)]);
    assert_eq!(env.mock().calls_of(Method::CreateVolume).len(), 1);
    second_stop.cancel();
    second_task.await.unwrap().unwrap();
    second.shutdown().await;
}
