//! Starting and stopping the server: the listener, the shared state, the kubeconfig and the
//! in-process `kube::Client`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Error;
use crate::audit::{AuditLog, AuditRecord};
use crate::handlers;
use crate::resources::{self, ResourceId};
use crate::store::{Mutation, Store, StoreConfig};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Keep objects across restarts in this directory (snapshot + write log).
    pub data_dir: Option<PathBuf>,
    /// Also write the kubeconfig here once listening.
    pub kubeconfig_out: Option<PathBuf>,
    /// Events kept for watch resume; a watch from an older resourceVersion gets 410 Gone.
    pub event_window: usize,
    /// Events buffered per watcher; a watcher that falls this far behind is closed.
    pub watcher_buffer: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Delete pods bound to a node gracefully (deletionTimestamp, then removal by a delete with
    /// grace period 0 from the kubelet's stand-in), as the real server does.
    pub graceful_pod_deletion: bool,
    /// Record every API request for [`RunningApiServer::audit`] (the last 1,000,000).
    pub audit: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: None,
            kubeconfig_out: None,
            event_window: 10_000,
            watcher_buffer: 10_000,
            bookmark_interval: Duration::from_secs(30),
            graceful_pod_deletion: true,
            audit: true,
        }
    }
}

/// State shared by every request.
pub(crate) struct App {
    pub store: Store,
    pub config: Config,
    pub addr: SocketAddr,
    pub namespaces: ResourceId,
    pub shutdown: watch::Receiver<bool>,
    pub metrics: crate::metrics::Metrics,
    pub audit: AuditLog,
}

/// The namespaces every cluster starts with.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

fn seed_namespaces(store: &Store, ns_res: ResourceId) -> Result<(), Error> {
    for ns in INITIAL_NAMESPACES {
        let key = (String::new(), ns.to_string());
        let obj = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": ns,
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": crate::http_util::now_rfc3339(),
                "labels": {"kubernetes.io/metadata.name": ns},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        });
        store
            .mutate(ns_res, &key, false, |cur| {
                Ok(if cur.is_some() {
                    Mutation::Unchanged
                } else {
                    Mutation::Put(obj)
                })
            })
            .map_err(|e| Error::Seed(e.message))?;
    }
    Ok(())
}

/// The embedded API server.
#[derive(Debug)]
pub struct ApiServer;

impl ApiServer {
    /// Binds, seeds the initial namespaces and serves in the background.
    pub async fn start(config: Config) -> Result<RunningApiServer, Error> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
        let store_config = StoreConfig {
            window: config.event_window.max(1),
            watcher_buffer: config.watcher_buffer.max(1),
        };
        let store = match &config.data_dir {
            Some(dir) => Store::open(store_config, dir)?,
            None => Store::new(store_config),
        };
        let ns_res = resources::find("", "v1", "namespaces")
            .ok_or_else(|| Error::Seed("namespaces are not a served resource".into()))?;
        seed_namespaces(&store, ns_res)?;
        let url = format!("http://{addr}");
        let kubeconfig = kubeconfig_yaml(&url);
        if let Some(path) = &config.kubeconfig_out {
            std::fs::write(path, &kubeconfig).map_err(|source| Error::Kubeconfig {
                path: path.clone(),
                source,
            })?;
        }
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let app = Arc::new(App {
            store,
            config,
            addr,
            namespaces: ns_res,
            shutdown: shutdown_rx.clone(),
            metrics: crate::metrics::Metrics::new(),
            audit: AuditLog::default(),
        });
        let router = Router::new()
            .fallback(handlers::dispatch)
            .with_state(app.clone());
        let mut stop = shutdown_rx;
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|v| *v).await;
                })
                .await
        });
        let kube_config =
            kube::Config::new(
                url.parse()
                    .map_err(|e: http::uri::InvalidUri| Error::Client {
                        url: url.clone(),
                        reason: e.to_string(),
                    })?,
            );
        crate::install_crypto_provider();
        let client = kube::Client::try_from(kube_config).map_err(|e| Error::Client {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        tracing::info!(%url, "apiserver-lite listening");
        Ok(RunningApiServer {
            addr,
            url,
            kubeconfig,
            client,
            shutdown: shutdown_tx,
            task: Some(task),
            app,
        })
    }
}

/// A started server. Dropping it stops serving new connections; `shutdown` also waits.
pub struct RunningApiServer {
    addr: SocketAddr,
    url: String,
    kubeconfig: String,
    client: kube::Client,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    app: Arc<App>,
}

impl std::fmt::Debug for RunningApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningApiServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl RunningApiServer {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client for this server (cheap to clone).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A kubeconfig (YAML) whose current context points at this server.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig.clone()
    }

    /// The current resourceVersion (etcd's revision).
    pub fn resource_version(&self) -> u64 {
        self.app.store.current_rv()
    }

    /// Open watch streams (for tests of the slow-watcher rule).
    pub fn watcher_count(&self) -> usize {
        self.app.store.watcher_count()
    }

    /// Every API request so far (oldest first, at most the last 1,000,000): who called what and
    /// the answer's code. Empty when `Config::audit` is off. Discovery, health and metrics
    /// requests are not recorded.
    pub fn audit(&self) -> Vec<AuditRecord> {
        self.app.audit.snapshot()
    }

    /// Forgets the records so far (e.g. after a test's setup, before the part it measures).
    pub fn audit_clear(&self) {
        self.app.audit.clear();
    }

    /// Stops accepting, ends every watch, waits for the server task and flushes persistence.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(r) => r.map_err(Error::Serve)?,
                Err(e) => return Err(Error::Serve(std::io::Error::other(e.to_string()))),
            }
        }
        self.app.store.flush();
        Ok(())
    }
}

impl Drop for RunningApiServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.app.store.flush();
    }
}

pub(crate) fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: apiserver-lite
  cluster:
    server: {url}
contexts:
- name: apiserver-lite
  context:
    cluster: apiserver-lite
    user: apiserver-lite
    namespace: default
current-context: apiserver-lite
users:
- name: apiserver-lite
  user: {{}}
preferences: {{}}
"
    )
}
