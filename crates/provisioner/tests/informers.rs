//! Provisioners of one process sharing their watch caches (`provisioner::Informers`), as
//! `csi-cluster` runs one node-deployment provisioner per node: one watch per kind for all of
//! them, each still provisioning its own claims, and a stopped one unsubscribed.

mod common;

use common::*;
use csi_mock::Method;
use prometheus_client::registry::Registry;
use provisioner::{Controller, Informers};
use tokio_util::sync::CancellationToken;

/// Watches (and lists) of `resource` the server has seen.
fn watches_of(env: &Env, resource: &str) -> usize {
    env.server
        .audit()
        .iter()
        .filter(|r| r.resource == resource && r.verb == "watch")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_provisioners_share_one_watch_per_kind_and_each_provisions_its_own_claims() {
    let env = Env::with_mock(provisioning_mock("a.csi.example.com")).await;
    let dir_b = env.dir.path().join("mock-b");
    std::fs::create_dir_all(&dir_b).unwrap();
    let mock_b = csi_mock::start(&dir_b, provisioning_mock("b.csi.example.com"))
        .await
        .unwrap();
    env.create_class(class("class-a", "a.csi.example.com", &[]))
        .await;
    env.create_class(class("class-b", "b.csi.example.com", &[]))
        .await;
    // A claim made before anything runs: a late subscriber is shown what is already there.
    let early = env
        .create_pvc(pvc("early-a", "class-a", "1Gi", Some("a.csi.example.com")))
        .await;

    let stop_all = CancellationToken::new();
    let informers = Informers::spawn(&env.kube, &tokio::runtime::Handle::current(), &stop_all);
    let driver_b = {
        let config = {
            use clap::Parser;
            let args = [
                "csi-provisioner".to_string(),
                format!("--csi-address={}", mock_b.endpoint()),
            ];
            provisioner::Config::try_parse_from(args).unwrap()
        };
        provisioner::connect_driver(&config, &CancellationToken::new())
            .await
            .unwrap()
    };
    let mut registry = Registry::default();
    let a = Controller::new(
        env.kube.clone(),
        env.driver().await,
        fast_options(),
        &mut registry,
        None,
    )
    .with_informers(informers.clone());
    let mut registry = Registry::default();
    let b = Controller::new(
        env.kube.clone(),
        driver_b,
        fast_options(),
        &mut registry,
        None,
    )
    .with_informers(informers.clone());
    let (stop_a, stop_b) = (stop_all.child_token(), stop_all.child_token());
    let run_a = tokio::spawn(a.run(stop_a.clone()));
    let run_b = tokio::spawn(b.run(stop_b.clone()));

    env.wait_pv(&pv_name(&early)).await;
    let claim_b = env
        .create_pvc(pvc("claim-b", "class-b", "1Gi", Some("b.csi.example.com")))
        .await;
    let pv_b = env.wait_pv(&pv_name(&claim_b)).await;
    assert_eq!(
        pv_b.spec.unwrap().csi.unwrap().driver,
        "b.csi.example.com",
        "each provisioner provisions its own driver's claims"
    );
    assert_eq!(
        mock_b.calls_of(Method::CreateVolume).len(),
        1,
        "b created one volume"
    );
    assert_eq!(
        env.mock().calls_of(Method::CreateVolume).len(),
        1,
        "a created one volume"
    );
    for kind in [
        "persistentvolumeclaims",
        "persistentvolumes",
        "storageclasses",
        "csinodes",
        "nodes",
    ] {
        assert_eq!(
            watches_of(&env, kind),
            1,
            "one watch of {kind} for both provisioners"
        );
    }

    // Stopping one unsubscribes it; the other goes on.
    stop_a.cancel();
    run_a.await.unwrap().unwrap();
    eventually("a's subscriptions are dropped", || async {
        (informers_subscribers(&informers) == 1).then_some(())
    })
    .await;
    let later = env
        .create_pvc(pvc("later-b", "class-b", "1Gi", Some("b.csi.example.com")))
        .await;
    env.wait_pv(&pv_name(&later)).await;
    let unserved = env
        .create_pvc(pvc("later-a", "class-a", "1Gi", Some("a.csi.example.com")))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        env.pv(&pv_name(&unserved)).await.is_none(),
        "a stopped provisioner provisions nothing"
    );
    stop_b.cancel();
    run_b.await.unwrap().unwrap();
    stop_all.cancel();
}

/// Subscribers of the claims' watch (each running provisioner has one).
fn informers_subscribers(informers: &Informers) -> usize {
    informers.claims().subscribers()
}
