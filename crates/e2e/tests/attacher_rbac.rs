//! deploy/kubernetes/rbac/attacher/rbac-attacher.yaml is least privilege, checked against what the attacher really calls:
//! the `csi-attacher` binary runs with leader election through a scenario that exercises every
//! kind of call it makes (attach with a controllerPublishSecretRef, an attach error that becomes
//! an Event twice, two replicas handing the Lease over on SIGTERM, detach, PV deletion), and the embedded API server's
//! audit trail of its requests is compared with the manifest's rules:
//! - every call it made is allowed by the rules (else the Deployment would fail in a cluster);
//! - every rule is used by some call (else the rule grants more than it needs).
//!
//! The binary is found through CSI_ATTACHER_BIN (scripts/test sets it) or beside this test in the
//! target dir; without either the test says why it skips.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_mock::MockConfig;
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Secret, SecretReference};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const DRIVER: &str = "mock.csi.rs";
const PATIENCE: Duration = Duration::from_secs(60);

fn attacher_bin() -> Option<PathBuf> {
    std::env::var_os("CSI_ATTACHER_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("csi-attacher")).filter(|p| p.exists())
        })
}

/// Kills the attacher on drop, also when an assertion fails.
struct Attacher(Child);

impl Drop for Attacher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGTERM, and wait for the process to end (it releases the Lease on the way out).
async fn stop(mut attacher: Attacher) {
    test_support::process::terminate(&mut attacher.0, "csi-attacher", PATIENCE).await;
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

fn pv(name: &str, secret_ref: Option<SecretReference>) -> PersistentVolume {
    let mut pv = test_support::objects::csi_pv(name, DRIVER, &format!("vol-{name}"));
    if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.controller_publish_secret_ref = secret_ref;
    }
    pv
}

fn va(name: &str, pv: &str) -> VolumeAttachment {
    test_support::objects::volume_attachment(name, DRIVER, pv, "node-1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_rbac_grants_exactly_what_the_attacher_calls() {
    let Some(bin) = attacher_bin() else {
        test_support::skip_or_fail(
            "no csi-attacher built in this target dir and CSI_ATTACHER_BIN unset \
             (`cargo build -p attacher`, or scripts/test)",
        );
        return;
    };
    apiserver::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap();
    let kube = server.client();
    let mock = csi_mock::start(dir.path(), MockConfig::default())
        .await
        .unwrap();

    // The world: a CSINode, a secret in its own namespace, two PVs (one with the secret).
    let namespaces: Api<Namespace> = Api::all(kube.clone());
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta("storage-secrets"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), "storage-secrets");
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: meta("publish-creds"),
                data: Some(BTreeMap::from([(
                    "token".to_string(),
                    ByteString(b"s3cr3t".to_vec()),
                )])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<CSINode>::all(kube.clone())
        .create(
            &PostParams::default(),
            &test_support::objects::csinode("node-1", &[(DRIVER, "mock-node-1")]),
        )
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(kube.clone());
    let vas: Api<VolumeAttachment> = Api::all(kube.clone());
    let secret_ref = SecretReference {
        name: Some("publish-creds".into()),
        namespace: Some("storage-secrets".into()),
    };
    pvs.create(&PostParams::default(), &pv("pv-1", Some(secret_ref)))
        .await
        .unwrap();

    let kubeconfig = server.write_kubeconfig(dir.path()).unwrap();
    let spawn = |name: &str| {
        let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
        Attacher(
            Command::new(&bin)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--csi-address={}", mock.endpoint()))
                .args([
                    "--leader-election",
                    "--leader-election-namespace=kube-system",
                    "--retry-interval-start=50ms",
                    "--retry-interval-max=200ms",
                    "--timeout=5s",
                    "--v=2",
                ])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    };
    // Two replicas: the first creates the Lease and leads, the second waits and watches it.
    let leases: Api<Lease> = Api::namespaced(kube.clone(), "kube-system");
    let lease = "external-attacher-leader-mock-csi-rs";
    let first = spawn("first");
    wait_until("the first replica holds the lease", || async {
        leases
            .get_opt(lease)
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
            .is_some_and(|h| !h.is_empty())
    })
    .await;
    // The standby's Lease watch must be in the audit trail before the hand-over: if the first
    // replica let go before the second one got that far, the second would take the Lease on its
    // first try and never watch it, and the rule would look unused (the test fails on a rule no
    // call used).
    let lease_watches = |server: &apiserver::RunningApiServer| {
        server
            .audit()
            .into_iter()
            .filter(|r| {
                r.user_agent.starts_with("csi-attacher")
                    && r.resource == "leases"
                    && r.verb == "watch"
                    && r.namespace.as_deref() == Some("kube-system")
            })
            .count()
    };
    let watches_before = lease_watches(&server);
    let second = spawn("second");
    wait_until("the second replica watches the held lease", || async {
        lease_watches(&server) > watches_before
    })
    .await;

    // Attach with secrets; then an attach that fails twice (unknown PV → error, Event, and the
    // same Event again), then works once the PV appears.
    vas.create(&PostParams::default(), &va("va-1", "pv-1"))
        .await
        .unwrap();
    wait_until("va-1 attached", || async {
        vas.get("va-1")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.attached)
    })
    .await;
    let publishes = mock.calls_of(csi_mock::Method::ControllerPublishVolume);
    assert_eq!(
        publishes[0].secrets.get("token").map(String::as_str),
        Some("s3cr3t"),
        "the PV's controllerPublishSecretRef reached the driver"
    );
    // Hand over: SIGTERM to the first replica releases the Lease; the second one leads.
    let holder = |l: Option<Lease>| l.and_then(|l| l.spec?.holder_identity).unwrap_or_default();
    let first_holder = holder(leases.get_opt(lease).await.unwrap());
    stop(first).await;
    wait_until("the second replica holds the lease", || async {
        let h = holder(leases.get_opt(lease).await.unwrap());
        !h.is_empty() && h != first_holder
    })
    .await;
    vas.create(&PostParams::default(), &va("va-2", "pv-2"))
        .await
        .unwrap();
    wait_until("va-2's error recorded more than once", || async {
        let events = server
            .audit()
            .into_iter()
            .filter(|r| r.user_agent.starts_with("csi-attacher") && r.resource == "events")
            .count();
        events >= 2
    })
    .await;
    pvs.create(&PostParams::default(), &pv("pv-2", None))
        .await
        .unwrap();
    wait_until("va-2 attached", || async {
        vas.get("va-2")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.attached)
    })
    .await;

    // Detach, PV deletion, and SIGTERM (the lease is released).
    for name in ["va-1", "va-2"] {
        vas.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for name in ["pv-1", "pv-2"] {
        pvs.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_until("VAs and PVs gone", || async {
        vas.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
            && pvs
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
    })
    .await;
    stop(second).await;

    // What it called, as (namespace, group, resource[/sub], verb), against the manifest.
    let used = common::rbac::calls_of(&server, "csi-attacher");
    common::rbac::assert_least_privilege("attacher/rbac-attacher.yaml", &used, &[]);
    mock.shutdown().await;
    server.shutdown().await.unwrap();
}
