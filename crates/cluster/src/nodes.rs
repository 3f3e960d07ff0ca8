//! One node `node-<i>`: the EBS driver in node mode for the node's EC2 instance (its device
//! dir in ec2-sim is the node's `/dev`), the hostpath driver, a registrar per driver (the
//! kubelet plugin registration path, as on a real node), the node agent and a hostpath
//! provisioner in `--node-deployment` mode (hostpath volumes live on one node, so only that
//! node's driver can create them).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::component_names::{ebs_node_driver, hostpath_driver, node_agent, registrar};
use crate::config::{Migration, SharedMigration, UpConfig};
use crate::control_plane::{self, driver_factory};
use crate::identity::{Identity, Kubeconfigs};
use crate::supervisor::{self, Stage, Supervisor};
use crate::{EBS_DRIVER, Error, HOSTPATH_DRIVER, REGION};

/// Volumes one node may have attached: the EBS driver's default (Nitro's 28 slots less the
/// root volume and a network interface, as ec2-sim's default limit of 26 leaves room for).
const EBS_ATTACH_LIMIT: i64 = 25;

/// What a node is.
#[derive(Debug, Clone)]
pub(crate) struct NodeSpec {
    pub(crate) name: String,
    pub(crate) instance_id: String,
    pub(crate) zone: String,
    /// The instance's device dir in ec2-sim: the EBS driver's and the agent's `--dev-root`.
    pub(crate) dev_root: PathBuf,
    /// The node's EBS driver's RPC counters (NodeStage/NodePublish: the CSI mount path).
    pub(crate) ebs_metrics: ebs_driver::DriverMetrics,
}

impl NodeSpec {
    /// `<data-dir>/nodes/<name>`.
    pub(crate) fn dir(&self, data_dir: &Path) -> PathBuf {
        data_dir.join("nodes").join(&self.name)
    }

    /// The kubelet's `--root-dir`.
    pub(crate) fn root_dir(&self, data_dir: &Path) -> PathBuf {
        self.dir(data_dir).join("kubelet")
    }
}

/// A driver's socket under the kubelet root: `<root-dir>/plugins/<driver>/csi.sock`.
pub(crate) fn driver_socket(root_dir: &Path, driver: &str) -> Result<PathBuf, Error> {
    let dir = root_dir.join("plugins").join(driver);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    Ok(dir.join("csi.sock"))
}

/// A node-driver-registrar for `driver` on `node`: the kubelet plugin registration path, as
/// on a real node (the node agent learns the driver and its socket from it).
pub(crate) fn spawn_registrar(
    sup: &Supervisor,
    node: &str,
    driver: &str,
    socket: &Path,
    registration_path: &Path,
    registry: &Path,
) {
    let config = registrar::Config {
        csi_address: socket.display().to_string(),
        kubelet_registration_path: registration_path.display().to_string(),
        plugin_registration_path: registry.to_path_buf(),
        timeout: Duration::from_secs(10),
        http_endpoint: None,
        mode: registrar::Mode::Registration,
        v: 0,
    };
    sup.spawn(
        registrar(node, driver),
        Stage::Drivers,
        Arc::new(move |stop| supervisor::run(registrar::run(config.clone(), stop))),
    );
}

/// The hostpath driver's capacity on a node that runs up to `max_pods` pods: the driver's
/// 100 GiB at the kubelet's default of 110 pods or fewer; above that, room for a 1 GiB volume
/// per pod (`csi-bench stack` gives each pod a 1 GiB claim, and capacity tracking would stop
/// it at 100 pods a node).
fn hostpath_capacity(max_pods: u32) -> u64 {
    if max_pods <= crate::config::DEFAULT_MAX_PODS {
        hostpath_driver::DEFAULT_CAPACITY
    } else {
        hostpath_driver::DEFAULT_CAPACITY.max(u64::from(max_pods) << 30)
    }
}

/// What every node's components are started with.
#[derive(Clone, Copy)]
pub(crate) struct NodeEnv<'a, 'k> {
    pub sup: &'a Supervisor,
    pub data_dir: &'a Path,
    pub kubeconfigs: &'a Kubeconfigs<'k>,
    /// Each node's migration gate.
    pub migration: &'a SharedMigration,
    pub config: &'a UpConfig,
    /// The watches the nodes' hostpath provisioners share.
    pub hostpath_informers: &'a provisioner::Informers,
}

