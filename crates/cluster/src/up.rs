//! `csi-cluster up`: start everything in order, say how to use it, run until shutdown, then
//! stop everything in order and leave no mount, loop device or socket behind.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::config::{MigrationState, SharedMigration, UpConfig};
use crate::control_plane;
use crate::identity::{self, Identity, Kubeconfigs};
use crate::kubeconfig::kubeconfig_path;
use crate::nodes::{self, NodeSpec};
use crate::supervisor::Supervisor;
use crate::teardown::{self, Leftovers};
use crate::{
    EBS_DRIVER, Error, HOSTPATH_DRIVER, bootstrap_objects, external, informers, logs, pidfile,
    workloads,
};

/// How long the nodes may take to register their drivers and become Ready.
const READY_PATIENCE: Duration = Duration::from_secs(180);

/// The line `up` prints once every node is Ready with both drivers registered (scripts and
/// tests wait for it).
pub const READY_LINE: &str = "csi-cluster is ready";

/// Cleans the data dir up if `up` fails or panics before its orderly shutdown.
struct Guard {
    data_dir: PathBuf,
    armed: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.armed {
            teardown::clean_below(&self.data_dir);
        }
    }
}

/// A started cluster, for `up` and for whatever drives one in-process (`demo`, `csi-bench stack`, the
/// tests): its clients, its components by name (kill, start, restart), the migration gates
/// and the API server's restart.
pub struct RunningCluster {
    config: UpConfig,
    data_dir: PathBuf,
    /// `None` only while [`RunningCluster::restart_api_server`] replaces it.
    server: Option<apiserver::RunningApiServer>,
    cloud: control_plane::Cloud,
    sup: Supervisor,
    /// The control plane's shared watch caches; after `sup` in drop order, so they outlive
    /// the components reading them.
    informers: informers::Informers,
    specs: Vec<NodeSpec>,
    /// The `--driver` drivers' names (registered on every node before the cluster is ready).
    external: Vec<String>,
    migration: SharedMigration,
    created: Vec<String>,
    workload_controllers: Vec<String>,
    pid_file: Option<pidfile::PidFile>,
    guard: Guard,
    started: Instant,
}

impl RunningCluster {
    /// Starts every component (not waiting for the nodes: [`RunningCluster::wait_ready`]).
    /// Needs root.
    pub async fn start(config: UpConfig) -> Result<Self, Error> {
        let drivers = external::parse_all(&config.drivers)?;
        crate::require_root("up")?;
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| Error::io("creating the data dir", &config.data_dir, e))?;
        // Canonical: mount points in /proc/self/mountinfo are, and teardown compares with them.
        let data_dir = std::fs::canonicalize(&config.data_dir)
            .map_err(|e| Error::io("resolving the data dir", &config.data_dir, e))?;
        if data_dir == Path::new("/") {
            return Err(Error::Config("--data-dir must not be /".into()));
        }
        let pid_file = pidfile::claim(&data_dir)?;
        logs::init(&data_dir.join("logs"), config.verbosity)?;
        component_runtime::install_crypto_provider();
        // A previous run killed with SIGKILL may have left mounts and sockets behind.
        teardown::unmount_below(&data_dir);
        teardown::remove_sockets_below(&data_dir);
        let guard = Guard {
            data_dir: data_dir.clone(),
            armed: true,
        };
        let started = Instant::now();
        tracing::info!(data_dir = %data_dir.display(), nodes = config.nodes, migration = %config.migration, "starting");

        let server = control_plane::start_api_server(&config, &data_dir).await?;
        // Each component's own credential (identity.rs); `<data-dir>/kubeconfig` is the admin's.
        let kubeconfigs = Kubeconfigs::new(&server, &data_dir)?;
        let admin = server.client();
        let created = bootstrap_objects::ensure(
            &admin,
            config.hostpath_attach_required,
            external::objects(&drivers, config.attach_required),
        )
        .await?;
        let cloud = control_plane::start_cloud(&config, &data_dir).await?;
        let migration: SharedMigration = Arc::new(RwLock::new(MigrationState::new(
            config.migration,
            config.nodes,
        )));

