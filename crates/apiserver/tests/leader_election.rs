//! Leader election with kube-lease-manager against the embedded server: a third-party client
//! that relies on server-side apply conflicts and strategic merge patches of a Lease, which
//! apiserver-lite must serve as kube-apiserver does. (Our sidecars do not use it:
//! `component_runtime::leader` writes the Lease with PUTs, as client-go does.)
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube_lease_manager::LeaseManagerBuilder;

async fn manager(client: kube::Client, identity: &str) -> kube_lease_manager::LeaseManager {
    LeaseManagerBuilder::new(client, "csi-attacher-leader")
        .with_namespace("kube-system")
        .with_identity(identity)
        .with_duration(3)
        .with_grace(1)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn one_leader_at_a_time_and_handover() {
    let server = common::start().await;
    let a = manager(server.client(), "a").await;
    let b = manager(server.client(), "b").await;

    assert!(
        tokio::time::timeout(Duration::from_secs(10), a.changed())
            .await
            .unwrap()
            .unwrap(),
        "a becomes leader"
    );
    // b cannot take the lease while a keeps renewing it.
    let contender = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            tokio::select! {
                r = b.changed() => { if r.unwrap() { return true; } }
                r = a.changed() => { r.unwrap(); }
            }
        }
    })
    .await;
    assert!(
        contender.is_err(),
        "b must not become leader while a holds the lease"
    );
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let held = leases.get("csi-attacher-leader").await.unwrap();
    assert_eq!(held.spec.unwrap().holder_identity.as_deref(), Some("a"));

    // a steps down: b takes over.
    a.release().await.unwrap();
    let took = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if b.changed().await.unwrap() {
                return;
            }
        }
    })
    .await;
    assert!(took.is_ok(), "b becomes leader after a releases");
    let held = leases.get("csi-attacher-leader").await.unwrap();
    assert_eq!(held.spec.unwrap().holder_identity.as_deref(), Some("b"));

    // b stops renewing (dropped without release): after expiry a can take over.
    drop(b);
    let took = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if a.changed().await.unwrap() {
                return;
            }
        }
    })
    .await;
    assert!(took.is_ok(), "a takes over an expired lease");
}
