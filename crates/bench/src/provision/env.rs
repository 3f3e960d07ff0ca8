//! One run's world: apiserver-lite and the PV controller in-process ([`World`]), ec2-sim
//! in-process for ebs, and the CSI driver and csi-provisioner as child processes (the
//! benchmark's [`Child`]: log file, `/proc` sampling, SIGTERM then SIGKILL).
//! [`Env::shutdown`] stops it all in order; if the run fails or is interrupted, dropping the
//! [`Env`] kills the processes, cancels the controller and removes the temp dir.

use std::time::{Duration, Instant};

use crate::harness::child::{self, Child};
use crate::harness::ebs::Ebs;
use crate::harness::procfs::Memory;
use crate::harness::world::World;

use super::Party;
use super::{Error, LoadConfig, Scenario, USER_AGENT, run_objects};
use crate::harness::writes::Parties;

/// Log lines of each process shown with an error.
const TAIL_LINES: usize = 20;
/// What the provisioner's informers watch before it can provision (claims, volumes, classes).
const PROVISIONER_WATCHES: &[&str] = &[
    "persistentvolumeclaims",
    "persistentvolumes",
    "storageclasses",
];
const PV_CONTROLLER_WATCHES: &[&str] = &["persistentvolumeclaims", "persistentvolumes"];

/// Fields drop in order: the processes go before the world and its temp dir.
pub(crate) struct Env {
    pub(crate) scenario: Scenario,
    pub(crate) parties: Parties<Party>,
    /// The driver's socket as `unix://PATH`.
    pub(crate) endpoint: String,
    /// The provisioner's whole command line after the binary.
    pub(crate) provisioner_args: Vec<String>,
    pub(crate) driver_args: Vec<String>,
    provisioner: Option<Child>,
    /// hostpath's driver (the EBS controller is the cloud's).
    hostpath: Option<Child>,
    ebs: Option<Ebs>,
    pub(crate) world: World,
}

impl Env {
    pub(crate) async fn start(
        config: &LoadConfig,
        scenario: Scenario,
        run: usize,
    ) -> Result<Env, Error> {
        let log_dir = config
            .log_dir
            .as_ref()
            .map(|d| d.join(format!("{scenario}-{run}")));
        let world = World::start(
            "csi-bench-provision-",
            config.temp_parent.as_deref(),
            log_dir,
            USER_AGENT,
        )
        .await?;
        let mut env = Env {
            scenario,
            parties: super::parties(&config.binaries.provisioner),
            endpoint: String::new(),
            provisioner_args: Vec::new(),
            driver_args: Vec::new(),
            provisioner: None,
            hostpath: None,
            ebs: None,
            world,
        };
        run_objects::create_cluster(&env.world.kube, scenario).await?;
        env.start_driver(config).await?;
        env.start_pv_controller()?;
        env.start_provisioner(config)?;
        env.wait_ready(config.timeout).await?;
        Ok(env)
    }

    /// The driver, listening when this returns: the provisioner gives up when the socket does
    /// not come within --connection-timeout.
    async fn start_driver(&mut self, config: &LoadConfig) -> Result<(), Error> {
        let bin = config.binaries.driver(self.scenario);
        let log = self.world.log("driver");
        match self.scenario {
            Scenario::Hostpath => {
                let socket = self.world.root().join("csi.sock");
                self.endpoint = format!("unix://{}", socket.display());
                // Capacity is only accounted (a mount volume is a directory): room for all.
                let args = vec![
                    format!("--endpoint={}", self.endpoint),
                    format!("--node-id={}", run_objects::node_id(self.scenario)),
                    format!(
                        "--state-dir={}",
                        self.world.root().join("hostpath-state").display()
                    ),
                    format!("--capacity={}Gi", config.pvcs_of(self.scenario) + 1),
                ];
                let driver = self.hostpath.insert(Child::spawn(
                    "hostpath-csi-driver",
                    bin,
                    &args,
                    &[],
                    &log,
                )?);
                driver.wait_for_socket(&socket, config.timeout).await?;
                self.driver_args = args;
            }
            Scenario::Ebs => {
                // Nothing attaches: the volumes are only created.
                let ebs = Ebs::start(self.world.root(), &log, bin, 0, None).await?;
                self.endpoint = ebs.controller_endpoint();
                self.driver_args = ebs.controller_args().to_vec();
                self.ebs = Some(ebs);
            }
        }
        Ok(())
    }