        let informers = informers::Informers::start(
            kubeconfigs
                .client(&Identity::controller_manager(), "csi-cluster/informers")
                .await?,
        )?;
        let shared = informers.caches();
        let hostpath_informers = informers.provisioners(
            &kubeconfigs
                .client(
                    &Identity::provisioner(HOSTPATH_DRIVER),
                    &control_plane::provisioner_informers_agent(HOSTPATH_DRIVER),
                )
                .await?,
        );
        let sup = Supervisor::new();
        let components = async {
            let ebs_endpoint = control_plane::start_ebs_controller(&sup, &cloud, &data_dir)?;
            let ebs_endpoint = control_plane::fault_proxy(
                &sup,
                crate::EBS_CONTROLLER,
                &ebs_endpoint,
                config.csi_faults.as_ref(),
            )?;
            control_plane::start_controllers(
                &sup,
                &cloud,
                &kubeconfigs,
                &migration,
                config.skip_attach,
                &ebs_endpoint,
                &shared,
            )
            .await?;
            if config.hostpath_attach_required {
                control_plane::start_hostpath_attach(
                    &sup,
                    &data_dir,
                    &kubeconfigs,
                    config.csi_faults.as_ref(),
                )?;
            }
            let mut specs = Vec::new();
            for (i, (instance_id, zone)) in cloud.instances.iter().enumerate() {
                let spec = NodeSpec {
                    name: format!("node-{i}"),
                    instance_id: instance_id.clone(),
                    zone: zone.clone(),
                    dev_root: cloud.sim.node_dev_root(instance_id),
                    ebs_metrics: ebs_driver::DriverMetrics::default(),
                };
                let env = nodes::NodeEnv {
                    sup: &sup,
                    data_dir: &data_dir,
                    kubeconfigs: &kubeconfigs,
                    migration: &migration,
                    config: &config,
                    hostpath_informers: &hostpath_informers,
                };
                nodes::start_node(env, &spec, i).await?;
                specs.push(spec);
            }
            external::start(
                &sup,
                &drivers,
                &config,
                &data_dir,
                &kubeconfigs,
                &specs,
                &informers,
            )
            .await?;
            let workload_controllers = workloads::start(&sup, &kubeconfigs, &shared).await?;
            Ok::<_, Error>((specs, workload_controllers))
        }
        .await;
        let (specs, workload_controllers) = match components {
            Ok(c) => c,
            Err(e) => {
                // Stop what did start, and wait for it: the `--driver` plugins are processes,
                // which would outlive this one if only their tasks were dropped.
                sup.stop().await;
                return Err(e);
            }
        };
        Ok(Self {
            config,
            data_dir,
            server: Some(server),
            cloud,
            sup,
            informers,
            specs,
            external: drivers.into_iter().map(|d| d.name).collect(),
            migration,
            created,
            workload_controllers,
            pid_file: Some(pid_file),
            guard,
            started,
        })
    }

    /// Waits until every node is Ready with both drivers in its CSINode.
    pub async fn wait_ready(&self) -> Result<(), Error> {
        wait_ready(&self.client()?, &self.specs, &self.external).await
    }

    /// An admin client of the API server.
    pub fn client(&self) -> Result<Client, Error> {
        self.server
            .as_ref()
            .map(apiserver::RunningApiServer::client)
            .ok_or_else(|| Error::Config("the API server is restarting".into()))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn api_url(&self) -> Option<&str> {
        self.server.as_ref().map(apiserver::RunningApiServer::url)
    }

    /// apiserver-lite's record of every request so far (empty unless `UpConfig::audit`).
    pub fn audit(&self) -> Vec<apiserver::AuditRecord> {
        self.server
            .as_ref()
            .map(apiserver::RunningApiServer::audit)
            .unwrap_or_default()
    }

    /// Forgets the audit record so far.
    pub fn audit_clear(&self) {
        if let Some(s) = &self.server {
            s.audit_clear();
        }
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn kubeconfig(&self) -> PathBuf {
        kubeconfig_path(&self.data_dir)
    }

    /// `<data-dir>/kubeconfigs`: one kubeconfig per component identity ([`identity`]).
    pub fn kubeconfigs_dir(&self) -> PathBuf {
        identity::kubeconfigs_dir(&self.data_dir)
    }

    /// The nodes' names, `node-0` first.
    pub fn node_names(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.name.clone()).collect()
    }

    /// Node `name`'s EC2 instance ID.
    pub fn instance_id(&self, node: &str) -> Option<&str> {
        self.specs
            .iter()
            .find(|s| s.name == node)
            .map(|s| s.instance_id.as_str())
    }

    /// ec2-sim: its call counts, its loop devices.
    pub fn ec2(&self) -> &ec2_sim::Simulator {
        &self.cloud.sim
    }

    /// A new EC2 client of ec2-sim, apart from every component's (its calls are counted in no
    /// component's metrics): for looking at volumes from outside, as `aws ec2` would.
    pub async fn ec2_client(&self) -> Result<ebs_cloud_aws::AwsCloud, Error> {
        ebs_cloud_aws::AwsCloud::new(self.cloud.aws.clone(), ebs_cloud::CloudMetrics::new())
            .await
            .map_err(|e| Error::start("an EC2 client of ec2-sim", e))
    }

    /// The in-tree aws-ebs plugin's EC2 call metrics (the PV controller's and the attach/detach
    /// controller's calls, as kube-controller-manager's cloud provider makes them).
    pub fn in_tree_ec2_metrics(&self) -> &ebs_cloud::CloudMetrics {
        self.cloud.in_tree.metrics()
    }

    /// The EBS driver's controller service's counters: CSI RPCs (CreateVolume,
    /// ControllerPublishVolume, ...) and its own EC2 calls (the CSI path's).
    pub fn ebs_controller_metrics(&self) -> &ebs_driver::DriverMetrics {
        &self.cloud.ebs_metrics
    }

    /// Node `node`'s EBS driver's counters (NodeStageVolume, NodePublishVolume, ...).
    pub fn ebs_node_metrics(&self, node: &str) -> Option<&ebs_driver::DriverMetrics> {
        self.specs
            .iter()
            .find(|s| s.name == node)
            .map(|s| &s.ebs_metrics)
    }

    /// Every component's name.
    pub fn components(&self) -> Vec<String> {
        self.sup.names()
    }

    /// How many times a component has started (1: never restarted).
    pub fn starts(&self, component: &str) -> Option<u32> {
        self.sup.starts(component)
    }

    /// Whether a component's task runs (false once killed, until started again).
    pub fn is_running(&self, component: &str) -> bool {
        self.sup.is_running(component)
    }

    /// The in-process SIGKILL of one component: its task is dropped where it stands.
    pub fn kill(&self, component: &str) -> Result<(), Error> {
        self.sup.kill(component)
    }

    /// Starts a killed component again.
    pub fn start_component(&self, component: &str) -> Result<(), Error> {
        self.sup.start(component)
    }

    /// Stops one component gracefully and starts it again.
    pub async fn restart(&self, component: &str) -> Result<(), Error> {
        self.sup.restart(component).await
    }

    /// The migration gates now.
    pub fn migration(&self) -> MigrationState {
        self.migration
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Turns the controller side's migration gate on or off and restarts the PV controller
    /// and the attach/detach controller with it (kube-controller-manager's restart with new
    /// `--feature-gates`).
    pub async fn set_controller_migration(&self, on: bool) -> Result<(), Error> {
        self.migration
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .controller = on;
        for c in [crate::PV_CONTROLLER, crate::ADC] {
            self.sup.restart(c).await?;
        }
        Ok(())
    }

    /// Turns node `node`'s migration gate on or off and restarts its node agent (the
    /// kubelet's restart with new `--feature-gates`; drain the node first, as the migration design,
    /// docs/design/migration.md, says).
    pub async fn set_node_migration(&self, node: &str, on: bool) -> Result<(), Error> {
        let i = self
            .specs
            .iter()
            .position(|s| s.name == node)
            .ok_or_else(|| Error::Config(format!("no node named {node:?}")))?;
        self.migration
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .nodes[i] = on;
        self.sup.restart(&crate::node_agent(node)).await
    }

    /// Stops apiserver-lite and starts it again from its data dir on the same port; every
    /// component's watches break and resume.
    pub async fn restart_api_server(&mut self) -> Result<(), Error> {
        let Some(server) = self.server.take() else {
            return Err(Error::Config("the API server is already restarting".into()));
        };
        let port = server.addr().port();
        server
            .shutdown()
            .await
            .map_err(|e| Error::start("stopping apiserver-lite", e))?;
        let mut config = self.config.clone();
        config.port = Some(port);
        // The port was just freed; another process could take it in between, so retry a bit.
        let mut last = None;
        for _ in 0..50 {
            match control_plane::start_api_server(&config, &self.data_dir).await {
                Ok(s) => {
                    self.server = Some(s);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last.unwrap_or_else(|| Error::start("apiserver-lite", "did not start")))
    }

    /// Prints where everything is and how to use it.
    pub fn print_summary(&self) {
        if let Some(server) = &self.server {
            print_summary(
                &self.config,
                &self.data_dir,
                server,
                &self.specs,
                &self.created,
                &self.workload_controllers,
                &self.external,
            );
        }
    }

    /// Stops everything in order and checks nothing is left below the data dir.
    pub async fn stop(self) -> Result<(), Error> {
        let RunningCluster {
            config,
            data_dir,
            server,
            cloud,
            sup,
            informers,
            mut pid_file,
            mut guard,
            ..
        } = self;
        let stopping = Instant::now();
        sup.stop().await;
        // Nobody reads the shared caches any more.
        drop(informers);
        let unmounted = teardown::unmount_below(&data_dir);
        if let Err(e) = cloud.sim.shutdown().await {
            tracing::warn!(error = %e, "stopping ec2-sim");
        }
        let detached = teardown::detach_loop_devices_below(&data_dir);
        if let Some(server) = server
            && let Err(e) = server.shutdown().await
        {
            tracing::warn!(error = %e, "stopping the API server");
        }
        teardown::remove_sockets_below(&data_dir);
        let left = Leftovers::of(&data_dir);
        guard.armed = !left.is_empty();
        // stderr: stdout belongs to what drives the cluster (`csi-bench stack --output json` prints its
        // report there).
        eprintln!(
            "stopped in {:.1} s: {} volume mounts unmounted, {} loop devices released after ec2-sim; left: {left}",
            stopping.elapsed().as_secs_f64(),
            unmounted.len(),
            detached.len()
        );
        drop(pid_file.take());
        if config.ephemeral && left.mounts.is_empty() {
            std::fs::remove_dir_all(&data_dir)
                .map_err(|e| Error::io("removing the ephemeral data dir", &data_dir, e))?;
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(Error::Leftovers {
                data_dir,
                left: format!("{left} ({left:?})"),
            })
        }
    }
}

/// Runs the cluster until `shutdown` is cancelled (Ctrl-C / SIGTERM in the binary), then
/// stops it. Needs root.
pub async fn up(config: UpConfig, shutdown: CancellationToken) -> Result<(), Error> {
    let cluster = RunningCluster::start(config).await?;
    cluster.print_summary();
    let log_dir = cluster.data_dir().join("logs");
    let ready = tokio::select! {
        r = cluster.wait_ready() => Some(r),
        () = shutdown.cancelled() => None,
    };
    match ready {
        Some(Ok(())) => println!(
            "{READY_LINE} ({} nodes, {:.1} s). Stop it with Ctrl-C or `csi-cluster down --data-dir {}`.",
            cluster.specs.len(),
            cluster.started.elapsed().as_secs_f64(),
            cluster.data_dir().display()
        ),
        Some(Err(e)) => {
            eprintln!("csi-cluster: not every node became ready: {e}");
            eprintln!("csi-cluster: still running; see {}", log_dir.display());
        }
        None => {}
    }
    shutdown.cancelled().await;
    println!("stopping ...");
    cluster.stop().await
}

/// Where everything is and how to use it.
fn print_summary(
    config: &UpConfig,
    data_dir: &Path,
    server: &apiserver::RunningApiServer,
    specs: &[NodeSpec],
    created: &[String],
    workload_controllers: &[String],
    external: &[String],
) {
    let kubeconfig = kubeconfig_path(data_dir);
    println!(
        "csi-cluster on {} ({} nodes, migration {}, EC2 timing {:?})",
        data_dir.display(),
        specs.len(),
        config.migration,
        config.timing
    );
    println!("  API server  {}", server.url());
    for s in specs {
        println!(
            "  {}  EC2 instance {} in {}, kubelet root {}",
            s.name,
            s.instance_id,
            s.zone,
            s.root_dir(data_dir).display()
        );
    }
    if !created.is_empty() {
        println!("  created     {}", created.join(", "));
    }
    let hostpath_attach = if config.hostpath_attach_required {
        "attachRequired, a controller-only instance for its csi-attacher"
    } else {
        "no attach"
    };
    println!(
        "  drivers     {EBS_DRIVER} (attachRequired), {HOSTPATH_DRIVER} ({hostpath_attach}); classes ebs-sc (default), hostpath, gp2 (in-tree)"
    );
    if !external.is_empty() {
        let provisioning = if config.driver_node_deployment {
            "a csi-provisioner per node"
        } else {
            "one csi-provisioner"
        };
        let attach = if config.attach_required {
            "attachRequired, a csi-attacher"
        } else {
            "no attach"
        };
        for name in external {
            println!(
                "  --driver    {name} ({attach}, {provisioning}); class {name}; logs {}/{name}-<node|controller>.log",
                data_dir.join("logs").display()
            );
        }
    }
    println!("  workloads   {}", workload_controllers.join(", "));
    println!(
        "  components' kubeconfigs  {}/ (each its own user)",
        identity::kubeconfigs_dir(data_dir).display()
    );
    println!("  logs        {}/", data_dir.join("logs").display());
    for c in logs::COMPONENTS {
        println!("    {:<20} {}", c.file, c.what);
    }
    println!(
        "    {:<20} csi-cluster and everything else",
        logs::CLUSTER_LOG
    );
    println!("Use it:");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    if let Some(out) = &config.kubeconfig_out {
        println!("  (also written to {})", out.display());
    }
    println!("  kubectl get nodes");
}

/// Every node Ready, with both drivers and the `--driver` ones in its CSINode.
async fn wait_ready(client: &Client, specs: &[NodeSpec], external: &[String]) -> Result<(), Error> {
    let started = Instant::now();
    let mut progress = String::new();
    while started.elapsed() < READY_PATIENCE {
        match not_ready(client, specs, external).await {
            Ok(missing) if missing.is_empty() => return Ok(()),
            Ok(missing) => progress = missing.join("; "),
            Err(e) => progress = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(Error::Timeout {
        what: "every node Ready with both drivers registered".into(),
        waited: READY_PATIENCE,
        progress,
    })
}

/// What is still missing, one entry per node.
async fn not_ready(
    client: &Client,
    specs: &[NodeSpec],
    external: &[String],
) -> Result<Vec<String>, Error> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing nodes", e))?
        .items;
    let csinodes = Api::<CSINode>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing CSINodes", e))?
        .items;
    let mut missing = Vec::new();
    for s in specs {
        let ready = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(s.name.as_str()))
            .and_then(|n| n.status.as_ref()?.conditions.clone())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let drivers: Vec<String> = csinodes
            .iter()
            .filter(|c| c.metadata.name.as_deref() == Some(s.name.as_str()))
            .flat_map(|c| c.spec.drivers.iter().map(|d| d.name.clone()))
            .collect();
        let unregistered: Vec<&str> = [EBS_DRIVER, HOSTPATH_DRIVER]
            .into_iter()
            .chain(external.iter().map(String::as_str))
            .filter(|d| !drivers.iter().any(|r| r == d))
            .collect();
        if !ready || !unregistered.is_empty() {
            missing.push(format!(
                "{}: {}{}",
                s.name,
                if ready { "Ready" } else { "not Ready" },
                if unregistered.is_empty() {
                    String::new()
                } else {
                    format!(", not registered: {}", unregistered.join(", "))
                }
            ));
        }
    }
    Ok(missing)
}
