//! Two controllers with leader election: one holds the Lease and binds; when it stops (and
//! releases the Lease), the other takes over and binds what comes next.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Env, PATIENCE, fast_options};
use component_runtime::LeaderElectionConfig;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use pv_controller::Config;

const RWO: &[&str] = &["ReadWriteOnce"];

fn elected(identity: &str) -> Config {
    let mut config = Config::new(fast_options());
    config.serving.leader_election = Some(LeaderElectionConfig {
        lease_name: "pv-controller".into(),
        namespace: "default".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    });
    config
}

async fn holder(env: &Env) -> Option<String> {
    Api::<Lease>::namespaced(env.kube.clone(), "default")
        .get_opt("pv-controller")
        .await
        .ok()??
        .spec?
        .holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_binds_and_the_other_takes_over_when_it_stops() {
    let mut first = Env::new().await;
    first.start_with(elected("first")).await;
    test_support::eventually("first leads", PATIENCE, || async {
        (holder(&first).await? == "first").then_some(())
    })
    .await;
    // The second candidate runs in the same process against the same API server.
    let second = first.second_controller(elected("second")).await;
    first.create_pv("a", "1Gi", RWO, "").await;
    first.create_pvc("a", "1Gi", RWO, None).await;
    first.wait_pvc_phase("a", "Bound").await;
    assert_eq!(holder(&first).await.as_deref(), Some("first"));

    first.stop().await;
    test_support::eventually("second takes the lease", PATIENCE, || async {
        (holder(&first).await? == "second").then_some(())
    })
    .await;
    first.create_pv("b", "1Gi", RWO, "").await;
    first.create_pvc("b", "1Gi", RWO, None).await;
    first.wait_pvc_phase("b", "Bound").await;
    second.stop().await;
    first.shutdown().await;
}
