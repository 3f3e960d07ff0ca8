//! The API server, the cloud (ec2-sim on loop devices and one EC2 instance per node) and the
//! control plane: the EBS driver's controller service, the PV controller, the ephemeral volume
//! controller, the attach/detach controller, csi-attacher and csi-provisioner for
//! `ebs.csi.aws.com`; with `--hostpath-attach-required`, a controller-only hostpath driver and
//! a csi-attacher for it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser as _;
use ebs_cloud::{Cloud as _, CloudMetrics};
use ebs_cloud_aws::{AwsCloud, AwsConfig};
use ec2_sim::{Backing, DeviceLayout, SimConfig, Simulator, Timing};

use tokio_util::sync::CancellationToken;

use crate::HOSTPATH_DRIVER;
use crate::component_names::{
    ADC, ATTACHER, EBS_CONTROLLER, EPHEMERAL_VOLUME, HOSTPATH_CONTROLLER, PROVISIONER,
    PV_CONTROLLER, attacher_name,
};
use crate::config::{DEFAULT_PORT, Migration, SharedMigration, UpConfig};
use crate::identity::{self, Identity, Kubeconfigs};
use apiserver::write_private;

use crate::kubeconfig::kubeconfig_path;
use crate::supervisor::{self, Factory, Run, Stage, Supervisor};
use crate::{CLUSTER_NAME, Error, REGION};

/// apiserver-lite on 127.0.0.1, persistent under `<data-dir>/apiserver`, its kubeconfig
/// written to `<data-dir>/kubeconfig` (and `--kubeconfig-out`).
pub(crate) async fn start_api_server(
    config: &UpConfig,
    data_dir: &Path,
) -> Result<apiserver::RunningApiServer, Error> {
    // The events kept for watches that resume from a resourceVersion: kube-apiserver's watch
    // cache keeps 100 per resource to start with, and answers an older one 410 Gone (the
    // client lists again). apiserver-lite's default of 10,000 held ~80 MiB of superseded
    // object versions at 1,000 pods (docs/benchmarks.md); 2,000 cost no time there.
    const EVENT_WINDOW: usize = 2_000;
    let server_config = |port: u16| apiserver::Config {
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        data_dir: Some(data_dir.join("apiserver")),
        kubeconfig_out: Some(kubeconfig_path(data_dir)),
        audit: config.audit,
        // The pv-controller runs kcm's pvc-protection and pv-protection controllers.
        storage_object_in_use_protection: true,
        event_window: EVENT_WINDOW,
        ..apiserver::Config::default()
    };
    let server = match config.port {
        Some(port) => apiserver::ApiServer::start(server_config(port)).await,
        None => match apiserver::ApiServer::start(server_config(DEFAULT_PORT)).await {
            Err(apiserver::Error::Bind { .. }) => {
                apiserver::ApiServer::start(server_config(0)).await
            }
            other => other,
        },
    }
    .map_err(|e| Error::start("apiserver-lite", e))?;
    if let Some(out) = &config.kubeconfig_out {
        // It holds the admin's token: owner only, like the one under the data directory.
        write_private(out, server.kubeconfig_yaml().as_bytes())
            .map_err(|e| Error::io("writing the kubeconfig to", out, e))?;
    }
    Ok(server)
}

/// The cloud: ec2-sim, an EC2 client, and the instances of the nodes.
pub(crate) struct Cloud {
    pub(crate) sim: Simulator,
    pub(crate) aws: AwsConfig,
    /// The in-tree aws-ebs plugin's EC2 client (PV controller and attach/detach controller),
    /// as kube-controller-manager's `--cloud-provider=aws` has one.
    pub(crate) in_tree: Arc<AwsCloud>,
    /// Node i's instance: (instance ID, zone).
    pub(crate) instances: Vec<(String, String)>,
    /// The EBS driver's controller service's RPC and EC2 counters (the CSI path).
    pub(crate) ebs_metrics: ebs_driver::DriverMetrics,
}

