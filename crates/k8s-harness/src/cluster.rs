//! [`Cluster`]: start, wait, hand out identities, tear down.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::api::{Api, PostParams};

use crate::Error;
use crate::assets::{self, Assets};
use crate::components as comp;
use crate::kubeconfig::{self, Credentials};
use crate::pki::{self, Pki};
use crate::process::{self, Proc, Spawner};
use crate::teardown;

const APISERVER_READY: Duration = Duration::from_secs(120);
const NODE_READY: Duration = Duration::from_secs(150);
const CONTAINERD_READY: Duration = Duration::from_secs(60);
const DEFAULT_SERVICE_ACCOUNT: Duration = Duration::from_secs(60);
/// Where `Drop` copies the components' logs, when set.
pub const LOGS_ENV: &str = "CSI_RS_K8S_LOGS";
/// Lines of a component's log an error message carries.
const LOG_TAIL: usize = 25;

/// What to run besides etcd and kube-apiserver.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    controllers: Option<String>,
    scheduler: bool,
    node: Option<String>,
    apiserver_args: Vec<String>,
    controller_manager_args: Vec<String>,
    kubelet_args: Vec<String>,
}

impl ClusterOptions {
    /// etcd and kube-apiserver only.
    pub fn control_plane() -> Self {
        Self::default()
    }

    /// Everything: kube-controller-manager with `controllers` (its `--controllers`, e.g.
    /// `"*"` or `"*,-attachdetach"`), kube-scheduler, containerd and a kubelet named `node`.
    pub fn full(controllers: &str, node: &str) -> Self {
        Self::default()
            .controller_manager(controllers)
            .scheduler()
            .node(node)
    }

    /// Runs kube-controller-manager with `--controllers=<controllers>`.
    pub fn controller_manager(mut self, controllers: &str) -> Self {
        self.controllers = Some(controllers.to_string());
        self
    }

    /// Runs kube-scheduler.
    pub fn scheduler(mut self) -> Self {
        self.scheduler = true;
        self
    }

    /// Runs containerd and a kubelet that registers the Node `name`.
    pub fn node(mut self, name: &str) -> Self {
        self.node = Some(name.to_string());
        self
    }

    /// One more kube-apiserver flag (`--feature-gates=...`, `--v=4`, ...); a later flag wins.
    pub fn apiserver_arg(mut self, arg: &str) -> Self {
        self.apiserver_args.push(arg.to_string());
        self
    }

    /// One more kube-controller-manager flag.
    pub fn controller_manager_arg(mut self, arg: &str) -> Self {
        self.controller_manager_args.push(arg.to_string());
        self
    }

    /// One more kubelet flag.
    pub fn kubelet_arg(mut self, arg: &str) -> Self {
        self.kubelet_args.push(arg.to_string());
        self
    }

    /// Whether kcm will create each namespace's `default` ServiceAccount (pods need it).
    fn runs_serviceaccount_controller(&self) -> bool {
        self.controllers.as_deref().is_some_and(|c| {
            let items: Vec<&str> = c.split(',').map(str::trim).collect();
            !items.contains(&"-serviceaccount")
                && (items.contains(&"*") || items.contains(&"serviceaccount"))
        })
    }
}

/// The node part of a running cluster.
#[derive(Debug)]
struct NodeParts {
    name: String,
    ip: std::net::IpAddr,
    root_dir: PathBuf,
    containerd_socket: PathBuf,
    ctr: PathBuf,
}

/// A running cluster; everything stops on drop (also when the test panics).
#[derive(Debug)]
pub struct Cluster {
    // Field order matters only for `dir`, which `Drop` takes out and removes itself.
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    server: String,
    pki: Pki,
    admin_kubeconfig: PathBuf,
    node: Option<NodeParts>,
    procs: Vec<Proc>,
    spawner: Spawner,
    startup: Vec<(String, Duration)>,
}

