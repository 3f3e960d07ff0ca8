//! "A server" the kubectl and manifest suites run against: apiserver-lite, or the real
//! kube-apiserver v1.26 that `k8s-harness` starts (etcd + kube-apiserver only). Whatever one
//! accepts and the other refuses, or answers differently, is a bug in apiserver-lite; the
//! suites assert the same thing against both.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use apiserver::RunningApiServer;
use k8s_harness::{Cluster, ClusterOptions};

pub enum Server {
    Lite(RunningApiServer),
    Real(Box<Cluster>),
}

pub struct Target {
    pub server: Server,
    client: kube::Client,
}

impl Target {
    pub async fn lite() -> Target {
        // As kube-apiserver's defaults: the protection finalizers on new claims and PVs.
        let server = crate::common::start_with(apiserver::Config {
            storage_object_in_use_protection: true,
            ..apiserver::Config::default()
        })
        .await;
        let client = server.client();
        Target {
            server: Server::Lite(server),
            client,
        }
    }

    /// The real kube-apiserver, or `None` (skipped; a failure under `CSI_RS_REQUIRE_ALL`) when
    /// its binaries are not installed.
    pub async fn real() -> Option<Target> {
        let cluster = Cluster::start_or_skip(ClusterOptions::control_plane()).await?;
        let client = cluster.admin_client().await.unwrap();
        Some(Target {
            server: Server::Real(Box::new(cluster)),
            client,
        })
    }

    pub fn is_real(&self) -> bool {
        matches!(self.server, Server::Real(_))
    }

    pub fn name(&self) -> &'static str {
        if self.is_real() {
            "kube-apiserver"
        } else {
            "apiserver-lite"
        }
    }

    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Writes a kubeconfig for this server (the admin's, for the real one) to `path`.
    pub fn write_kubeconfig(&self, path: &Path) {
        match &self.server {
            Server::Lite(s) => std::fs::write(path, s.kubeconfig_yaml()).unwrap(),
            Server::Real(c) => {
                std::fs::copy(c.admin_kubeconfig(), path).unwrap();
            }
        }
    }

    /// A client that sends `token` as its bearer token (and no client certificate).
    pub async fn client_with_token(&self, token: &str) -> kube::Client {
        let mut config = match &self.server {
            Server::Lite(s) => s.kube_config().unwrap(),
            Server::Real(c) => {
                let kc = kube::config::Kubeconfig::read_from(c.admin_kubeconfig()).unwrap();
                kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .unwrap()
            }
        };
        config.auth_info = serde_json::from_value(serde_json::json!({ "token": token })).unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// The `minor` of the server's `/version`.
    pub fn minor(&self) -> &'static str {
        if self.is_real() { "26" } else { "34" }
    }

    /// Waits until some watch is open, where the server can tell (apiserver-lite); the real
    /// server cannot, so callers repeat their change until the watcher sees it.
    pub async fn watch_opened(&self) {
        if let Server::Lite(s) = &self.server {
            let open = tokio::time::timeout(Duration::from_secs(30), async {
                while s.watcher_count() == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            assert!(open.is_ok(), "a watch opened within 30s");
        }
    }

    /// What a namespace needs before pods go in: the real server's ServiceAccount admission
    /// refuses a pod whose namespace has no `default` ServiceAccount, which kcm (not run
    /// here) would create.
    pub async fn prepare_namespace(&self, namespace: &str) {
        if !self.is_real() {
            return;
        }
        use k8s_openapi::api::core::v1::ServiceAccount;
        use kube::api::{Api, PostParams};
        let sas: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let sa = ServiceAccount {
            metadata: kube::core::ObjectMeta {
                name: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        // The real kube-apiserver's bootstrap controller creates `default` (and
        // the other system namespaces) a moment after the server starts serving,
        // so a 404 for the namespace right after start-up is retried until it
        // shows up.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match sas.create(&PostParams::default(), &sa).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 409 => return,
                Err(kube::Error::Api(s))
                    if s.code == 404 && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => panic!("creating {namespace}/default ServiceAccount: {e}"),
            }
        }
    }
}
