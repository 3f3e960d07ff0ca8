//! CSIDriver `tokenRequests` and `requiresRepublish`, as the kubelet v1.26 handles them: the
//! pod's service account tokens (one TokenRequest per entry, bound to the pod) in NodePublish's
//! volume_context key `csi.storage.k8s.io/serviceAccount.tokens`, NodePublish again every
//! `--sync-frequency` for a `requiresRepublish` driver, and a publish that fails (FailedMount,
//! pod not Ready) while a token cannot be had. The requests are read on the wire by a recording
//! shim in front of the real hostpath driver; the tokens are checked against apiserver-lite.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;
use test_support::objects::create_json;

use common::{DRIVER, Env, NS, PATIENCE};
use csi_spec::v1::NodePublishVolumeRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use serde_json::{Value, json};
use volume_plugins::SkipAttachMode;

const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";
const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

async fn create_driver(env: &Env, spec: Value) {
    let mut spec = spec;
    spec["attachRequired"] = json!(false);
    create_json::<CSIDriver>(
        Api::all(env.kube.clone()),
        json!({"metadata": {"name": DRIVER}, "spec": spec}),
    )
    .await;
}

async fn create_service_account(env: &Env, name: &str) {
    create_json::<ServiceAccount>(
        Api::namespaced(env.kube.clone(), NS),
        json!({"metadata": {"name": name}}),
    )
    .await;
}

async fn create_pod(env: &Env, name: &str, service_account: &str, claim: &str) -> String {
    let pod = create_json::<Pod>(
        Api::namespaced(env.kube.clone(), NS),
        json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": "node-a",
                "serviceAccountName": service_account,
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }),
    )
    .await;
    pod.metadata.uid.unwrap()
}

/// The recorded publishes into pod `uid`.
fn publishes_for(all: &common::recorder::Publishes, uid: &str) -> Vec<NodePublishVolumeRequest> {
    all.all()
        .into_iter()
        .filter(|p| p.target_path.contains(uid))
        .collect()
}

/// Whom `token` authenticates as against apiserver-lite (from its audit log), `None` on 401.
async fn who(env: &Env, token: &str) -> Option<String> {
    let mut config = env.server().kube_config().unwrap();
    config.auth_info = serde_json::from_value(json!({ "token": token })).unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let probe = format!("probe-{}", &token[..8.min(token.len())]);
    match Api::<ServiceAccount>::namespaced(client, NS)
        .get_opt(&probe)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 401 => return None,
        Err(e) => panic!("GET with a token: {e}"),
    }
    env.server()
        .audit()
        .into_iter()
        .rev()
        .find(|r| r.name.as_deref() == Some(probe.as_str()))
        .map(|r| r.user.to_string())
}

fn expires_in(status: &Value) -> i64 {
    let at: jiff::Timestamp = status["expirationTimestamp"]
        .as_str()
        .unwrap_or_else(|| panic!("expirationTimestamp in {status}"))
        .parse()
        .unwrap();
    at.duration_since(jiff::Timestamp::now()).as_secs()
}

