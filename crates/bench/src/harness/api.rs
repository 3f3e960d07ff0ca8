//! The embedded API server a scenario runs against, and the clients of it: apiserver-lite on
//! 127.0.0.1 (an ephemeral port) with its audit trail on, which is how the writes of each
//! party are counted ([`super::writes`]).

use std::path::{Path, PathBuf};

use apiserver::RunningApiServer;
use kube::Client;

use crate::Error;

/// A run's temp dir, `PREFIX-XXXXXX` under `parent` (the system's temp dir by default);
/// removed when dropped.
pub fn run_dir(prefix: &str, parent: Option<&Path>) -> Result<tempfile::TempDir, Error> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    match parent {
        Some(parent) => builder.tempdir_in(parent),
        None => builder.tempdir(),
    }
    .map_err(|source| Error::Io {
        op: "creating the run's temp dir".into(),
        source,
    })
}

/// Starts the server and writes its admin kubeconfig to `dir/kubeconfig` (0600) for the
/// processes under test.
pub async fn start(dir: &Path) -> Result<(RunningApiServer, PathBuf), Error> {
    apiserver::install_crypto_provider();
    let server = apiserver::ApiServer::start(apiserver::Config::default()).await?;
    let kubeconfig = dir.join("kubeconfig");
    apiserver::write_private(&kubeconfig, server.kubeconfig_yaml().as_bytes()).map_err(
        |source| Error::Io {
            op: format!("writing {}", kubeconfig.display()),
            source,
        },
    )?;
    Ok((server, kubeconfig))
}

/// An admin client without a rate limit that sends `user_agent`: the benchmark's own (which
/// the write accounting leaves out by it), or an in-process component's.
pub fn client(server: &RunningApiServer, user_agent: &str) -> Result<Client, Error> {
    component_runtime::rate_limited(server.kube_config()?, user_agent, -1.0, 0)
        .map_err(Error::Client)
}

/// Runs `f` over `items` with at most `parallelism` in flight; the first error ends it: how a
/// scenario creates its objects.
pub async fn bounded<T, F, Fut>(
    items: impl Iterator<Item = T>,
    parallelism: usize,
    f: F,
) -> Result<(), Error>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    use futures::TryStreamExt as _;
    futures::stream::iter(items.map(Ok))
        .try_for_each_concurrent(parallelism.max(1), f)
        .await
}

/// Deletes each of `names` through `api`, `parallelism` calls in flight: each name with the
/// instant just before its call, the start a delete latency is timed from. `what` names the
/// kind in errors ("pod", "PVC").
pub async fn delete_timed<K>(
    api: &kube::Api<K>,
    names: impl IntoIterator<Item = String>,
    parallelism: usize,
    what: &str,
) -> Result<Vec<(String, std::time::Instant)>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use futures::{StreamExt as _, TryStreamExt as _};
    futures::stream::iter(names)
        .map(|name| async move {
            let start = std::time::Instant::now();
            api.delete(&name, &kube::api::DeleteParams::default())
                .await
                .map_err(|source| Error::Kube {
                    op: format!("deleting {what} {name}"),
                    source,
                })?;
            Ok::<_, Error>((name, start))
        })
        .buffer_unordered(parallelism.max(1))
        .try_collect()
        .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[tokio::test]
    async fn the_server_audits_and_its_kubeconfig_is_private() {
        let dir = run_dir("csi-bench-test-", None).unwrap();
        assert!(
            dir.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("csi-bench-test-")
        );
        let (server, kubeconfig) = start(dir.path()).await.unwrap();
        let mode = std::fs::metadata(&kubeconfig).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(server.url().starts_with("https://127.0.0.1:"));
        let c = client(&server, "csi-bench-test/1").unwrap();
        let ns: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(c.clone());
        ns.list(&Default::default()).await.unwrap();
        // Timed deletes: each name once, its start before the call; an unknown one is an error
        // that names it.
        let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(c.clone(), "default");
        for name in ["a", "b", "c"] {
            let cm =
                serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
            cms.create(&Default::default(), &cm).await.unwrap();
        }
        let before = std::time::Instant::now();
        let mut deleted = delete_timed(&cms, ["a", "b", "c"].map(String::from), 2, "config map")
            .await
            .unwrap();
        deleted.sort();
        assert_eq!(
            deleted.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert!(deleted.iter().all(|(_, at)| *at >= before));
        assert!(
            cms.list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        let err = delete_timed(&cms, ["nope".to_string()], 1, "config map")
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("deleting config map nope"),
            "{err}"
        );
        let audit = server.audit();
        assert!(
            audit
                .iter()
                .any(|r| r.user_agent == "csi-bench-test/1" && r.verb == "list"),
            "the request is in the audit trail with its User-Agent"
        );
        server.shutdown().await.unwrap();
    }
}