/// Starts everything of `node`, the `index`-th node (its migration gate in `env.migration`).
pub(crate) async fn start_node(
    env: NodeEnv<'_, '_>,
    node: &NodeSpec,
    index: usize,
) -> Result<(), Error> {
    let NodeEnv {
        sup,
        data_dir,
        kubeconfigs,
        migration,
        config,
        hostpath_informers,
    } = env;
    let skip_attach = config.skip_attach;
    let root = node.root_dir(data_dir);
    let registry = root.join("plugins_registry");
    for d in [&registry, &node.dev_root] {
        std::fs::create_dir_all(d).map_err(|e| Error::io("creating", d, e))?;
    }

    // The EBS driver's node service: no EC2 calls, the instance's identity given.
    let ebs_socket = driver_socket(&root, EBS_DRIVER)?;
    let ebs_endpoint = format!("unix://{}", ebs_socket.display());
    let ebs_config = ebs_driver::DriverConfig {
        endpoint: ebs_endpoint.clone(),
        mode: ebs_driver::Mode::Node,
        node: ebs_driver::NodeConfig {
            dev_root: node.dev_root.clone(),
            device_wait: Duration::from_secs(60),
            device_poll: Duration::from_millis(50),
            ..ebs_driver::NodeConfig::default()
        },
        node_info: ebs_driver::NodeInfo {
            node_id: node.instance_id.clone(),
            zone: Some(node.zone.clone()),
            max_volumes_per_node: EBS_ATTACH_LIMIT,
        },
        metrics: node.ebs_metrics.clone(),
        ..ebs_driver::DriverConfig::default()
    };
    let factory = driver_factory(
        &ebs_endpoint,
        &format!("{}: the EBS driver", node.name),
        move |socket, stop| {
            supervisor::run(ebs_driver::serve(
                socket,
                ebs_config.clone(),
                stop.cancelled_owned(),
            ))
        },
    )?;
    sup.spawn(ebs_node_driver(&node.name), Stage::Drivers, factory);

    // The hostpath driver: node ID = node name (its topology value, and the prefix of its
    // volume IDs, which the controller-only instance checks ControllerPublish against).
    let hostpath_socket = driver_socket(&root, HOSTPATH_DRIVER)?;
    let hostpath_endpoint = format!("unix://{}", hostpath_socket.display());
    let hostpath_config = hostpath_driver::Config {
        endpoint: hostpath_endpoint.clone(),
        node_id: node.name.clone(),
        state_dir: node.dir(data_dir).join("hostpath"),
        enable_attach: config.hostpath_attach_required,
        capacity_bytes: hostpath_capacity(config.max_pods),
        ..hostpath_driver::Config::default()
    };
    let factory = driver_factory(
        &hostpath_endpoint,
        &format!("{}: the hostpath driver", node.name),
        move |socket, stop| {
            supervisor::run(hostpath_driver::serve(
                socket,
                hostpath_config.clone(),
                stop.cancelled_owned(),
            ))
        },
    )?;
    sup.spawn(hostpath_driver(&node.name), Stage::Drivers, factory);

    // `chaos`: the node agent and the node's provisioner dial the drivers through fault
    // proxies (the registrar tells the agent the proxy's socket, as a kubelet would be told).
    let plan = config.csi_faults.as_ref();
    let ebs_proxy =
        control_plane::fault_proxy(sup, &ebs_node_driver(&node.name), &ebs_endpoint, plan)?;
    let hostpath_endpoint =
        control_plane::fault_proxy(sup, &hostpath_driver(&node.name), &hostpath_endpoint, plan)?;
    for (driver, socket, registered) in [
        (EBS_DRIVER, &ebs_socket, ebs_proxy),
        (HOSTPATH_DRIVER, &hostpath_socket, hostpath_endpoint.clone()),
    ] {
        let registered = csi_spec::parse_endpoint(&registered)
            .map_err(|e| Error::start(registrar(&node.name, driver), e))?;
        spawn_registrar(sup, &node.name, driver, socket, &registered, &registry);
    }

    let mut options = node_agent::Options::new(&node.name, &root);
    options.provider_id = Some(format!("aws:///{}/{}", node.zone, node.instance_id));
    options.dev_root = node.dev_root.clone();
    options.skip_attach = skip_attach;
    options.max_pods = config.max_pods;
    // The well-known labels a cloud node has; the in-tree provisioner picks the zone from them.
    options.node_labels = [
        ("topology.kubernetes.io/zone", node.zone.as_str()),
        ("topology.kubernetes.io/region", REGION),
        ("node.kubernetes.io/instance-type", "m5.large"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // The kubelet's own credential: system:node:<name>.
    let kubeconfig_for_agent = kubeconfigs.path(&Identity::node(&node.name))?;
    let gates = migration.clone();
    sup.spawn(
        node_agent(&node.name),
        Stage::Controllers,
        Arc::new(move |stop| {
            let on = gates
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .node(index);
            let mut options = options.clone();
            match volume_plugins::MigratedPlugins::from_feature_gates(Migration::gates(on)) {
                Ok(m) => options.migrated = m,
                Err(e) => {
                    let why = e.to_string();
                    return Box::pin(async move { Err(why) });
                }
            }
            let agent = node_agent::Config::new(Some(kubeconfig_for_agent.clone()), options);
            supervisor::run(node_agent::run(agent, stop))
        }),
    );

    control_plane::spawn_provisioner(
        sup,
        kubeconfigs,
        HOSTPATH_DRIVER,
        &hostpath_endpoint,
        Some(&node.name),
        Some(hostpath_informers),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostpath_capacity_follows_max_pods_above_the_default() {
        assert_eq!(hostpath_capacity(100), hostpath_driver::DEFAULT_CAPACITY);
        assert_eq!(hostpath_capacity(110), hostpath_driver::DEFAULT_CAPACITY);
        assert_eq!(hostpath_capacity(125), 125 << 30);
        assert_eq!(hostpath_capacity(312), 312 << 30);
    }
}
