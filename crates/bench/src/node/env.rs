//! One scenario's world: the in-process control plane and, per node, the driver, registrar and
//! node agent processes. [`Env::shutdown`] stops it all in order; if the run fails or is
//! interrupted, dropping the [`Env`] kills the processes, cancels the control plane, unmounts
//! what is left below the temp dir (umount, else umount -l), releases ec2-sim's loop devices and removes
//! the temp dir.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Error, LoadConfig, Scenario, ebs};
use crate::harness::objects::OwnWrites;
use crate::harness::procfs::Memory;
use crate::harness::{
    self,
    child::{self, Child},
};
pub(crate) use mount_utils::below::{mounts_below, unmount_below};

/// One node's processes and paths.
pub(crate) struct Node {
    pub(crate) name: String,
    /// The driver's socket (the registrar and, for hostpath, CreateVolume use it).
    pub(crate) socket: PathBuf,
    /// EC2 instance ID (ebs) or the node name (hostpath): the driver's node ID.
    pub(crate) node_id: String,
    driver: Option<Child>,
    registrar: Option<Child>,
    agent: Option<Child>,
}

impl Node {
    pub(crate) fn agent_memory(&self) -> Result<Memory, Error> {
        match &self.agent {
            Some(a) => a.memory(),
            None => Err(Error::Other(format!("{}: no agent running", self.name))),
        }
    }

    pub(crate) fn agent_cpu(&self) -> Option<Duration> {
        self.agent.as_ref().and_then(Child::cpu)
    }

    pub(crate) fn driver_cpu(&self) -> Option<Duration> {
        self.driver.as_ref().and_then(Child::cpu)
    }

    pub(crate) fn driver_memory(&self) -> Option<Memory> {
        self.driver.as_ref().and_then(|d| d.memory().ok())
    }

    fn procs_mut(&mut self) -> impl Iterator<Item = &mut Child> {
        [&mut self.agent, &mut self.registrar, &mut self.driver]
            .into_iter()
            .filter_map(Option::as_mut)
    }
}

/// CPU seconds by who spent them (see [`Env::cpu_split`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CpuSplit {
    pub agents_s: f64,
    pub drivers_s: f64,
    pub node_load_s: f64,
}

impl CpuSplit {
    pub(crate) fn since(self, earlier: CpuSplit) -> CpuSplit {
        CpuSplit {
            agents_s: self.agents_s - earlier.agents_s,
            drivers_s: self.drivers_s - earlier.drivers_s,
            node_load_s: self.node_load_s - earlier.node_load_s,
        }
    }
}

/// What the teardown found.
pub(crate) struct Teardown {
    /// Mounts below the temp dir after every process stopped (0 after a clean run).
    pub(crate) mounts_left: usize,
}

pub(crate) struct Env {
    pub(crate) kube: Client,
    pub(crate) nodes: Vec<Node>,
    pub(crate) ebs: Option<ebs::Ebs>,
    pub(crate) driver_name: &'static str,
    attacher_workers: usize,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    server: Option<apiserver::RunningApiServer>,
    log_dir: PathBuf,
    /// Declared last: removed after everything else went.
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
}

