//! One run's world: apiserver-lite, the PV controller and (ebs) ec2-sim in-process; the CSI
//! driver and csi-provisioner as child processes (the benchmark's [`Proc`]: log file, `/proc`
//! sampling, SIGTERM then SIGKILL). [`Env::shutdown`] stops it all in order; if the run fails
//! or is interrupted, dropping the [`Env`] kills the processes, cancels the controller and
//! removes the temp dir.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::procfs::Memory;
use crate::harness::{
    self,
    child::{self, Child},
};
use kube::Client;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Party;
use super::{Error, LoadConfig, Scenario, USER_AGENT, run_objects};
use crate::harness::writes::Parties;

/// The EBS driver's region (ec2-sim's default).
const REGION: &str = "us-east-1";
/// Log lines of each process shown with an error.
const TAIL_LINES: usize = 20;
/// What the provisioner's informers watch before it can provision (claims, volumes, classes).
const PROVISIONER_WATCHES: &[&str] = &[
    "persistentvolumeclaims",
    "persistentvolumes",
    "storageclasses",
];
const PV_CONTROLLER_WATCHES: &[&str] = &["persistentvolumeclaims", "persistentvolumes"];

pub(crate) struct Env {
    pub(crate) scenario: Scenario,
    pub(crate) kube: Client,
    pub(crate) parties: Parties<Party>,
    /// The driver's socket as `unix://PATH`.
    pub(crate) endpoint: String,
    /// The provisioner's whole command line after the binary.
    pub(crate) provisioner_args: Vec<String>,
    pub(crate) driver_args: Vec<String>,
    provisioner: Option<Child>,
    driver: Option<Child>,
    sim: Option<ec2_sim::Simulator>,
    stop: CancellationToken,
    pv_controller: Option<JoinHandle<()>>,
    server: Option<apiserver::RunningApiServer>,
    /// Declared last: removed after everything else went.
    dir: Option<tempfile::TempDir>,
}

impl Env {
    pub(crate) async fn start(
        config: &LoadConfig,
        scenario: Scenario,
        run: usize,
    ) -> Result<Env, Error> {
        let io = |op: String| move |source| Error::Io { op, source };
        let dir = harness::api::run_dir("csi-bench-provision-", config.temp_parent.as_deref())?;
        let root = dir.path().to_path_buf();
        let log_dir = match &config.log_dir {
            Some(d) => d.join(format!("{scenario}-{run}")),
            None => root.join("logs"),
        };
        std::fs::create_dir_all(&log_dir)
            .map_err(io(format!("creating the log dir {}", log_dir.display())))?;
        let (server, kubeconfig) = harness::api::start(&root).await?;
        let kube = harness::api::client(&server, USER_AGENT)?;
        let socket = root.join("csi.sock");
        let mut env = Env {
            scenario,
            kube,
            parties: super::parties(&config.binaries.provisioner),
            endpoint: format!("unix://{}", socket.display()),
            provisioner_args: Vec::new(),
            driver_args: Vec::new(),
            provisioner: None,
            driver: None,
            sim: None,
            stop: CancellationToken::new(),
            pv_controller: None,
            server: Some(server),
            dir: Some(dir),
        };
        run_objects::create_cluster(&env.kube, scenario).await?;
        env.start_driver(config, &root, &log_dir).await?;
        env.wait_for_socket(&socket, config.timeout).await?;
        env.start_pv_controller().await?;
        env.start_provisioner(config, &socket, &kubeconfig, &log_dir)?;
        env.wait_ready(config.timeout).await?;
        Ok(env)
    }

    async fn start_driver(
        &mut self,
        config: &LoadConfig,
        root: &Path,
        log_dir: &Path,
    ) -> Result<(), Error> {
        let bin = config.binaries.driver(self.scenario);
        let log = log_dir.join("driver.log");
        let pvcs = config.pvcs_of(self.scenario);
        let proc = match self.scenario {
            Scenario::Hostpath => {
                // Capacity is only accounted (a mount volume is a directory): room for all.
                let args = vec![
                    format!("--endpoint={}", self.endpoint),
                    format!("--node-id={}", run_objects::node_id(self.scenario)),
                    format!("--state-dir={}", root.join("hostpath-state").display()),
                    format!("--capacity={}Gi", pvcs + 1),
                ];
                let p = Child::spawn("hostpath-csi-driver", bin, &args, &[], &log)?;
                self.driver_args = args;
                p
            }
            Scenario::Ebs => {
                let sim = ec2_sim::Simulator::start(
                    ec2_sim::SimConfig {
                        state_dir: root.join("ec2"),
                        timing: ec2_sim::Timing::Fast,
                        credentials: ec2_sim::Credentials::single(
                            "csi-bench-provision",
                            "csi-bench-provision",
                        ),
                        ..ec2_sim::SimConfig::default()
                    },
                    ([127, 0, 0, 1], 0).into(),
                )
                .await?;
                let args = vec![
                    "--mode=controller".to_string(),
                    format!("--endpoint={}", self.endpoint),
                    format!("--ec2-endpoint={}", sim.endpoint()),
                    format!("--region={REGION}"),
                ];
                self.sim = Some(sim);
                // The pair the sim above accepts.
                let envs = [
                    ("AWS_ACCESS_KEY_ID", "csi-bench-provision".to_string()),
                    ("AWS_SECRET_ACCESS_KEY", "csi-bench-provision".to_string()),
                    ("AWS_REGION", REGION.to_string()),
                    ("AWS_EC2_METADATA_DISABLED", "true".to_string()),
                ];
                let p = Child::spawn("ebs-csi-driver (controller)", bin, &args, &envs, &log)?;
                self.driver_args = args;
                p
            }
        };
        self.driver = Some(proc);
        Ok(())
    }