/// ec2-sim with loop devices and one device dir per instance, state under `<data-dir>/ec2`;
/// one instance per node, zones spread over the first `--zones` of a, b, c. RunInstances carries a client token per
/// node, so a restart on the same data dir finds the same instances.
pub(crate) async fn start_cloud(config: &UpConfig, data_dir: &Path) -> Result<Cloud, Error> {
    // The sim checks signatures: a random key pair of this cluster, kept in
    // `<data-dir>/ec2/credentials` (0600, AWS shared-credentials format) across restarts.
    let state_dir = data_dir.join("ec2");
    let (credentials, file, new) = ec2_sim::Credentials::load_or_generate(&state_dir)
        .map_err(|e| Error::start("ec2-sim credentials", e))?;
    tracing::info!(file = %file.display(), generated = new, "ec2-sim credentials (AWS_SHARED_CREDENTIALS_FILE)");
    let (key_id, secret) = credentials
        .first()
        .map(|(k, s)| (k.to_string(), s.to_string()))
        .unwrap_or_default();
    let sim = Simulator::start(
        SimConfig {
            state_dir,
            credentials,
            timing: config.timing,
            backing: Backing::Loop,
            device_layout: DeviceLayout::PerInstance,
            ..SimConfig::default()
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .map_err(|e| Error::start("ec2-sim", e))?;
    let aws = aws_config(&sim.endpoint(), config.timing, (key_id, secret));
    let in_tree = Arc::new(
        AwsCloud::new(aws.clone(), CloudMetrics::new())
            .await
            .map_err(|e| Error::start("the in-tree aws-ebs plugin's EC2 client", e))?,
    );
    let zones = SimConfig::default().zones;
    let zones = &zones[..config.zones.clamp(1, zones.len())];
    let mut instances = Vec::new();
    for i in 0..config.nodes {
        let zone = zones[i % zones.len()].clone();
        let token = format!("csi-cluster-node-{i}");
        let instance = in_tree
            .run_instance(&token, Some(zone.as_str()))
            .await
            .map_err(|e| Error::start(format!("EC2 instance of node-{i}"), e))?;
        instances.push((instance.instance_id, instance.zone));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    for (id, _) in &instances {
        loop {
            let state = in_tree
                .get_instance(id)
                .await
                .map_err(|e| Error::start(format!("EC2 instance {id}"), e))?
                .state;
            if state == "running" {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("EC2 instance {id} running"),
                    waited: Duration::from_secs(120),
                    progress: format!("it is {state}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(Cloud {
        sim,
        aws,
        in_tree,
        instances,
        ebs_metrics: ebs_driver::DriverMetrics::default(),
    })
}

/// An EC2 client of ec2-sim: its credentials, and polling suited to its timing.
fn aws_config(endpoint: &str, timing: Timing, credentials: (String, String)) -> AwsConfig {
    let (poll_initial, poll_max) = match timing {
        Timing::Realistic => (Duration::from_millis(200), Duration::from_secs(2)),
        _ => (Duration::from_millis(20), Duration::from_millis(250)),
    };
    AwsConfig {
        region: Some(REGION.into()),
        endpoint: Some(endpoint.to_string()),
        static_credentials: Some(credentials),
        poll_initial,
        poll_max,
        ..AwsConfig::default()
    }
}

/// The EBS driver's controller service on `<data-dir>/sockets/ebs-controller.sock`.
pub(crate) fn start_ebs_controller(
    sup: &Supervisor,
    cloud: &Cloud,
    data_dir: &Path,
) -> Result<String, Error> {
    let dir = data_dir.join("sockets");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    let endpoint = format!("unix://{}", dir.join("ebs-controller.sock").display());
    let config = ebs_driver::DriverConfig {
        endpoint: endpoint.clone(),
        mode: ebs_driver::Mode::Controller,
        aws: cloud.aws.clone(),
        controller: ebs_driver::ControllerConfig {
            cluster_id: Some(CLUSTER_NAME.into()),
            publish: ebs_driver::PublishConfig {
                poll_initial: cloud.aws.poll_initial,
                poll_max: cloud.aws.poll_max,
                ..ebs_driver::PublishConfig::default()
            },
            ..ebs_driver::ControllerConfig::default()
        },
        metrics: cloud.ebs_metrics.clone(),
        ..ebs_driver::DriverConfig::default()
    };
    let factory = driver_factory(
        &endpoint,
        "the EBS driver's controller service",
        move |socket, stop| {
            supervisor::run(ebs_driver::serve(
                socket,
                config.clone(),
                stop.cancelled_owned(),
            ))
        },
    )?;
    sup.spawn(EBS_CONTROLLER, Stage::Drivers, factory);
    Ok(endpoint)
}

/// With a fault plan (`csi-cluster chaos`): a fault proxy in front of the driver at `endpoint`,
/// on `<socket dir>/<socket stem>-faults.sock` next to it, and that proxy's endpoint, which
/// the driver's callers then dial. Without one: `endpoint` itself.
pub(crate) fn fault_proxy(
    sup: &Supervisor,
    what: &str,
    endpoint: &str,
    plan: Option<&csi_spec::faults::FaultPlan>,
) -> Result<String, Error> {
    let Some(plan) = plan else {
        return Ok(endpoint.to_string());
    };
    let socket = csi_spec::parse_endpoint(endpoint).map_err(|e| Error::start(what, e))?;
    let stem = socket
        .file_stem()
        .map_or_else(|| "csi".into(), |s| s.to_string_lossy().into_owned());
    let proxy = socket.with_file_name(format!("{stem}-faults.sock"));
    let proxy_endpoint = format!("unix://{}", proxy.display());
    let (target, plan) = (endpoint.to_string(), plan.clone());
    let name = fault_proxy_name(what);
    let factory = driver_factory(&proxy_endpoint, &name, move |socket, stop| {
        let (target, plan) = (target.clone(), plan.clone());
        supervisor::run(async move {
            csi_spec::faults::serve_proxy(socket, &target, plan, stop.cancelled_owned()).await
        })
    })?;
    sup.spawn(&name, Stage::Drivers, factory);
    Ok(proxy_endpoint)
}

/// The component name of the fault proxy in front of `what`.
pub fn fault_proxy_name(what: &str) -> String {
    format!("{what}: CSI fault proxy")
}

/// A driver's factory: the socket is bound now, so the sidecars find it as soon as they start;
/// every later run (after a kill or failure) binds it again, replacing the stale file.
pub(crate) fn driver_factory<F>(endpoint: &str, what: &str, serve: F) -> Result<Factory, Error>
where
    F: Fn(csi_spec::UnixSocket, CancellationToken) -> Run + Send + Sync + 'static,
{
    let first = csi_spec::UnixSocket::bind(endpoint).map_err(|e| Error::start(what, e))?;
    let first = Mutex::new(Some(first));
    let endpoint = endpoint.to_string();
    let what = what.to_string();
    Ok(Arc::new(move |stop: CancellationToken| {
        let bound = first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .map_or_else(|| csi_spec::UnixSocket::bind(&endpoint), Ok);
        match bound {
            Ok(socket) => serve(socket, stop),
            Err(e) => {
                let why = format!("{what}: {e}");
                Box::pin(async move { Err(why) })
            }
        }
    }))
}

/// The PV controller, the attach/detach controller (both with the in-tree plugin's EC2 client
/// and the controller side's migration gate, read at each start), csi-attacher and
/// csi-provisioner for the EBS driver at `ebs_endpoint`; each with its own identity.
pub(crate) async fn start_controllers(
    sup: &Supervisor,
    cloud: &Cloud,
    kubeconfigs: &Kubeconfigs<'_>,
    migration: &SharedMigration,
    skip_attach: volume_plugins::SkipAttachMode,
    ebs_endpoint: &str,
    shared: &component_runtime::SharedCaches,
) -> Result<(), Error> {
    let in_tree: Arc<dyn ebs_cloud::Cloud> = cloud.in_tree.clone();

    let pv_client = kubeconfigs
        .client(
            &Identity::service_account(identity::PV_CONTROLLER_SA),
            &pv_controller::user_agent(),
        )
        .await?;
    let (cloud_for_pv, gates, caches) = (in_tree.clone(), migration.clone(), shared.clone());
    sup.spawn(
        PV_CONTROLLER,
        Stage::Controllers,
        Arc::new(move |stop| {
            let migrated = match controller_plugins(&gates) {
                Ok(m) => m,
                Err(e) => return Box::pin(async move { Err(e) }),
            };
            let mut config = pv_controller::Config::new(pv_controller::Options {
                migrated,
                ..pv_controller::Options::default()
            });
            config.cloud = Some(cloud_for_pv.clone());
            config.shared_caches = Some(caches.clone());
            supervisor::run(pv_controller::run(pv_client.clone(), config, stop))
        }),
    );

    // apiserver-lite has no garbage collector: the controller also deletes the claims of
    // pods that are gone (docs/ephemeral-volume.md).
    let ephemeral_client = kubeconfigs
        .client(
            &Identity::service_account(identity::EPHEMERAL_VOLUME_SA),
            &ephemeral_volume::user_agent(),
        )
        .await?;
    let caches = shared.clone();
    sup.spawn(
        EPHEMERAL_VOLUME,
        Stage::Controllers,
        Arc::new(move |stop| {
            let mut config = ephemeral_volume::Config::new(ephemeral_volume::Options {
                delete_orphaned_claims: true,
                ..ephemeral_volume::Options::default()
            });
            config.shared_caches = Some(caches.clone());
            supervisor::run(ephemeral_volume::run(
                ephemeral_client.clone(),
                config,
                stop,
            ))
        }),
    );

    let kubeconfig_for_adc = kubeconfigs.path(&Identity::service_account(identity::ADC_SA))?;
    let (gates, caches) = (migration.clone(), shared.clone());
    sup.spawn(
        ADC,
        Stage::Controllers,
        Arc::new(move |stop| {
            let migrated = match controller_plugins(&gates) {
                Ok(m) => m,
                Err(e) => return Box::pin(async move { Err(e) }),
            };
            let mut config = attach_detach::Config::new(
                Some(kubeconfig_for_adc.clone()),
                attach_detach::Options {
                    migrated,
                    skip_attach,
                    ..attach_detach::Options::default()
                },
            );
            config.cloud = Some(in_tree.clone());
            config.shared_caches = Some(caches.clone());
            supervisor::run(attach_detach::run(config, stop))
        }),
    );

    let sidecars = kubeconfigs.path(&Identity::attacher(crate::EBS_DRIVER))?;
    spawn_attacher(sup, ATTACHER, ebs_endpoint, &sidecars)?;

    let provisioner_client = kubeconfigs
        .client(
            &Identity::provisioner(crate::EBS_DRIVER),
            "csi-provisioner/csi-cluster",
        )
        .await?;
    let provisioner_config = provisioner_config(ebs_endpoint, &["--default-fstype=ext4".into()])?;
    sup.spawn(
        PROVISIONER,
        Stage::Controllers,
        Arc::new(move |stop| {
            supervisor::run(provisioner::run_with_client(
                provisioner_config.clone(),
                provisioner_client.clone(),
                stop,
            ))
        }),
    );
    Ok(())
}

/// A csi-attacher (named `name`) for the driver at `endpoint`; it learns the driver's name
/// from GetPluginInfo and serves every VolumeAttachment of that driver, whatever the node.
pub(crate) fn spawn_attacher(
    sup: &Supervisor,
    name: &str,
    endpoint: &str,
    kubeconfig: &Path,
) -> Result<(), Error> {
    let attacher_config = attacher::Config::try_parse_from(component_runtime::normalize_go_args(
        [
            "csi-attacher".to_string(),
            format!("--csi-address={endpoint}"),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--kube-api-qps=-1".into(),
            "--timeout=60s".into(),
            "--retry-interval-start=500ms".into(),
            "--retry-interval-max=30s".into(),
        ]
        .into_iter()
        .map(std::ffi::OsString::from),
    ))
    .map_err(|e| Error::start(name, e))?;
    sup.spawn(
        name,
        Stage::Controllers,
        Arc::new(move |stop| supervisor::run(attacher::run(attacher_config.clone(), stop))),
    );
    Ok(())
}

/// `--hostpath-attach-required`: a controller-only hostpath driver (`--enable-attach`, node ID
/// `controller`, its own empty state dir) on `<data-dir>/sockets/hostpath-controller.sock`, and
/// a csi-attacher talking to it. One attacher serves the VolumeAttachments of every node while
/// each node's volumes are known only to that node's driver: the controller-only instance
/// checks the node from the volume ID, which names it (docs/hostpath-driver.md, *Attach*).
pub(crate) fn start_hostpath_attach(
    sup: &Supervisor,
    data_dir: &Path,
    kubeconfigs: &Kubeconfigs<'_>,
    plan: Option<&csi_spec::faults::FaultPlan>,
) -> Result<(), Error> {
    let dir = data_dir.join("sockets");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    let endpoint = format!("unix://{}", dir.join("hostpath-controller.sock").display());
    let config = hostpath_driver::Config {
        endpoint: endpoint.clone(),
        node_id: "controller".into(),
        state_dir: data_dir.join("hostpath-controller"),
        enable_attach: true,
        ..hostpath_driver::Config::default()
    };
    let factory = driver_factory(
        &endpoint,
        "the hostpath driver's controller service",
        move |socket, stop| {
            supervisor::run(hostpath_driver::serve(
                socket,
                config.clone(),
                stop.cancelled_owned(),
            ))
        },
    )?;
    sup.spawn(HOSTPATH_CONTROLLER, Stage::Drivers, factory);
    let endpoint = fault_proxy(sup, HOSTPATH_CONTROLLER, &endpoint, plan)?;
    let kubeconfig = kubeconfigs.path(&Identity::attacher(HOSTPATH_DRIVER))?;
    spawn_attacher(sup, &attacher_name(HOSTPATH_DRIVER), &endpoint, &kubeconfig)
}

/// The plugins the controller side migrates now.
fn controller_plugins(gates: &SharedMigration) -> Result<volume_plugins::MigratedPlugins, String> {
    let on = gates
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .controller;
    volume_plugins::MigratedPlugins::from_feature_gates(Migration::gates(on))
        .map_err(|e| e.to_string())
}

/// A csi-provisioner for `driver` at `endpoint`: central, or `--node-deployment` for `node`;
/// reading the cluster from `informers` shared with the driver's other provisioners when given.
pub(crate) async fn spawn_provisioner(
    sup: &Supervisor,
    kubeconfigs: &Kubeconfigs<'_>,
    driver: &str,
    endpoint: &str,
    node: Option<&str>,
    informers: Option<&provisioner::Informers>,
) -> Result<(), Error> {
    let name = crate::component_names::external_provisioner(node, driver);
    let client = kubeconfigs
        .client(
            &Identity::provisioner(driver),
            &format!("csi-provisioner/csi-cluster {name}"),
        )
        .await?;
    let extra: Vec<String> = match node {
        Some(node) => vec!["--node-deployment".into(), format!("--node-name={node}")],
        None => Vec::new(),
    };
    let config = provisioner_config(endpoint, &extra)?;
    let informers = informers.cloned();
    sup.spawn(
        name,
        Stage::Controllers,
        Arc::new(move |stop| match &informers {
            Some(shared) => supervisor::run(provisioner::run_with_informers(
                config.clone(),
                client.clone(),
                shared.clone(),
                stop,
            )),
            None => supervisor::run(provisioner::run_with_client(
                config.clone(),
                client.clone(),
                stop,
            )),
        }),
    );
    Ok(())
}

/// The user agent of the watches a driver's node-deployment provisioners share.
pub(crate) fn provisioner_informers_agent(driver: &str) -> String {
    format!("csi-provisioner/csi-cluster informers {driver}")
}

/// csi-provisioner's flags for the driver at `endpoint`, as deploy/ runs it (topology on,
/// PVC metadata passed), plus `extra`.
pub(crate) fn provisioner_config(
    endpoint: &str,
    extra: &[String],
) -> Result<provisioner::Config, Error> {
    let args = [
        "csi-provisioner".to_string(),
        format!("--csi-address={endpoint}"),
        "--feature-gates=Topology=true".into(),
        "--extra-create-metadata".into(),
        "--timeout=60s".into(),
        "--worker-threads=10".into(),
        "--retry-interval-start=500ms".into(),
        "--retry-interval-max=30s".into(),
    ]
    .into_iter()
    .chain(extra.iter().cloned())
    .map(std::ffi::OsString::from);
    provisioner::Config::try_parse_from(component_runtime::normalize_go_args(args))
        .map_err(|e| Error::start("csi-provisioner", e))
}
