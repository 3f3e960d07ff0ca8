//! What the cache tests share: apiserver-lite holding claims, a scoped cache of claims, a
//! claim's size and polling.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use component_runtime::{ObjectCache, ScopedPolicy};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::PostParams;
use tokio_util::sync::CancellationToken;

pub fn claim(name: &str, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    }))
    .unwrap()
}

pub fn size(c: &PersistentVolumeClaim) -> String {
    c.spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"]
        .0
        .clone()
}

/// apiserver-lite with 1Gi claims `names` in `default`, and the claims API there.
pub async fn server_with_claims(
    names: &[&str],
) -> (apiserver::RunningApiServer, Api<PersistentVolumeClaim>) {
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .expect("api server");
    let api: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "default");
    for name in names {
        api.create(&PostParams::default(), &claim(name, "1Gi"))
            .await
            .unwrap();
    }
    (server, api)
}

/// A scoped cache of the claims of `server`.
pub fn scoped_claims(
    server: &apiserver::RunningApiServer,
    policy: ScopedPolicy,
    stop: &CancellationToken,
) -> ObjectCache<PersistentVolumeClaim> {
    let c = server.client();
    ObjectCache::spawn_scoped(
        move |ns| Api::namespaced(c.clone(), ns.unwrap_or("default")),
        policy,
        stop.clone(),
    )
}

/// Polls `check` until it holds (10 s at most).
pub async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