impl Cluster {
    /// Starts what `options` asks for and waits until it serves: `/readyz`, the `default`
    /// ServiceAccount when kcm creates it, the Node `Ready` when a kubelet runs.
    /// [`Error::Missing`] when a binary is not installed (nothing was started then).
    pub async fn start(options: ClusterOptions) -> Result<Cluster, Error> {
        let t0 = Instant::now();
        let assets = Assets::from_env()?;
        let etcd = assets.etcd()?;
        let openssl = assets::on_path("openssl", "openssl")?;
        let node_tools = match &options.node {
            Some(_) => {
                if !rustix::process::geteuid().is_root() {
                    return Err(Error::Missing(
                        "root, to run containerd and the kubelet (they mount and make cgroups)"
                            .into(),
                    ));
                }
                if !assets.pause_image.is_file() {
                    return Err(Error::Missing(format!(
                        "the pause image {} (set {} to a docker-archive of {})",
                        assets.pause_image.display(),
                        assets::PAUSE_IMAGE_ENV,
                        comp::PAUSE_IMAGE
                    )));
                }
                let cni = Path::new(assets::CNI_BIN_DIR).join("loopback");
                if !cni.is_file() {
                    return Err(Error::Missing(format!(
                        "{} (install containernetworking-plugins)",
                        cni.display()
                    )));
                }
                assets::on_path("runc", "runc")?;
                assets::on_path("containerd-shim-runc-v2", "containerd")?;
                Some((
                    assets::on_path("containerd", "containerd")?,
                    assets::on_path("ctr", "containerd")?,
                ))
            }
            None => None,
        };
        install_crypto_provider();

        let dir = tempfile::Builder::new()
            .prefix("k8s-")
            .tempdir()
            .map_err(|e| Error::io("creating the cluster's temp dir".into(), e))?;
        let root = dir
            .path()
            .canonicalize()
            .map_err(|e| Error::io("resolving the temp dir".into(), e))?;
        write(&root.join(teardown::OWNER_FILE), &teardown::owner_stamp())?;
        for swept in teardown::sweep_orphans(root.parent().unwrap_or(Path::new("/tmp"))) {
            eprintln!(
                "k8s-harness: cleaned up {}, left by a test process that died",
                swept.display()
            );
        }
        let pki = Pki::create(&root.join("pki"), openssl)?;
        let ports = process::free_ports(6)?;
        let (etcd_client, etcd_peer, api_port, kcm_port, sched_port, _spare) =
            (ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]);
        let server = format!("https://127.0.0.1:{api_port}");
        let mut cluster = Cluster {
            dir: Some(dir),
            root: root.clone(),
            server: server.clone(),
            admin_kubeconfig: root.join("admin.kubeconfig"),
            pki,
            node: None,
            procs: Vec::new(),
            spawner: Spawner::new()?,
            startup: Vec::new(),
        };
        let logs = root.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| Error::io(format!("creating {}", logs.display()), e))?;

        // PKI and kubeconfigs.
        let serving = cluster.pki.issue(
            "apiserver",
            "kube-apiserver",
            &[],
            &[
                "IP:127.0.0.1",
                "IP:10.96.0.1",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ],
        )?;
        let kubelet_client = cluster.pki.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
            &[],
        )?;
        let (sa_key, sa_pub) = cluster.pki.service_account_keys()?;
        let admin = cluster
            .pki
            .issue("admin", "kubernetes-admin", &["system:masters"], &[])?;
        cluster.write_cert_kubeconfig(&cluster.admin_kubeconfig, "kubernetes-admin", &admin)?;
        cluster.mark("pki", t0);

        // etcd, kube-apiserver and (for a node) containerd at once: the apiserver waits for
        // etcd by itself, and containerd needs neither.
        let t = Instant::now();
        let etcd_args = comp::etcd_args(&root.join("etcd"), etcd_client, etcd_peer);
        cluster.procs.push(Proc::start(
            &cluster.spawner,
            "etcd",
            &etcd,
            &etcd_args,
            logs.join("etcd.log"),
        )?);
        let api_args: Vec<String> = comp::apiserver_args(
            &comp::ApiserverFiles {
                ca: &cluster.pki.ca.cert,
                serving_cert: &serving.cert,
                serving_key: &serving.key,
                kubelet_client_cert: &kubelet_client.cert,
                kubelet_client_key: &kubelet_client.key,
                sa_key: &sa_key,
                sa_pub: &sa_pub,
            },
            api_port,
            etcd_client,
        )
        .into_iter()
        .chain(options.apiserver_args.iter().cloned())
        .collect();
        cluster.procs.push(Proc::start(
            &cluster.spawner,
            "kube-apiserver",
            &assets.kube_apiserver,
            &api_args,
            logs.join("kube-apiserver.log"),
        )?);
        if let (Some(name), Some((containerd, ctr))) = (&options.node, &node_tools) {
            cluster.start_containerd(name, containerd, ctr, &logs)?;
        }
        let admin_client = cluster.admin_client().await?;
        cluster
            .wait_for(
                "kube-apiserver",
                "/readyz to answer ok",
                APISERVER_READY,
                || async { readyz(&admin_client).await },
            )
            .await?;
        cluster.mark("etcd + kube-apiserver ready", t);

        if let Some(controllers) = &options.controllers {
            let kcm = cluster.pki.issue(
                "kube-controller-manager",
                "system:kube-controller-manager",
                &[],
                &[],
            )?;
            let kc = root.join("kube-controller-manager.kubeconfig");
            cluster.write_cert_kubeconfig(&kc, "system:kube-controller-manager", &kcm)?;
            let args: Vec<String> = comp::controller_manager_args(
                &comp::ControllerManagerFiles {
                    kubeconfig: &kc,
                    ca: &cluster.pki.ca.cert,
                    ca_key: &cluster.pki.ca.key,
                    sa_key: &sa_key,
                    cert_dir: &root.join("kcm-certs"),
                },
                controllers,
                kcm_port,
            )
            .into_iter()
            .chain(options.controller_manager_args.iter().cloned())
            .collect();
            cluster.procs.push(Proc::start(
                &cluster.spawner,
                "kube-controller-manager",
                &assets.kube_controller_manager,
                &args,
                logs.join("kube-controller-manager.log"),
            )?);
        }
        if options.scheduler {
            let sched = cluster
                .pki
                .issue("kube-scheduler", "system:kube-scheduler", &[], &[])?;
            let kc = root.join("kube-scheduler.kubeconfig");
            cluster.write_cert_kubeconfig(&kc, "system:kube-scheduler", &sched)?;
            let args = comp::scheduler_args(&kc, sched_port, &root.join("scheduler-certs"));
            cluster.procs.push(Proc::start(
                &cluster.spawner,
                "kube-scheduler",
                &assets.kube_scheduler,
                &args,
                logs.join("kube-scheduler.log"),
            )?);
        }
        if options.node.is_some() {
            let t = Instant::now();
            cluster
                .start_kubelet(&assets, &options.kubelet_args, &logs, &admin_client)
                .await?;
            cluster.mark("kubelet: node Ready", t);
        }
        if options.runs_serviceaccount_controller() {
            let t = Instant::now();
            let sas: Api<ServiceAccount> = Api::namespaced(admin_client.clone(), "default");
            cluster
                .wait_for(
                    "kube-controller-manager",
                    "the ServiceAccount default/default",
                    DEFAULT_SERVICE_ACCOUNT,
                    || async { sas.get_opt("default").await.ok().flatten().map(|_| ()) },
                )
                .await?;
            cluster.mark("kcm: default ServiceAccount", t);
        }
        cluster.mark("total", t0);
        eprintln!(
            "k8s-harness: cluster at {} in {}: {}",
            cluster.server,
            root.display(),
            cluster.startup_summary()
        );
        Ok(cluster)
    }

    /// [`Cluster::start`] for a test: `None` after `test_support::skip_or_fail` when a binary
    /// is missing (a failure under `CSI_RS_REQUIRE_ALL`); panics when the cluster does not
    /// come up (the message has the failing component's log).
    #[track_caller]
    pub fn start_or_skip(
        options: ClusterOptions,
    ) -> impl std::future::Future<Output = Option<Cluster>> {
        let caller = std::panic::Location::caller();
        async move {
            match Cluster::start(options).await {
                Ok(c) => Some(c),
                Err(Error::Missing(what)) => {
                    test_support::skip_or_fail(&format!("real Kubernetes test: {what}"));
                    None
                }
                Err(e) => panic!("{caller}: the test cluster did not start: {e}"),
            }
        }
    }

    fn start_containerd(
        &mut self,
        _node: &str,
        containerd: &Path,
        ctr: &Path,
        logs: &Path,
    ) -> Result<(), Error> {
        let d = self.root.join("containerd");
        let net_d = d.join("net.d");
        std::fs::create_dir_all(&net_d)
            .map_err(|e| Error::io(format!("creating {}", net_d.display()), e))?;
        write(
            &net_d.join("10-loopback.conflist"),
            comp::CNI_LOOPBACK_CONFLIST,
        )?;
        let socket = d.join("containerd.sock");
        let config = d.join("config.toml");
        write(&config, &comp::containerd_config(&d, &socket, &net_d))?;
        let args = vec![format!("--config={}", config.display())];
        self.procs.push(Proc::start(
            &self.spawner,
            "containerd",
            containerd,
            &args,
            logs.join("containerd.log"),
        )?);
        self.node = Some(NodeParts {
            name: _node.to_string(),
            ip: comp::host_ip(),
            root_dir: self.root.join("kubelet"),
            containerd_socket: socket,
            ctr: ctr.to_path_buf(),
        });
        Ok(())
    }

    async fn start_kubelet(
        &mut self,
        assets: &Assets,
        extra: &[String],
        logs: &Path,
        admin: &kube::Client,
    ) -> Result<(), Error> {
        let Some(node) = &self.node else {
            return Ok(());
        };
        let (name, ip, root_dir, socket, ctr) = (
            node.name.clone(),
            node.ip,
            node.root_dir.clone(),
            node.containerd_socket.clone(),
            node.ctr.clone(),
        );
        let t = Instant::now();
        let ctr_version = {
            let (ctr, socket) = (ctr.clone(), socket.clone());
            move || {
                std::process::Command::new(&ctr)
                    .arg("-a")
                    .arg(&socket)
                    .arg("version")
                    .output()
                    .ok()
                    .filter(|o| o.status.success())
                    .map(|_| ())
            }
        };
        self.wait_for(
            "containerd",
            "its socket to answer",
            CONTAINERD_READY,
            || {
                let check = ctr_version.clone();
                async move { check() }
            },
        )
        .await?;
        self.import_image(&assets.pause_image)?;
        self.mark("containerd + pause image", t);

        std::fs::create_dir_all(&root_dir)
            .map_err(|e| Error::io(format!("creating {}", root_dir.display()), e))?;
        share_mount(&root_dir)?;
        let cert = self.pki.issue(
            &format!("kubelet-{name}"),
            &format!("system:node:{name}"),
            &["system:nodes"],
            &[],
        )?;
        let kubeconfig = self.root.join(format!("kubelet-{name}.kubeconfig"));
        self.write_cert_kubeconfig(&kubeconfig, &format!("system:node:{name}"), &cert)?;
        let ports = process::free_ports(2)?;
        let config = self.root.join(format!("kubelet-{name}.config.json"));
        write(
            &config,
            &comp::kubelet_config(
                &self.pki.ca.cert,
                &root_dir,
                ip,
                &comp::KubeletPorts {
                    server: ports[0],
                    healthz: ports[1],
                },
            )?,
        )?;
        let args: Vec<String> = comp::kubelet_args(
            &comp::KubeletFiles {
                config: &config,
                kubeconfig: &kubeconfig,
                root_dir: &root_dir,
                containerd_socket: &socket,
            },
            &name,
            ip,
        )
        .into_iter()
        .chain(extra.iter().cloned())
        .collect();
        self.procs.push(Proc::start(
            &self.spawner,
            "kubelet",
            &assets.kubelet,
            &args,
            logs.join("kubelet.log"),
        )?);
        let nodes: Api<Node> = Api::all(admin.clone());
        self.wait_for(
            "kubelet",
            &format!("the Node {name} to be Ready"),
            NODE_READY,
            || async {
                let node = nodes.get_opt(&name).await.ok().flatten()?;
                let ready = node
                    .status?
                    .conditions?
                    .into_iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(())
            },
        )
        .await
    }

    /// Polls `check` every 250 ms until it returns `Some`; fails with the log of `component`
    /// after `patience`, or at once with the log of any component that exits meanwhile.
    async fn wait_for<T, F, Fut>(
        &mut self,
        component: &str,
        what: &str,
        patience: Duration,
        mut check: F,
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(v) = check().await {
                return Ok(v);
            }
            if let Some(p) = self
                .procs
                .iter_mut()
                .find_map(|p| p.exited().map(|s| (p.name.clone(), s, p.log.clone())))
            {
                return Err(Error::Start(format!(
                    "{} exited ({}) while waiting for {what}; last lines of {}:\n{}",
                    p.0,
                    p.1,
                    p.2.display(),
                    process::tail(&p.2, LOG_TAIL)
                )));
            }
            if Instant::now() >= deadline {
                let log = self.log_path(component);
                return Err(Error::Start(format!(
                    "{component}: no {what} after {patience:?}; last lines of {}:\n{}",
                    log.display(),
                    process::tail(&log, LOG_TAIL)
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn mark(&mut self, step: &str, since: Instant) {
        self.startup.push((step.to_string(), since.elapsed()));
    }

    fn startup_summary(&self) -> String {
        self.startup
            .iter()
            .map(|(s, d)| format!("{s} {:.1}s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn write_cert_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        cert: &pki::CertFiles,
    ) -> Result<(), Error> {
        kubeconfig::write(
            path,
            &self.server,
            &self.pki.ca.cert,
            user,
            Credentials::Cert {
                cert: &cert.cert,
                key: &cert.key,
            },
        )
    }

    // ---- what tests use ----

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The cluster CA's certificate (PEM file): it signs the serving cert and every client cert.
    pub fn ca_cert(&self) -> &Path {
        &self.pki.ca.cert
    }

    /// A kubeconfig for `kubernetes-admin` (client cert, group `system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A kube client as the admin.
    pub async fn admin_client(&self) -> Result<kube::Client, Error> {
        client_from(&self.admin_kubeconfig).await
    }

    /// A kube client from a kubeconfig (one of [`Cluster::service_account_kubeconfig`] or
    /// [`Cluster::user_kubeconfig`]).
    pub async fn client(&self, kubeconfig: &Path) -> Result<kube::Client, Error> {
        client_from(kubeconfig).await
    }

    /// A kubeconfig that authenticates as the ServiceAccount `namespace/name` with a token
    /// from the TokenRequest API (valid 24 h); creates the namespace and the ServiceAccount
    /// when they do not exist. It has exactly the RBAC the test grants that account.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, Error> {
        let admin = self.admin_client().await?;
        let what = |s: &str| format!("{s} for ServiceAccount {namespace}/{name}");
        let ns = Namespace {
            metadata: kube::core::ObjectMeta {
                name: Some(namespace.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        ignore_conflict(
            Api::<Namespace>::all(admin.clone())
                .create(&PostParams::default(), &ns)
                .await
                .map(|_| ()),
        )
        .map_err(|e| Error::kube(what("creating the namespace"), e))?;
        let sas: Api<ServiceAccount> = Api::namespaced(admin, namespace);
        let sa = ServiceAccount {
            metadata: kube::core::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        ignore_conflict(sas.create(&PostParams::default(), &sa).await.map(|_| ()))
            .map_err(|e| Error::kube(what("creating the account"), e))?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = sas
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(|e| Error::kube(what("TokenRequest"), e))?
            .status
            .map(|s| s.token)
            .ok_or_else(|| Error::Invalid(what("TokenRequest answer without status.token")))?;
        let path = self.root.join(format!("sa-{namespace}-{name}.kubeconfig"));
        let user = format!("system:serviceaccount:{namespace}:{name}");
        kubeconfig::write(
            &path,
            &self.server,
            &self.pki.ca.cert,
            &user,
            Credentials::Token(&token),
        )?;
        Ok(path)
    }

    /// A kubeconfig with a client cert for user `user` in `groups` (`O=`), signed by the
    /// cluster CA: e.g. `("system:node:n2", &["system:nodes"])` for a second node's identity.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf, Error> {
        let stem: String = user
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let cert = self.pki.issue(&format!("user-{stem}"), user, groups, &[])?;
        let path = self.root.join(format!("user-{stem}.kubeconfig"));
        self.write_cert_kubeconfig(&path, user, &cert)?;
        Ok(path)
    }

    /// `kubectl <args>` (the kubectl on PATH) as the admin; stdout, or [`Error::Command`].
    pub fn kubectl(&self, args: &[&str]) -> Result<String, Error> {
        self.kubectl_as(&self.admin_kubeconfig, args, None)
    }

    /// `kubectl --kubeconfig <kubeconfig> <args>` with `stdin`; stdout, or [`Error::Command`]
    /// (its stderr has the server's message, e.g. `Forbidden`).
    pub fn kubectl_as(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, Error> {
        use std::io::Write;
        let kubectl = assets::on_path("kubectl", "kubectl")?;
        let mut cmd = std::process::Command::new(kubectl);
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(self.root.join("kubectl-cache"))
            .args(args);
        let shown = format!("kubectl {}", args.join(" "));
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::io(format!("running {shown}"), e))?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(stdin.unwrap_or_default().as_bytes())
                .map_err(|e| Error::io(format!("writing to {shown}"), e))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| Error::io(format!("running {shown}"), e))?;
        if !out.status.success() {
            return Err(Error::Command {
                command: shown,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON, several documents) as the admin.
    pub fn apply(&self, manifest: &str) -> Result<String, Error> {
        self.kubectl_as(
            &self.admin_kubeconfig,
            &["apply", "-f", "-"],
            Some(manifest),
        )
    }

    /// Imports a docker-archive / OCI `.tar` into the node's containerd (namespace `k8s.io`),
    /// so pods with `imagePullPolicy: Never` can run it.
    pub fn import_image(&self, tar: &Path) -> Result<(), Error> {
        let node = self.node.as_ref().ok_or_else(|| {
            Error::Invalid("import_image: this cluster has no node (ClusterOptions::node)".into())
        })?;
        let mut cmd = std::process::Command::new(&node.ctr);
        cmd.arg("-a")
            .arg(&node.containerd_socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tar);
        pki::run(cmd).map(|_| ())
    }

    /// The node's name, when a kubelet runs.
    pub fn node_name(&self) -> Option<&str> {
        self.node.as_ref().map(|n| n.name.as_str())
    }

    /// The node's InternalIP, where its kubelet serves: the host's own address (the kubelet
    /// refuses a loopback one), 127.0.0.1 only on a host without a route.
    pub fn node_ip(&self) -> Option<std::net::IpAddr> {
        self.node.as_ref().map(|n| n.ip)
    }

    /// The kubelet's `--root-dir` (plugins_registry, plugins, pods), when a kubelet runs.
    pub fn kubelet_root_dir(&self) -> Option<&Path> {
        self.node.as_ref().map(|n| n.root_dir.as_path())
    }

    /// containerd's socket, when a kubelet runs.
    pub fn containerd_socket(&self) -> Option<&Path> {
        self.node.as_ref().map(|n| n.containerd_socket.as_path())
    }

    /// The cluster's temp dir (PKI, kubeconfigs, logs, etcd, containerd, kubelet): removed on drop.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The log file of a component: `etcd`, `kube-apiserver`, `kube-controller-manager`,
    /// `kube-scheduler`, `containerd`, `kubelet`.
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.root.join("logs").join(format!("{component}.log"))
    }

    /// The last `lines` lines of a component's log (for assertion messages).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        process::tail(&self.log_path(component), lines)
    }

    /// (component, pid) of every process the cluster started.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.procs
            .iter()
            .map(|p| (p.name.clone(), p.pid()))
            .collect()
    }

    /// How long each start-up step took (also printed on start).
    pub fn startup_times(&self) -> &[(String, Duration)] {
        &self.startup
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let t = Instant::now();
        let pod_uids = self
            .node
            .as_ref()
            .map(|n| teardown::pod_uids(&n.root_dir))
            .unwrap_or_default();
        // The kubelet first: it would restart the containers removed next.
        if let Some(i) = self.procs.iter().position(|p| p.name == "kubelet") {
            process::stop_all(&mut self.procs[i..=i], Duration::from_secs(2));
        }
        if let Some(node) = &self.node {
            teardown::delete_containers(&node.ctr, &node.containerd_socket);
        }
        process::stop_all(&mut self.procs, Duration::from_secs(5));
        let strays = teardown::kill_processes_of(&self.root);
        teardown::wait_gone(&strays, Duration::from_secs(5));
        self.spawner.shutdown();
        self.keep_logs();
        let left = teardown::unmount_all_below(&self.root);
        teardown::remove_pod_logs(&pod_uids);
        match self.dir.take() {
            // Never delete through a mount that would not go: that would delete its contents.
            Some(dir) if !left.is_empty() => {
                let kept = dir.keep();
                eprintln!(
                    "k8s-harness: left {} in place, still mounted: {left:?}",
                    kept.display()
                );
            }
            Some(dir) => {
                if let Err(e) = dir.close() {
                    eprintln!("k8s-harness: removing {}: {e}", self.root.display());
                }
            }
            None => {}
        }
        eprintln!(
            "k8s-harness: cluster at {} torn down in {:.1}s",
            self.server,
            t.elapsed().as_secs_f64()
        );
    }
}

impl Cluster {
    /// With `CSI_RS_K8S_LOGS=DIR`, copies the components' logs to `DIR/<temp dir name>/`
    /// before the temp dir goes (to read what happened in a test that failed).
    fn keep_logs(&self) {
        let Some(to) = std::env::var_os(LOGS_ENV).filter(|d| !d.is_empty()) else {
            return;
        };
        let Some(name) = self.root.file_name() else {
            return;
        };
        let to = PathBuf::from(to).join(name);
        let _ = std::fs::create_dir_all(&to);
        if let Ok(rd) = std::fs::read_dir(self.root.join("logs")) {
            for e in rd.flatten() {
                let _ = std::fs::copy(e.path(), to.join(e.file_name()));
            }
        }
        eprintln!("k8s-harness: logs kept in {}", to.display());
    }
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// kube wants ring, aws-sdk pulls aws-lc-rs: in a workspace build rustls has both and
/// refuses to pick, so the process-wide default is set here (an error only means one is set).
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

async fn client_from(kubeconfig: &Path) -> Result<kube::Client, Error> {
    install_crypto_provider();
    let what = || format!("kubeconfig {}", kubeconfig.display());
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Invalid(format!("{}: {e}", what())))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Invalid(format!("{}: {e}", what())))?;
    kube::Client::try_from(config).map_err(|e| Error::kube(what(), e))
}

async fn readyz(client: &kube::Client) -> Option<()> {
    let req = http::Request::get("/readyz").body(Vec::new()).ok()?;
    let body = client.request_text(req).await.ok()?;
    (body.trim() == "ok").then_some(())
}

fn ignore_conflict(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => other,
    }
}

/// Makes `dir` a mount point of its own in a shared peer group, as systemd makes `/` on a
/// normal host. Node plugins in containers mount into the kubelet's root dir with
/// `mountPropagation: Bidirectional`, and a mount made in a container reaches the host only
/// through a shared mount; the sandboxes this runs in often have a private `/`. Teardown's
/// unmount of everything below the temp dir removes it.
fn share_mount(dir: &Path) -> Result<(), Error> {
    use rustix::mount::{MountPropagationFlags, mount_bind, mount_change};
    mount_bind(dir, dir).map_err(|e| {
        Error::io(
            format!(
                "bind-mounting the kubelet root {} onto itself",
                dir.display()
            ),
            e.into(),
        )
    })?;
    mount_change(
        dir,
        MountPropagationFlags::SHARED | MountPropagationFlags::REC,
    )
    .map_err(|e| {
        Error::io(
            format!("making the kubelet root {} a shared mount", dir.display()),
            e.into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_service_account_is_awaited_only_when_kcm_makes_it() {
        assert!(!ClusterOptions::control_plane().runs_serviceaccount_controller());
        assert!(ClusterOptions::full("*", "n").runs_serviceaccount_controller());
        assert!(
            ClusterOptions::control_plane()
                .controller_manager("*,-attachdetach")
                .runs_serviceaccount_controller()
        );
        assert!(
            !ClusterOptions::control_plane()
                .controller_manager("*,-serviceaccount")
                .runs_serviceaccount_controller()
        );
        assert!(
            ClusterOptions::control_plane()
                .controller_manager("serviceaccount, garbagecollector")
                .runs_serviceaccount_controller()
        );
        assert!(
            !ClusterOptions::control_plane()
                .controller_manager("garbagecollector")
                .runs_serviceaccount_controller()
        );
    }

    #[test]
    fn a_user_cert_names_the_user_and_groups() {
        let d = tempfile::tempdir().unwrap();
        let pki = Pki::create(d.path(), assets::on_path("openssl", "openssl").unwrap()).unwrap();
        let c = pki
            .issue("u", "system:node:n1", &["system:nodes", "extra"], &[])
            .unwrap();
        let text = std::process::Command::new("openssl")
            .args([
                "x509",
                "-noout",
                "-subject",
                "-ext",
                "extendedKeyUsage",
                "-in",
            ])
            .arg(&c.cert)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.contains("O = system:nodes, O = extra, CN = system:node:n1"),
            "{text}"
        );
        assert!(
            text.contains("Client Authentication") && !text.contains("Server"),
            "{text}"
        );
        let verify = std::process::Command::new("openssl")
            .arg("verify")
            .arg("-CAfile")
            .arg(&pki.ca.cert)
            .arg(&c.cert)
            .output()
            .unwrap();
        assert!(verify.status.success());
        let bad = pki.issue("b", "a/b", &[], &[]).unwrap_err().to_string();
        assert!(bad.contains("\"a/b\""), "{bad}");
    }
}
