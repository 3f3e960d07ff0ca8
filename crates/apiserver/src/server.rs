//! Starting and stopping the server: the TLS listener, the shared state, the kubeconfigs and the
//! in-process `kube::Client`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Error;
use crate::app::App;
use crate::audit::{AuditLog, AuditRecord};
use crate::auth::{self, ADMIN_USER, Pki, Tokens};
use crate::config::Config;
use crate::handlers;
use crate::resources::{self, ResourceId};
use crate::store::{Mutation, Store, StoreConfig};

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
        crate::install_crypto_provider();
        let pki = Pki::load_or_mint(config.data_dir.as_deref(), addr.ip())?;
        let tokens = Tokens::load(
            config.token_auth_file.as_deref(),
            config.data_dir.as_deref(),
        )?;
        let admin_token = tokens.token_for(ADMIN_USER, &["system:masters"])?;
        let url = format!("https://{addr}");
        let kubeconfig = kubeconfig_yaml(&url, &pki.ca_pem, ADMIN_USER, &admin_token);
        if let Some(path) = &config.kubeconfig_out {
            auth::write_private(path, kubeconfig.as_bytes()).map_err(|source| {
                Error::Kubeconfig {
                    path: path.clone(),
                    source,
                }
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
            tokens,
            ca_pem: pki.ca_pem.clone(),
            ca_der: pki.ca_der.clone(),
        });
        let router = Router::new()
            .fallback(handlers::dispatch)
            .with_state(app.clone());
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
        let task = tokio::spawn(serve_tls(listener, acceptor, router, shutdown_rx));
        let kube_config = client_config(&url, &pki.ca_der, &admin_token)?;
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
    /// `https://127.0.0.1:PORT` (every request needs a token: see [`Self::kube_config`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client for this server (cheap to clone), authenticated as the admin
    /// ([`ADMIN_USER`], group `system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A kubeconfig (YAML) whose current context points at this server: the CA inline and the
    /// admin's token.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig.clone()
    }

    /// A kubeconfig for `user` (its own token, minted on first use), so the audit trail names
    /// it. With a data directory the token is kept across restarts.
    pub fn kubeconfig_yaml_for(&self, user: &str) -> Result<String, Error> {
        self.kubeconfig_yaml_for_member(user, &[])
    }

    /// [`Self::kubeconfig_yaml_for`] a `user` in `groups` (a kubelet's `system:node:<name>` in
    /// `system:nodes`, a service account in `system:serviceaccounts`), as a
    /// `--token-auth-file` line names them. A user keeps the groups of its first token.
    pub fn kubeconfig_yaml_for_member(&self, user: &str, groups: &[&str]) -> Result<String, Error> {
        let token = self.app.tokens.token_for(user, groups)?;
        Ok(kubeconfig_yaml(&self.url, &self.app.ca_pem, user, &token))
    }

    /// The admin's client configuration (CA and token set), to customise before building a
    /// client (user agent, timeouts).
    pub fn kube_config(&self) -> Result<kube::Config, Error> {
        self.kube_config_for(ADMIN_USER)
    }

    /// The admin's client configuration with `user_agent` as its User-Agent, so the audit
    /// trail tells its requests from every other client's (a controller under test, the test
    /// itself).
    pub fn kube_config_as(&self, user_agent: &str) -> Result<kube::Config, Error> {
        let mut config = self.kube_config()?;
        let agent = http::HeaderValue::from_str(user_agent).map_err(|e| Error::Client {
            url: self.url.clone(),
            reason: format!("User-Agent {user_agent:?}: {e}"),
        })?;
        config.headers.push((http::header::USER_AGENT, agent));
        Ok(config)
    }

    /// Writes the admin's kubeconfig to `dir/kubeconfig` (mode 0600, it holds a token), for a
    /// process started with `--kubeconfig`; the path written. Written aside and renamed into
    /// place: a process reading it while it is written again never sees half a file.
    pub fn write_kubeconfig(&self, dir: &std::path::Path) -> Result<std::path::PathBuf, Error> {
        let path = dir.join("kubeconfig");
        // Unique per call: two writers in one process never share the file aside.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let aside = dir.join(format!(".kubeconfig.{}.{seq}", std::process::id()));
        crate::write_private(&aside, self.kubeconfig.as_bytes())
            .and_then(|()| std::fs::rename(&aside, &path))
            .map_err(|source| {
                // Nothing of a failed write stays behind (the token is in it).
                let _ = std::fs::remove_file(&aside);
                Error::Kubeconfig {
                    path: path.clone(),
                    source,
                }
            })?;
        Ok(path)
    }

    /// A client configuration authenticated as `user` (see [`Self::kubeconfig_yaml_for`]).
    pub fn kube_config_for(&self, user: &str) -> Result<kube::Config, Error> {
        let groups: &[&str] = if user == ADMIN_USER {
            &["system:masters"]
        } else {
            &[]
        };
        let token = self.app.tokens.token_for(user, groups)?;
        client_config(&self.url, &self.app.ca_der, &token)
    }

    /// The CA certificate (PEM) that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.app.ca_pem
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

    /// How many requests the audit record holds (`audit().len()` without copying it).
    pub fn audit_len(&self) -> usize {
        self.app.audit.len()
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

/// Accepts TLS connections and serves HTTP/1.1 and HTTP/2 on them until `stop`, then waits for
/// open connections to finish (watches end on `stop` too).
async fn serve_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: Router,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|v| *v) => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of file descriptors and the like: wait a little, as hyper's servers do.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, builder) = (acceptor.clone(), builder.clone());
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            let _ = watcher.watch(conn.into_owned()).await;
        });
    }
    graceful.shutdown().await;
    Ok(())
}

/// A kube client configuration for `url` that trusts `ca_der` and sends `token`.
fn client_config(url: &str, ca_der: &[u8], token: &str) -> Result<kube::Config, Error> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| Error::Client {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    let mut config = kube::Config::new(uri);
    config.root_cert = Some(vec![ca_der.to_vec()]);
    config.auth_info =
        serde_json::from_value(json!({ "token": token })).map_err(|e| Error::Client {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    Ok(config)
}

pub(crate) fn kubeconfig_yaml(url: &str, ca_pem: &str, user: &str, token: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    // Users are quoted (names like `system:node:x` hold colons).
    let user = serde_json::Value::String(user.to_string());
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: apiserver-lite
  cluster:
    server: {url}
    certificate-authority-data: {ca}
contexts:
- name: apiserver-lite
  context:
    cluster: apiserver-lite
    user: {user}
    namespace: default
current-context: apiserver-lite
users:
- name: {user}
  user:
    token: {token}
preferences: {{}}
"
    )
}
