//! One scenario's world: the in-process control plane ([`World`]: the API server, the
//! attach/detach controller and csi-attacher) and, per node, the driver, registrar and node
//! agent processes. [`Env::shutdown`] stops it all in order; if the run fails or is
//! interrupted, dropping the [`Env`] kills the processes, cancels the control plane, unmounts
//! what is left below the temp dir (umount, else umount -l), releases ec2-sim's loop devices
//! and removes the temp dir.

use crate::harness::cli::Named as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use super::{Error, LoadConfig, Scenario, ebs};
use crate::harness::child::{self, Child};
use crate::harness::objects::OwnWrites;
use crate::harness::procfs::Memory;
use crate::harness::world::World;
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

/// The Drop below stops the processes first; the world and its temp dir go last.
pub(crate) struct Env {
    pub(crate) nodes: Vec<Node>,
    pub(crate) ebs: Option<ebs::Ebs>,
    pub(crate) driver_name: &'static str,
    pub(crate) world: World,
}

impl Env {
    pub(crate) async fn start(config: &LoadConfig, scenario: Scenario) -> Result<Env, Error> {
        let log_dir = config.log_dir.as_ref().map(|d| d.join(scenario.name()));
        let world = World::start(
            "csi-bench-node-",
            config.temp_parent.as_deref(),
            log_dir,
            super::USER_AGENT,
        )
        .await?;
        let mut env = Env {
            nodes: Vec::new(),
            ebs: None,
            driver_name: scenario.driver_name(),
            world,
        };
        env.create_csidriver(scenario.attach_required()).await?;
        if scenario.is_ebs() {
            // Room for every pod's volume on its node (AWS's Nitro limit is 28 less the root
            // volume and network interfaces; the benchmark's 40 per node need more).
            let attach_limit = config.pods.div_ceil(config.nodes).max(25) + 1;
            let log = env.world.log("ebs-controller");
            let ebs = ebs::Ebs::start(
                env.world.root(),
                &log,
                &config.binaries.ebs_driver,
                config.nodes,
                Some(attach_limit),
            );
            env.ebs = Some(ebs.await?);
        }
        env.start_adc(scenario);
        for i in 0..config.nodes {
            env.start_node(config, scenario, i).await?;
        }
        if scenario.attach_required() {
            env.start_attacher(scenario, config.attacher_workers)
                .await?;
        }
        env.wait_registered(config.timeout).await?;
        Ok(env)
    }

    async fn create_csidriver(&self, attach_required: bool) -> Result<(), Error> {
        let driver = json!({
            "metadata": {"name": self.driver_name},
            "spec": {"attachRequired": attach_required, "podInfoOnMount": false},
        });
        let drivers: Api<CSIDriver> = Api::all(self.world.kube.clone());
        OwnWrites::default()
            .create(&drivers, driver)
            .await
            .map(drop)
    }

    /// The attach/detach controller in-process, as kube-controller-manager runs it (100 ms
    /// reconciler period, its backoff) but without client rate limits.
    fn start_adc(&mut self, scenario: Scenario) {
        let options = attach_detach::Options {
            skip_attach: scenario.skip_attach(),
            ..attach_detach::Options::default()
        };
        let config = attach_detach::Config::new(Some(self.world.kubeconfig.clone()), options);
        self.world
            .run_in_process("attach/detach controller", |stop| {
                attach_detach::run(config, stop)
            });
    }

