//! `csi-cluster up`: start everything in order, say how to use it, run until shutdown, then
//! stop everything in order and leave no mount, loop device or socket behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::config::UpConfig;
use crate::control_plane::{self, kubeconfig_path};
use crate::nodes::{self, NodeSpec};
use crate::supervisor::Supervisor;
use crate::teardown::{self, Leftovers};
use crate::{EBS_DRIVER, Error, HOSTPATH_DRIVER, logs, objects, pidfile, workloads};

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

/// Runs the cluster until `shutdown` is cancelled (Ctrl-C / SIGTERM in the binary), then
/// stops it. Needs root.
pub async fn up(config: UpConfig, shutdown: CancellationToken) -> Result<(), Error> {
    let uid = rustix::process::geteuid();
    if !uid.is_root() {
        return Err(Error::NotRoot { uid: uid.as_raw() });
    }
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| Error::io("creating the data dir", &config.data_dir, e))?;
    // Canonical: mount points in /proc/self/mountinfo are, and teardown compares with them.
    let data_dir = std::fs::canonicalize(&config.data_dir)
        .map_err(|e| Error::io("resolving the data dir", &config.data_dir, e))?;
    if data_dir == Path::new("/") {
        return Err(Error::Config("--data-dir must not be /".into()));
    }
    let pid_file = pidfile::claim(&data_dir)?;
    let log_dir = data_dir.join("logs");
    logs::init(&log_dir, config.verbosity)?;
    sidecar::install_crypto_provider();
    // A previous run killed with SIGKILL may have left mounts and sockets behind.
    teardown::unmount_below(&data_dir);
    teardown::remove_sockets_below(&data_dir);
    let mut guard = Guard {
        data_dir: data_dir.clone(),
        armed: true,
    };
    let started = Instant::now();
    tracing::info!(data_dir = %data_dir.display(), nodes = config.nodes, migration = %config.migration, "starting");

    let server = control_plane::start_api_server(&config, &data_dir).await?;
    let kubeconfig = kubeconfig_path(&data_dir);
    let admin = server.client();
    let created = objects::ensure(&admin).await?;
    let cloud = control_plane::start_cloud(&config, &data_dir).await?;

    let mut sup = Supervisor::new();
    let ebs_endpoint = control_plane::start_ebs_controller(&mut sup, &cloud, &data_dir)?;
    control_plane::start_controllers(
        &mut sup,
        &cloud,
        &kubeconfig,
        config.migration,
        &ebs_endpoint,
    )
    .await?;
    let mut specs = Vec::new();
    for (i, (instance_id, zone)) in cloud.instances.iter().enumerate() {
        let spec = NodeSpec {
            name: format!("node-{i}"),
            instance_id: instance_id.clone(),
            zone: zone.clone(),
            dev_root: cloud.sim.node_dev_root(instance_id),
        };
        nodes::start_node(&mut sup, &spec, &data_dir, &kubeconfig, config.migration).await?;
        specs.push(spec);
    }
    let workload_controllers = workloads::start(&mut sup, &kubeconfig).await?;

    print_summary(
        &config,
        &data_dir,
        &server,
        &specs,
        &created,
        &workload_controllers,
    );
    let ready = tokio::select! {
        r = wait_ready(&admin, &specs) => Some(r),
        () = shutdown.cancelled() => None,
    };
    match ready {
        Some(Ok(())) => println!(
            "{READY_LINE} ({} nodes, {:.1} s). Stop it with Ctrl-C or `csi-cluster down --data-dir {}`.",
            specs.len(),
            started.elapsed().as_secs_f64(),
            data_dir.display()
        ),
        Some(Err(e)) => {
            eprintln!("csi-cluster: not every node became ready: {e}");
            eprintln!("csi-cluster: still running; see {}", log_dir.display());
        }
        None => {}
    }

    shutdown.cancelled().await;
    println!("stopping ...");
    let stopping = Instant::now();
    sup.stop().await;
    let unmounted = teardown::unmount_below(&data_dir);
    if let Err(e) = cloud.sim.shutdown().await {
        tracing::warn!(error = %e, "stopping ec2-sim");
    }
    let detached = teardown::detach_loop_devices_below(&data_dir);
    if let Err(e) = server.shutdown().await {
        tracing::warn!(error = %e, "stopping the API server");
    }
    teardown::remove_sockets_below(&data_dir);
    let left = Leftovers::of(&data_dir);
    guard.armed = !left.is_empty();
    println!(
        "stopped in {:.1} s: {} volume mounts unmounted, {} loop devices released after ec2-sim; left: {left}",
        stopping.elapsed().as_secs_f64(),
        unmounted.len(),
        detached.len()
    );
    drop(pid_file);
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

/// Where everything is and how to use it.
fn print_summary(
    config: &UpConfig,
    data_dir: &Path,
    server: &apiserver::RunningApiServer,
    specs: &[NodeSpec],
    created: &[String],
    workload_controllers: &[String],
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
    println!(
        "  drivers     {EBS_DRIVER} (attachRequired), {HOSTPATH_DRIVER} (no attach); classes ebs-sc (default), hostpath, gp2 (in-tree)"
    );
    println!("  workloads   {}", workload_controllers.join(", "));
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

/// Every node Ready, with both drivers in its CSINode.
async fn wait_ready(client: &Client, specs: &[NodeSpec]) -> Result<(), Error> {
    let started = Instant::now();
    let mut progress = String::new();
    while started.elapsed() < READY_PATIENCE {
        match not_ready(client, specs).await {
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
async fn not_ready(client: &Client, specs: &[NodeSpec]) -> Result<Vec<String>, Error> {
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