impl Env {
    pub(crate) async fn start(config: &LoadConfig, scenario: Scenario) -> Result<Env, Error> {
        let io = |op: String| move |source| Error::Io { op, source };
        let dir = harness::api::run_dir("csi-bench-node-", config.temp_parent.as_deref())?;
        let root = mount_utils::findmnt::canonical(dir.path());
        let log_dir = match &config.log_dir {
            Some(d) => d.join(scenario.name()),
            None => root.join("logs"),
        };
        std::fs::create_dir_all(&log_dir)
            .map_err(io(format!("creating the log dir {}", log_dir.display())))?;
        let (server, kubeconfig) = harness::api::start(&root).await?;
        let kube = harness::api::client(&server, super::USER_AGENT)?;
        let mut env = Env {
            kube,
            nodes: Vec::new(),
            ebs: None,
            driver_name: scenario.driver_name(),
            attacher_workers: config.attacher_workers,
            stop: CancellationToken::new(),
            tasks: Vec::new(),
            server: Some(server),
            log_dir,
            dir: Some(dir),
            root,
        };
        env.create_csidriver(scenario.attach_required()).await?;
        if scenario.is_ebs() {
            let per_node = config.pods.div_ceil(config.nodes);
            env.ebs = Some(
                ebs::Ebs::start(
                    &env.root,
                    &env.log_dir,
                    &config.binaries.ebs_driver,
                    config.nodes,
                    per_node,
                )
                .await?,
            );
        }
        env.start_adc(&kubeconfig, scenario);
        for i in 0..config.nodes {
            env.start_node(config, scenario, &kubeconfig, i).await?;
        }
        if scenario.attach_required() {
            env.start_attacher(scenario).await?;
        }
        env.wait_registered(config.timeout).await?;
        Ok(env)
    }

    async fn create_csidriver(&self, attach_required: bool) -> Result<(), Error> {
        let driver = json!({
            "metadata": {"name": self.driver_name},
            "spec": {"attachRequired": attach_required, "podInfoOnMount": false},
        });
        let drivers: Api<CSIDriver> = Api::all(self.kube.clone());
        OwnWrites::default()
            .create(&drivers, driver)
            .await
            .map(drop)
    }