    /// kube-controller-manager's binder with its defaults (15 s resync, its backoff), but
    /// without client rate limits (kcm's are 20 qps / burst 30).
    fn start_pv_controller(&mut self) -> Result<(), Error> {
        let client = self.world.client(&pv_controller::user_agent())?;
        let config = pv_controller::Config::new(pv_controller::Options::default());
        self.world.run_in_process("PV controller", |stop| {
            pv_controller::run(client, config, stop)
        });
        Ok(())
    }

    fn start_provisioner(&mut self, config: &LoadConfig) -> Result<(), Error> {
        // A plain path for --csi-address: the Go sidecar's form.
        let socket = self.endpoint.trim_start_matches("unix://");
        let mut args = vec![
            format!("--csi-address={socket}"),
            format!("--kubeconfig={}", self.world.kubeconfig.display()),
            "--feature-gates=Topology=true".to_string(),
            format!("--worker-threads={}", config.worker_threads),
            format!("--kube-api-qps={}", config.kube_api_qps),
            format!("--kube-api-burst={}", config.kube_api_burst),
            "--leader-election=false".to_string(),
        ];
        args.extend(config.provisioner_args.iter().cloned());
        self.provisioner = Some(Child::spawn(
            "csi-provisioner",
            &config.binaries.provisioner,
            &args,
            &[],
            &self.world.log("provisioner"),
        )?);
        self.provisioner_args = args;
        Ok(())
    }

    /// Both controllers watch what they need: a claim created now is seen by both.
    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let audit = self.world.audit();
            let mut missing: Vec<String> = Vec::new();
            for (who, name, resources) in [
                (Party::Provisioner, "provisioner", PROVISIONER_WATCHES),
                (Party::PvController, "PV controller", PV_CONTROLLER_WATCHES),
            ] {
                for res in self.parties.missing_watches(&audit, who, resources) {
                    missing.push(format!("{name}: {res}"));
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.timeout(
                    "start-up",
                    timeout,
                    format!("no watch yet of {}", missing.join(", ")),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The driver's process: hostpath's, or the EBS controller.
    fn driver(&self) -> Option<&Child> {
        self.hostpath
            .as_ref()
            .or_else(|| self.ebs.as_ref().and_then(Ebs::controller))
    }

    /// An error naming the first process that exited, or the PV controller's end.
    pub(crate) fn check_alive(&mut self) -> Result<(), Error> {
        for p in [self.hostpath.as_mut(), self.provisioner.as_mut()]
            .into_iter()
            .flatten()
        {
            p.check_alive()?;
        }
        if let Some(e) = self.ebs.as_mut() {
            e.check_alive()?;
        }
        self.world.check_in_process()
    }

    /// A timeout error with the end of both processes' logs.
    pub(crate) fn timeout(
        &self,
        phase: &'static str,
        timeout: Duration,
        progress: String,
    ) -> Error {
        let logs = child::logs_of(
            [self.provisioner.as_ref(), self.driver()]
                .into_iter()
                .flatten(),
            TAIL_LINES,
        );
        Error::timeout(
            format!("{}: {phase}", self.scenario),
            format!("after {timeout:?}, {progress}"),
            logs,
        )
    }

    pub(crate) fn provisioner_memory(&self) -> Option<Memory> {
        self.provisioner.as_ref().and_then(|p| p.memory().ok())
    }

    pub(crate) fn driver_memory(&self) -> Option<Memory> {
        self.driver().and_then(|p| p.memory().ok())
    }

    pub(crate) fn provisioner_cpu(&self) -> Option<Duration> {
        self.provisioner.as_ref().and_then(Child::cpu)
    }

    pub(crate) fn driver_cpu(&self) -> Option<Duration> {
        self.driver().and_then(Child::cpu)
    }

    /// EC2 calls ec2-sim answered so far, by action (ebs only).
    pub(crate) fn ec2_calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.ebs.as_ref().map(Ebs::ec2_calls).unwrap_or_default()
    }

    /// Stops the provisioner, then the driver (SIGTERM), the PV controller, ec2-sim and the
    /// API server; the temp dir goes with the [`World`].
    pub(crate) async fn shutdown(mut self) {
        if let Some(p) = self.provisioner.take() {
            p.stop().await;
        }
        if let Some(p) = self.hostpath.take() {
            p.stop().await;
        }
        if let Some(e) = self.ebs.take() {
            e.shutdown().await;
        }
        self.world.shutdown().await;
    }
}