    /// csi-attacher in-process: the Go sidecar's defaults (10 workers, 1 s first retry) but
    /// without client rate limits. Against hostpath (no ControllerPublish) it uses the trivial
    /// handler; against the EBS controller the capabilities it reports.
    async fn start_attacher(&mut self, scenario: Scenario, workers: usize) -> Result<(), Error> {
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
            workers,
            ..attacher::Options::default()
        };
        let client = self.world.client("csi-attacher/csi-bench-node")?;
        let mut registry = prometheus_client::registry::Registry::default();
        let controller = attacher::Controller::new(client, driver, options, &mut registry, None);
        self.world
            .run_in_process("csi-attacher", |stop| controller.run(stop));
        Ok(())
    }

    async fn start_node(
        &mut self,
        config: &LoadConfig,
        scenario: Scenario,
        i: usize,
    ) -> Result<(), Error> {
        let io = |op: String| move |source| Error::Io { op, source };
        let name = format!("node-{i}");
        let kubelet = self.world.root().join(&name).join("kubelet");
        let sock_dir = kubelet.join("plugins").join(self.driver_name);
        let registry = kubelet.join("plugins_registry");
        for d in [&sock_dir, &registry] {
            std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
        }
        let socket = sock_dir.join("csi.sock");
        let endpoint = format!("unix://{}", socket.display());
        let log = |what: &str| self.world.log(&format!("{name}-{what}"));
        let bins = &config.binaries;
        let (label, bin, args, node_id) = match &self.ebs {
            Some(e) => {
                let instance = e.instance(i)?.to_string();
                let dev_root = e.dev_root(&instance);
                std::fs::create_dir_all(&dev_root)
                    .map_err(io(format!("creating {}", dev_root.display())))?;
                let mut args = vec![
                    "--mode=node".to_string(),
                    format!("--endpoint={endpoint}"),
                    format!("--node-id={instance}"),
                    format!("--zone={}", ebs::ZONE),
                    format!("--dev-root={}", dev_root.display()),
                ];
                args.extend(
                    e.attach_limit()
                        .map(|l| format!("--volume-attach-limit={l}")),
                );
                ("ebs-csi-driver", &bins.ebs_driver, args, instance)
            }
            None => {
                let state = self.world.root().join(&name).join("hostpath-state");
                let args = vec![
                    format!("--endpoint={endpoint}"),
                    format!("--node-id={name}"),
                    format!("--state-dir={}", state.display()),
                ];
                (
                    "hostpath-csi-driver",
                    &bins.hostpath_driver,
                    args,
                    name.clone(),
                )
            }
        };
        let mut driver = Child::spawn(format!("{name} {label}"), bin, &args, &[], &log("driver"))?;
        // The registrar gives up when the socket is not there yet.
        driver.wait_for_socket(&socket, config.timeout).await?;
        let reg_args = vec![
            format!("--csi-address={}", socket.display()),
            format!("--kubelet-registration-path={}", socket.display()),
            format!("--plugin-registration-path={}", registry.display()),
            "--timeout=10s".to_string(),
        ];
        let registrar = Child::spawn(
            format!("{name} csi-node-driver-registrar"),
            &bins.registrar,
            &reg_args,
            &[],
            &log("registrar"),
        )?;
        let mut agent_args = vec![
            format!("--node-name={name}"),
            format!("--kubeconfig={}", self.world.kubeconfig.display()),
            format!("--root-dir={}", kubelet.display()),
            format!("--skip-attach={}", scenario.skip_attach_flag()),
        ];
        agent_args.extend(config.agent_args.iter().cloned());
        let agent = Child::spawn(
            format!("{name} csi-node-agent"),
            &bins.node_agent,
            &agent_args,
            &[],
            &log("agent"),
        )?;
        self.nodes.push(Node {
            name,
            socket,
            node_id,
            driver: Some(driver),
            registrar: Some(registrar),
            agent: Some(agent),
        });
        Ok(())
    }

    /// Every node's CSINode lists the driver: the registrar registered it with the agent.
    async fn wait_registered(&mut self, timeout: Duration) -> Result<(), Error> {
        let api: Api<CSINode> = Api::all(self.world.kube.clone());
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
        self.world.check_in_process()?;
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
            .and_then(ebs::Ebs::controller)
            .and_then(Child::cpu)
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
        self.world.stop_in_process().await;
        let mounts_left = unmount_below(self.world.root()).len();
        if let Some(e) = self.ebs.take() {
            e.shutdown().await;
        }
        self.world.shutdown().await;
        Teardown { mounts_left }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Child's Drop kills and reaps; then nothing can mount any more.
        self.nodes.clear();
        let root = self.world.root();
        let left = unmount_below(root).len();
        if left > 0 {
            tracing::warn!(left, root = %root.display(), "unmounted leftovers");
        }
        // ec2-sim's Drop releases its loop devices; the world (its temp dir last) goes after.
        self.ebs = None;
    }
}