    /// The attach/detach controller in-process, as kube-controller-manager runs it (100 ms
    /// reconciler period, its backoff) but without client rate limits.
    fn start_adc(&mut self, kubeconfig: &Path, scenario: Scenario) {
        let options = attach_detach::Options {
            skip_attach: scenario.skip_attach(),
            ..attach_detach::Options::default()
        };
        let config = attach_detach::Config::new(Some(kubeconfig.to_path_buf()), options);
        let stop = self.stop.clone();
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = attach_detach::run(config, stop).await {
                tracing::error!(error = %e, "attach/detach controller failed");
            }
        }));
    }

    /// csi-attacher in-process: the Go sidecar's defaults (10 workers, 1 s first retry) but
    /// without client rate limits. Against hostpath (no ControllerPublish) it uses the trivial
    /// handler; against the EBS controller the capabilities it reports.
    async fn start_attacher(&mut self, scenario: Scenario) -> Result<(), Error> {
        let (endpoint, capabilities) = match &self.ebs {
            Some(e) => (e.controller_endpoint(), e.controller_capabilities().await?),
            None => {
                // Node 0's driver (hostpath serves the controller service on every node); the
                // trivial handler makes no ControllerPublish call.
                let first = self
                    .nodes
                    .first()
                    .ok_or_else(|| Error::Config("no nodes".into()))?;
                (format!("unix://{}", first.socket.display()), Vec::new())
            }
        };
        let channel = csi_spec::connect_unix_lazy(&endpoint).map_err(|e| Error::Csi {
            op: format!("dialling {endpoint} for csi-attacher"),
            reason: e.to_string(),
        })?;
        let driver = attacher::Driver::Csi {
            name: scenario.driver_name().into(),
            channel,
            capabilities: attacher::Capabilities::from_rpc_types(capabilities),
        };
        let options = attacher::Options {
            workers: self.attacher_workers,
            ..attacher::Options::default()
        };
        let server = self.server()?;
        let client = harness::api::client(server, "csi-attacher/csi-bench-node")?;
        let mut registry = prometheus_client::registry::Registry::default();
        let controller = attacher::Controller::new(client, driver, options, &mut registry, None);
        let stop = self.stop.clone();
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = controller.run(stop).await {
                tracing::error!(error = %e, "csi-attacher failed");
            }
        }));
        Ok(())
    }

    async fn start_node(
        &mut self,
        config: &LoadConfig,
        scenario: Scenario,
        kubeconfig: &Path,
        i: usize,
    ) -> Result<(), Error> {
        let io = |op: String| move |source| Error::Io { op, source };
        let name = format!("node-{i}");
        let kubelet = self.root.join(&name).join("kubelet");
        let sock_dir = kubelet.join("plugins").join(self.driver_name);
        let registry = kubelet.join("plugins_registry");
        for d in [&sock_dir, &registry] {
            std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
        }
        let socket = sock_dir.join("csi.sock");
        let endpoint = format!("unix://{}", socket.display());
        let log = |what: &str| self.log_dir.join(format!("{name}-{what}.log"));
        let bins = &config.binaries;
        let (driver, node_id) = match &self.ebs {
            Some(e) => {
                let instance = e.instance(i)?.to_string();
                let dev_root = e.dev_root(&instance);
                std::fs::create_dir_all(&dev_root)
                    .map_err(io(format!("creating {}", dev_root.display())))?;
                let args = vec![
                    "--mode=node".to_string(),
                    format!("--endpoint={endpoint}"),
                    format!("--node-id={instance}"),
                    format!("--zone={}", ebs::ZONE),
                    format!("--dev-root={}", dev_root.display()),
                    format!("--volume-attach-limit={}", e.attach_limit()),
                ];
                let p = Child::spawn(
                    format!("{name} ebs-csi-driver"),
                    &bins.ebs_driver,
                    &args,
                    &[],
                    &log("driver"),
                )?;
                (p, instance)
            }
            None => {
                let state = self.root.join(&name).join("hostpath-state");
                let args = vec![
                    format!("--endpoint={endpoint}"),
                    format!("--node-id={name}"),
                    format!("--state-dir={}", state.display()),
                ];
                let p = Child::spawn(
                    format!("{name} hostpath-csi-driver"),
                    &bins.hostpath_driver,
                    &args,
                    &[],
                    &log("driver"),
                )?;
                (p, name.clone())
            }
        };
        let mut node = Node {
            name: name.clone(),
            socket: socket.clone(),
            node_id,
            driver: Some(driver),
            registrar: None,
            agent: None,
        };
        // The registrar gives up when the socket is not there yet; wait for it.
        let deadline = Instant::now() + config.timeout;
        while !socket.exists() {
            if let Some(d) = node.driver.as_mut() {
                d.check_alive()?;
            }
            if Instant::now() > deadline {
                return Err(Error::timeout(
                    format!("{name}: the driver's socket"),
                    format!(
                        "{} does not exist after {:?}",
                        socket.display(),
                        config.timeout
                    ),
                    String::new(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let reg_args = vec![
            format!("--csi-address={}", socket.display()),
            format!("--kubelet-registration-path={}", socket.display()),
            format!("--plugin-registration-path={}", registry.display()),
            "--timeout=10s".to_string(),
        ];
        node.registrar = Some(Child::spawn(
            format!("{name} csi-node-driver-registrar"),
            &bins.registrar,
            &reg_args,
            &[],
            &log("registrar"),
        )?);
        let mut agent_args = vec![
            format!("--node-name={name}"),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", kubelet.display()),
            format!("--skip-attach={}", scenario.skip_attach_flag()),
        ];
        agent_args.extend(config.agent_args.iter().cloned());
        node.agent = Some(Child::spawn(
            format!("{name} csi-node-agent"),
            &bins.node_agent,
            &agent_args,
            &[],
            &log("agent"),
        )?);
        self.nodes.push(node);
        Ok(())
    }

    /// Every node's CSINode lists the driver: the registrar registered it with the agent.
    async fn wait_registered(&mut self, timeout: Duration) -> Result<(), Error> {
        let api: Api<CSINode> = Api::all(self.kube.clone());
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let list = api
                .list(&ListParams::default())
                .await
                .map_err(|source| Error::Kube {
                    op: "listing CSINodes".into(),
                    source,
                })?;
            let registered = self
                .nodes
                .iter()
                .filter(|n| {
                    list.items.iter().any(|c| {
                        c.metadata.name.as_deref() == Some(n.name.as_str())
                            && c.spec
                                .drivers
                                .iter()
                                .any(|d| d.name == self.driver_name && d.node_id == n.node_id)
                    })
                })
                .count();
            if registered == self.nodes.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::timeout(
                    "driver registration",
                    format!(
                        "after {timeout:?}, {registered} of {} CSINodes list {}",
                        self.nodes.len(),
                        self.driver_name
                    ),
                    String::new(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An error naming the first process that exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), Error> {
        for n in &mut self.nodes {
            for p in n.procs_mut() {
                p.check_alive()?;
            }
        }
        if let Some(e) = self.ebs.as_mut() {
            e.check_alive()?;
        }
        Ok(())
    }

    /// CPU time so far of all agents, all driver node plugins (+ the EBS controller), and
    /// The benchmark itself (API server, ADC, attacher, ec2-sim, its own client and watch).
    pub(crate) fn cpu_split(&self) -> CpuSplit {
        let sum = |f: &dyn Fn(&Node) -> Option<Duration>| -> f64 {
            self.nodes
                .iter()
                .filter_map(f)
                .map(|d| d.as_secs_f64())
                .sum()
        };
        let ebs = self
            .ebs
            .as_ref()
            .and_then(ebs::Ebs::controller_cpu)
            .map_or(0.0, |d| d.as_secs_f64());
        CpuSplit {
            agents_s: sum(&Node::agent_cpu),
            drivers_s: sum(&Node::driver_cpu) + ebs,
            node_load_s: crate::harness::procfs::cpu_time(std::process::id())
                .map_or(0.0, |d| d.as_secs_f64()),
        }
    }

    /// The end of every agent's log (for a timeout's message).
    pub(crate) fn agent_log_tails(&self, lines: usize) -> String {
        child::logs_of(self.nodes.iter().filter_map(|n| n.agent.as_ref()), lines)
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The API server's audit trail so far.
    pub(crate) fn audit(&self) -> Vec<apiserver::AuditRecord> {
        self.server.as_ref().map(|s| s.audit()).unwrap_or_default()
    }

    /// How many requests the audit trail holds.
    pub(crate) fn audit_len(&self) -> usize {
        self.server.as_ref().map_or(0, |s| s.audit_len())
    }

    fn server(&self) -> Result<&apiserver::RunningApiServer, Error> {
        self.server
            .as_ref()
            .ok_or_else(|| Error::Other("the API server is not running".into()))
    }

    /// Stops the agents, registrars and drivers (SIGTERM), the control plane, counts and
    /// unmounts what is left, shuts ec2-sim and the API server down, removes the temp dir.
    pub(crate) async fn shutdown(mut self) -> Teardown {
        let mut nodes = std::mem::take(&mut self.nodes);
        let stops = nodes.iter_mut().flat_map(|n| {
            [n.agent.take(), n.registrar.take(), n.driver.take()]
                .into_iter()
                .flatten()
                .map(Child::stop)
        });
        futures::future::join_all(stops).await;
        self.stop.cancel();
        for t in std::mem::take(&mut self.tasks) {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        let mounts_left = unmount_below(&self.root).len();
        if let Some(e) = self.ebs.take() {
            e.shutdown().await;
        }
        if let Some(s) = self.server.take()
            && let Err(e) = s.shutdown().await
        {
            tracing::warn!(error = %e, "API server shutdown");
        }
        Teardown { mounts_left }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop.cancel();
        // Proc's Drop kills and reaps; then nothing can mount any more.
        self.nodes.clear();
        for t in &self.tasks {
            t.abort();
        }
        let left = unmount_below(&self.root).len();
        if left > 0 {
            tracing::warn!(left, root = %self.root.display(), "unmounted leftovers");
        }
        // ec2-sim's Drop releases its loop devices; the TempDir goes last.
        self.ebs = None;
        self.server = None;
        self.dir = None;
    }
}