#[tokio::test]
async fn publish_passes_the_pods_tokens_and_republishes() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    let (n, publishes) = env.add_recorded_node("node-a").await;
    // No podInfoOnMount: the tokens come without the pod's info.
    create_driver(
        &env,
        json!({"tokenRequests": [{"audience": ""}, {"audience": "vault", "expirationSeconds": 600}],
            "requiresRepublish": true}),
    )
    .await;
    create_service_account(&env, "app").await;
    let mut options = env.agent_options(n, SkipAttachMode::BypassAdc);
    options.sync_frequency = Duration::from_secs(1);
    env.start_agent(n, options);
    env.wait_registered("node-a").await;
    env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    let uid = create_pod(&env, "pod-1", "app", "claim-1").await;
    env.wait_ready("pod-1").await;

    let first = publishes_for(&publishes, &uid)
        .into_iter()
        .next()
        .expect("a NodePublishVolume into the pod");
    let raw = first
        .volume_context
        .get(TOKENS_KEY)
        .unwrap_or_else(|| panic!("no {TOKENS_KEY} in {:?}", first.volume_context));
    let tokens: BTreeMap<String, Value> = serde_json::from_str(raw).unwrap();
    assert_eq!(
        tokens.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["", "vault"],
        "one token per audience, keyed as the CSIDriver spells it: {raw}"
    );
    for (audience, status) in &tokens {
        let fields: Vec<&String> = status.as_object().unwrap().keys().collect();
        assert_eq!(
            fields,
            vec!["expirationTimestamp", "token"],
            "{audience:?}: {status}"
        );
    }
    let default_life = expires_in(&tokens[""]);
    assert!(
        (3500..=3600).contains(&default_life),
        "the default hour: {default_life}s"
    );
    let vault_life = expires_in(&tokens["vault"]);
    assert!(
        (500..=600).contains(&vault_life),
        "expirationSeconds 600: {vault_life}s"
    );
    assert!(
        !first
            .volume_context
            .contains_key("csi.storage.k8s.io/pod.name"),
        "no pod info without podInfoOnMount: {:?}",
        first.volume_context
    );

    // The API server's token is a credential of the pod's account; the other audience's is not
    // for the API server.
    let api_token = tokens[""]["token"].as_str().unwrap().to_string();
    assert_eq!(
        who(&env, &api_token).await.as_deref(),
        Some("system:serviceaccount:default:app")
    );
    let vault_token = tokens["vault"]["token"].as_str().unwrap();
    assert_eq!(who(&env, vault_token).await, None);
    assert!(
        env.server()
            .audit()
            .iter()
            .any(|r| r.resource == "serviceaccounts"
                && r.subresource.as_deref() == Some("token")
                && r.name.as_deref() == Some("app")
                && r.code == 201),
        "TokenRequests for ServiceAccount app"
    );

    // requiresRepublish: published again (the same tokens: they are far from expiring).
    let again = test_support::eventually("a second NodePublishVolume", PATIENCE, || async {
        publishes_for(&publishes, &uid).into_iter().nth(1)
    })
    .await;
    assert_eq!(again.volume_context.get(TOKENS_KEY), Some(raw));
    assert_eq!(again.target_path, first.target_path);

    // The tokens are bound to the pod: gone with it.
    env.delete_pod_and_wait("pod-1").await;
    assert_eq!(
        who(&env, &api_token).await,
        None,
        "bound to the deleted pod"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn no_token_requests_no_tokens_and_no_republish() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    let (n, publishes) = env.add_recorded_node("node-a").await;
    create_driver(&env, json!({"podInfoOnMount": true})).await;
    create_service_account(&env, "app").await;
    let mut options = env.agent_options(n, SkipAttachMode::BypassAdc);
    options.sync_frequency = Duration::from_millis(300);
    env.start_agent(n, options);
    env.wait_registered("node-a").await;
    env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    let uid = create_pod(&env, "pod-1", "app", "claim-1").await;
    env.wait_ready("pod-1").await;
    // Several sync periods: nothing asks for a republish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = publishes_for(&publishes, &uid);
    assert_eq!(seen.len(), 1, "published once");
    let ctx = &seen[0].volume_context;
    assert_eq!(
        ctx.get("csi.storage.k8s.io/serviceAccount.name")
            .map(String::as_str),
        Some("app"),
        "the pod's info is there: {ctx:?}"
    );
    assert!(
        !ctx.contains_key(TOKENS_KEY),
        "no tokens asked for: {ctx:?}"
    );
    assert!(
        !env.server()
            .audit()
            .iter()
            .any(|r| r.subresource.as_deref() == Some("token")),
        "no TokenRequest"
    );
    env.delete_pod_and_wait("pod-1").await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_token_that_cannot_be_had_fails_the_publish() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    let (n, publishes) = env.add_recorded_node("node-a").await;
    create_driver(&env, json!({"tokenRequests": [{"audience": API_AUDIENCE}]})).await;
    let options = env.agent_options(n, SkipAttachMode::BypassAdc);
    env.start_agent(n, options);
    env.wait_registered("node-a").await;
    env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    // Its ServiceAccount does not exist yet (apiserver-lite, like kube-apiserver, has none
    // unless someone creates it).
    let uid = create_pod(&env, "pod-1", "late", "claim-1").await;
    let msg = env
        .event_message(Some("FailedMount"), "serviceaccounts \"late\" not found")
        .await;
    assert!(
        msg.starts_with("MountVolume.SetUp failed for volume \"pv-1\" : "),
        "{msg}"
    );
    let pod = env.pods().get("pod-1").await.unwrap();
    let ready = pod
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(!ready, "not Ready without its volume");
    assert!(
        publishes_for(&publishes, &uid).is_empty(),
        "NodePublishVolume never started"
    );

    // Once the account exists the retry goes through.
    create_service_account(&env, "late").await;
    env.wait_ready("pod-1").await;
    let seen = publishes_for(&publishes, &uid);
    let tokens: BTreeMap<String, Value> =
        serde_json::from_str(&seen[0].volume_context[TOKENS_KEY]).unwrap();
    assert_eq!(tokens.keys().collect::<Vec<_>>(), vec![API_AUDIENCE]);
    env.delete_pod_and_wait("pod-1").await;
    env.shutdown().await;
}