    /// The provisioner gives up when the socket does not come within --connection-timeout;
    /// the benchmark starts it only once the driver listens.
    async fn wait_for_socket(&mut self, socket: &Path, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        while !socket.exists() {
            self.check_alive()?;
            if Instant::now() > deadline {
                return Err(self.timeout(
                    "the driver's socket",
                    timeout,
                    format!("{} does not exist", socket.display()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// kube-controller-manager's binder with its defaults (15 s resync, its backoff), but
    /// without client rate limits (kcm's are 20 qps / burst 30).
    async fn start_pv_controller(&mut self) -> Result<(), Error> {
        let server = self
            .server
            .as_ref()
            .ok_or_else(|| Error::Other("the API server is not running".into()))?;
        let client = harness::api::client(server, &pv_controller::user_agent())?;
        let config = pv_controller::Config::new(pv_controller::Options::default());
        let stop = self.stop.clone();
        self.pv_controller = Some(tokio::spawn(async move {
            if let Err(e) = pv_controller::run(client, config, stop).await {
                tracing::error!(error = %e, "the PV controller failed");
            }
        }));
        Ok(())
    }

    fn start_provisioner(
        &mut self,
        config: &LoadConfig,
        socket: &Path,
        kubeconfig: &Path,
        log_dir: &Path,
    ) -> Result<(), Error> {
        // A plain path for --csi-address: the Go sidecar's form.
        let mut args = vec![
            format!("--csi-address={}", socket.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
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
            &log_dir.join("provisioner.log"),
        )?);
        self.provisioner_args = args;
        Ok(())
    }

    /// Both controllers watch what they need: a claim created now is seen by both.
    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let audit = self.audit();
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

    /// An error naming the first process that exited, or the PV controller's end.
    pub(crate) fn check_alive(&mut self) -> Result<(), Error> {
        for p in [self.driver.as_mut(), self.provisioner.as_mut()]
            .into_iter()
            .flatten()
        {
            p.check_alive()?;
        }
        if self.pv_controller.as_ref().is_some_and(|t| t.is_finished()) {
            return Err(Error::Other(
                "the PV controller stopped (its error is in the log above)".into(),
            ));
        }
        Ok(())
    }

    /// A timeout error with the end of both processes' logs.
    pub(crate) fn timeout(
        &self,
        phase: &'static str,
        timeout: Duration,
        progress: String,
    ) -> Error {
        let logs = child::logs_of(
            [&self.provisioner, &self.driver].into_iter().flatten(),
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
        self.driver.as_ref().and_then(|p| p.memory().ok())
    }

    pub(crate) fn provisioner_cpu(&self) -> Option<Duration> {
        self.provisioner.as_ref().and_then(Child::cpu)
    }

    pub(crate) fn driver_cpu(&self) -> Option<Duration> {
        self.driver.as_ref().and_then(Child::cpu)
    }

    /// EC2 calls ec2-sim answered so far, by action (ebs only).
    pub(crate) fn ec2_calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.sim
            .as_ref()
            .map(ec2_sim::Simulator::call_counts)
            .unwrap_or_default()
    }

    /// The API server's audit trail so far.
    pub(crate) fn audit(&self) -> Vec<apiserver::AuditRecord> {
        self.server.as_ref().map(|s| s.audit()).unwrap_or_default()
    }

    pub(crate) fn audit_len(&self) -> usize {
        self.server.as_ref().map_or(0, |s| s.audit_len())
    }

    /// Stops the provisioner, then the driver (SIGTERM), the PV controller, ec2-sim and the
    /// API server, and removes the temp dir.
    pub(crate) async fn shutdown(mut self) {
        if let Some(p) = self.provisioner.take() {
            p.stop().await;
        }
        if let Some(p) = self.driver.take() {
            p.stop().await;
        }
        self.stop.cancel();
        if let Some(t) = self.pv_controller.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        if let Some(sim) = self.sim.take()
            && let Err(e) = sim.shutdown().await
        {
            tracing::warn!(error = %e, "ec2-sim shutdown");
        }
        if let Some(s) = self.server.take()
            && let Err(e) = s.shutdown().await
        {
            tracing::warn!(error = %e, "API server shutdown");
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = &self.pv_controller {
            t.abort();
        }
        // Proc's Drop kills and reaps; then ec2-sim and the server; the temp dir goes last.
        self.provisioner = None;
        self.driver = None;
        self.sim = None;
        self.server = None;
        self.dir = None;
    }
}
