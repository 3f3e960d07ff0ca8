//! Plugin registration end to end: the node agent's PluginManager and NodeInfoManager against
//! the embedded API server, with drivers on real unix sockets registering through our
//! csi-node-driver-registrar or through registration sockets the test serves in the kubelet's
//! wire format (pluginregistration.v1).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common_pm;

use std::collections::BTreeMap;
use std::time::Duration;
use test_support::net::http_get;

use common_pm::*;
use csi_spec::v1::NodeGetInfoRequest;
use csi_spec::v1::node_client::NodeClient;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use node_agent::nodeinfomanager::{
    MIGRATED_PLUGINS_ANNOTATION, NODE_ID_ANNOTATION, NodeInfoManager,
};
use tokio_util::sync::CancellationToken;

fn registrar_config(env: &Env, driver_socket: &std::path::Path) -> registrar::Config {
    registrar::Config {
        csi_address: format!("unix://{}", driver_socket.display()),
        kubelet_registration_path: driver_socket.display().to_string(),
        plugin_registration_path: env.registry_dir.clone(),
        timeout: Duration::from_secs(5),
        http_endpoint: Some("127.0.0.1:0".into()),
        mode: registrar::Mode::Registration,
        v: 0,
    }
}

async fn wait_healthy(running: &registrar::Running) {
    let addr = running.http_addr().unwrap();
    test_support::eventually(
        "the registrar reports the kubelet's registration",
        PATIENCE,
        || async move {
            let (status, body) = http_get(addr, "/healthz").await;
            (status == 200 && body == "ok\n").then_some(())
        },
    )
    .await;
}

/// Our registrar in-process in front of a CSI node service: the kubelet's path, end to end.
#[tokio::test]
async fn registers_a_driver_through_the_registrar() {
    let env = Env::start(&[("kubernetes.io/hostname", NODE)]).await;
    let driver_socket = env.dir.path().join("driver/csi.sock");
    let answers = DriverAnswers::new(
        "test.csi.rs",
        "node-id-1",
        &[(ZONE_KEY, "zone-a"), (RACK_KEY, "r1")],
        7,
    );
    let driver = start_driver(&driver_socket, &answers);
    let running = registrar::start(
        &registrar_config(&env, &driver_socket),
        "test.csi.rs".into(),
    )
    .await
    .unwrap();

    let entry = env.wait_for_entry("test.csi.rs", |_| true).await;
    assert_eq!(entry.node_id, "node-id-1");
    assert_eq!(
        entry.topology_keys,
        Some(vec![RACK_KEY.to_owned(), ZONE_KEY.to_owned()]),
        "sorted topology keys"
    );
    assert_eq!(entry.allocatable.and_then(|a| a.count), Some(7));

    // The registrar was told: its /healthz turns 200 only after NotifyRegistrationStatus(true).
    wait_healthy(&running).await;

    let node = env.node().await;
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels.get(ZONE_KEY).map(String::as_str), Some("zone-a"));
    assert_eq!(labels.get(RACK_KEY).map(String::as_str), Some("r1"));
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(NODE),
        "other labels kept"
    );
    let ids = node.metadata.annotations.clone().unwrap()[NODE_ID_ANNOTATION].clone();
    let ids: BTreeMap<String, String> = serde_json::from_str(&ids).unwrap();
    assert_eq!(
        ids,
        BTreeMap::from([("test.csi.rs".to_owned(), "node-id-1".to_owned())])
    );

    let registered = env.wait_for_driver("test.csi.rs", |_| true).await;
    assert_eq!(registered.endpoint, driver_socket.display().to_string());
    assert_eq!(registered.node_id, "node-id-1");
    assert_eq!(registered.max_volumes_per_node, Some(7));
    assert!(registered.stage_unstage);
    assert!(!registered.volume_stats);
    assert_eq!(
        registered.topology.get(ZONE_KEY).map(String::as_str),
        Some("zone-a")
    );
    // The channel the volume manager will use reaches the driver.
    let info = NodeClient::new(registered.channel.clone())
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-id-1");

    let csinode = env.csinode().await;
    assert_eq!(
        csinode.metadata.annotations.unwrap()[MIGRATED_PLUGINS_ANNOTATION],
        migrated().annotation_value()
    );
    assert_eq!(migrated().annotation_value(), "kubernetes.io/aws-ebs");

    let socket = running.socket_path().display().to_string();
    let series: Vec<String> = ["desired_state_of_world", "actual_state_of_world"]
        .iter()
        .map(|state| {
            format!("plugin_manager_total_plugins{{socket_path=\"{socket}\",state=\"{state}\"}} 1")
        })
        .collect();
    // The loop records the registration just after the plugin was told.
    test_support::eventually(
        "both plugin_manager_total_plugins series",
        PATIENCE,
        || async {
            let text = env.metrics_text();
            series.iter().all(|s| text.contains(s)).then_some(())
        },
    )
    .await;

    let shutdown = CancellationToken::new();
    shutdown.cancel();
    running.wait(shutdown).await.unwrap();
    driver.stop().await;
    env.stop().await;
}

/// A registration socket the test serves, as any kubelet plugin would.
#[tokio::test]
async fn registers_a_plugin_speaking_the_kubelet_wire_format() {
    let env = Env::start(&[]).await;
    let driver_socket = env.dir.path().join("wire/csi.sock");
    let answers = DriverAnswers::new("wire.csi.rs", "wire-node", &[], 0);
    let driver = start_driver(&driver_socket, &answers);
    let (reg, statuses) = start_registration(
        &env.socket("wire.csi.rs-reg.sock"),
        plugin_info(
            "CSIPlugin",
            "wire.csi.rs",
            &driver_socket.display().to_string(),
            &["0.3.0", "1.2.0"],
        ),
        None,
    );

    let status = wait_for_status(&statuses, "a registration status", |_| true).await;
    assert!(status.plugin_registered, "{status:?}");
    assert_eq!(status.error, "");
    let entry = env.wait_for_entry("wire.csi.rs", |_| true).await;
    assert_eq!(entry.node_id, "wire-node");
    assert_eq!(entry.allocatable, None, "no limit reported, none written");
    assert_eq!(
        entry.topology_keys.unwrap_or_default(),
        Vec::<String>::new()
    );
    let registered = env.wait_for_driver("wire.csi.rs", |_| true).await;
    assert_eq!(registered.max_volumes_per_node, None);
    assert_eq!(env.drivers.names(), vec!["wire.csi.rs"]);
    assert_eq!(
        statuses.lock().unwrap().len(),
        1,
        "registered once, told once"
    );

    reg.stop().await;
    driver.stop().await;
    env.stop().await;
}

/// The kubelet's refusals: a type it has no handler for, a CSI version it does not speak, no
/// name, a driver without a node ID, a topology label that contradicts the Node's.
#[tokio::test]
async fn refuses_what_the_kubelet_refuses_and_says_why() {
    let env = Env::start(&[(ZONE_KEY, "zone-b")]).await;
    let driver_socket = env.dir.path().join("ok/csi.sock");
    let endpoint = driver_socket.display().to_string();
    let _driver = start_driver(
        &driver_socket,
        &DriverAnswers::new("x.csi.rs", "id", &[], 0),
    );
    let no_id_socket = env.dir.path().join("no-id/csi.sock");
    let _no_id = start_driver(
        &no_id_socket,
        &DriverAnswers::new("noid.csi.rs", "", &[], 0),
    );
    let clash_socket = env.dir.path().join("clash/csi.sock");
    let _clash = start_driver(
        &clash_socket,
        &DriverAnswers::new("clash.csi.rs", "id", &[(ZONE_KEY, "zone-a")], 0),
    );

    let cases = [
        (
            "device.sock",
            plugin_info("DevicePlugin", "gpu.example.com", &endpoint, &["v1beta1"]),
            "DevicePlugin",
        ),
        (
            "old.sock",
            plugin_info("CSIPlugin", "old.csi.rs", &endpoint, &["0.3.0"]),
            "0.3.0",
        ),
        (
            "future.sock",
            plugin_info("CSIPlugin", "future.csi.rs", &endpoint, &["2.0.0"]),
            "2.0.0",
        ),
        (
            "nameless.sock",
            plugin_info("CSIPlugin", "", &endpoint, &["1.0.0"]),
            "empty name",
        ),
        (
            "no-id.sock",
            plugin_info(
                "CSIPlugin",
                "noid.csi.rs",
                &no_id_socket.display().to_string(),
                &["1.0.0"],
            ),
            "node_id",
        ),
        (
            "clash.sock",
            plugin_info(
                "CSIPlugin",
                "clash.csi.rs",
                &clash_socket.display().to_string(),
                &["1.0.0"],
            ),
            "zone-b",
        ),
    ];
    let mut servers = Vec::new();
    for (file, info, _) in &cases {
        servers.push(start_registration(&env.socket(file), info.clone(), None));
    }
    for ((file, _, needle), (_, statuses)) in cases.iter().zip(&servers) {
        let status = wait_for_status(statuses, &format!("{file} is told"), |_| true).await;
        assert!(!status.plugin_registered, "{file}: {status:?}");
        assert!(
            status.error.contains(needle),
            "{file}: {:?} should name {needle:?}",
            status.error
        );
    }
    let clash = servers[5].1.lock().unwrap()[0].error.clone();
    assert!(clash.contains("zone-a"), "both values named: {clash}");

    // Still refused when retried (backoff 100 ms here), and nothing was ever recorded.
    test_support::eventually("the device plugin is retried", PATIENCE, || async {
        (servers[0].1.lock().unwrap().len() >= 2).then_some(())
    })
    .await;
    assert!(
        servers[0]
            .1
            .lock()
            .unwrap()
            .iter()
            .all(|s| !s.plugin_registered)
    );
    assert_eq!(env.csinode_drivers().await, Vec::<CSINodeDriver>::new());
    assert!(env.drivers.names().is_empty(), "{:?}", env.drivers.names());
    let labels = env.node().await.metadata.labels.unwrap();
    assert_eq!(
        labels[ZONE_KEY], "zone-b",
        "the Node's label is not overwritten"
    );
    env.stop().await;
}

/// The registration socket goes away: the driver leaves the registry and the CSINode; its
/// topology labels stay, as with the kubelet.
#[tokio::test]
async fn removing_the_socket_deregisters_the_driver() {
    let env = Env::start(&[]).await;
    let driver_socket = env.dir.path().join("gone/csi.sock");
    let answers = DriverAnswers::new("gone.csi.rs", "gone-node", &[(ZONE_KEY, "z1")], 3);
    let driver = start_driver(&driver_socket, &answers);
    let reg_socket = env.socket("gone.csi.rs-reg.sock");
    let (reg, statuses) = start_registration(
        &reg_socket,
        plugin_info(
            "CSIPlugin",
            "gone.csi.rs",
            &driver_socket.display().to_string(),
            &["1.0.0"],
        ),
        None,
    );
    wait_for_status(&statuses, "registered", |s| s.plugin_registered).await;
    env.wait_for_entry("gone.csi.rs", |_| true).await;
    env.wait_for_driver("gone.csi.rs", |_| true).await;

    reg.stop().await;
    assert!(!reg_socket.exists());
    env.wait_for_no_entry("gone.csi.rs").await;
    test_support::eventually("the driver leaves the registry", PATIENCE, || async {
        env.drivers.get("gone.csi.rs").is_none().then_some(())
    })
    .await;
    // The CSINode entry goes first, then the Node's node ID annotation entry.
    let node = test_support::eventually("the node ID annotation entry goes", PATIENCE, || async {
        let node = env.node().await;
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        (!annotations.contains_key(NODE_ID_ANNOTATION)).then_some(node)
    })
    .await;
    assert_eq!(
        node.metadata.labels.unwrap()[ZONE_KEY],
        "z1",
        "topology labels stay"
    );
    let socket = reg_socket.display().to_string();
    test_support::eventually("the socket leaves the metrics", PATIENCE, || async {
        (!env.metrics_text().contains(&socket)).then_some(())
    })
    .await;
    driver.stop().await;
    env.stop().await;
}

/// A driver restarts: its registrar goes (socket removed) and comes back, and the driver now
/// reports another node ID. One entry, with the new ID.
#[tokio::test]
async fn a_restarted_driver_is_registered_again_with_its_new_node_id() {
    let env = Env::start(&[]).await;
    let driver_socket = env.dir.path().join("restart/csi.sock");
    let answers = DriverAnswers::new("restart.csi.rs", "node-id-1", &[], 0);
    let driver = start_driver(&driver_socket, &answers);
    let config = registrar_config(&env, &driver_socket);
    let first = registrar::start(&config, "restart.csi.rs".into())
        .await
        .unwrap();
    env.wait_for_entry("restart.csi.rs", |e| e.node_id == "node-id-1")
        .await;
    wait_healthy(&first).await;

    let shutdown = CancellationToken::new();
    shutdown.cancel();
    first.wait(shutdown).await.unwrap();
    answers.set_node_id("node-id-2");
    let second = registrar::start(&config, "restart.csi.rs".into())
        .await
        .unwrap();

    env.wait_for_entry("restart.csi.rs", |e| e.node_id == "node-id-2")
        .await;
    wait_healthy(&second).await;
    env.wait_for_driver("restart.csi.rs", |d| d.node_id == "node-id-2")
        .await;
    let drivers = env.csinode_drivers().await;
    assert_eq!(drivers.len(), 1, "no duplicate entry: {drivers:?}");

    let shutdown = CancellationToken::new();
    shutdown.cancel();
    second.wait(shutdown).await.unwrap();
    driver.stop().await;
    env.stop().await;
}

/// The socket is removed and created again faster than the directory is scanned: it is still
/// seen as a new registration (new inode / times), not as the old one.
#[tokio::test]
async fn a_socket_replaced_between_two_scans_is_registered_again() {
    let env = Env::start_polling(&[], Duration::from_millis(400)).await;
    let driver_socket = env.dir.path().join("fast/csi.sock");
    let answers = DriverAnswers::new("fast.csi.rs", "before", &[], 0);
    let driver = start_driver(&driver_socket, &answers);
    let reg_socket = env.socket("fast.csi.rs-reg.sock");
    let info = plugin_info(
        "CSIPlugin",
        "fast.csi.rs",
        &driver_socket.display().to_string(),
        &["1.0.0"],
    );
    let (reg, statuses) = start_registration(&reg_socket, info.clone(), None);
    wait_for_status(&statuses, "first registration", |s| s.plugin_registered).await;
    env.wait_for_entry("fast.csi.rs", |e| e.node_id == "before")
        .await;

    answers.set_node_id("after");
    reg.stop().await;
    // More than one tick of the kernel's coarse clock, far less than a scan interval.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let (reg, statuses) = start_registration(&reg_socket, info, None);
    wait_for_status(&statuses, "the new socket is registered", |s| {
        s.plugin_registered
    })
    .await;
    env.wait_for_entry("fast.csi.rs", |e| e.node_id == "after")
        .await;
    env.wait_for_driver("fast.csi.rs", |d| d.node_id == "after")
        .await;
    assert_eq!(env.csinode_drivers().await.len(), 1);

    reg.stop().await;
    driver.stop().await;
    env.stop().await;
}

/// Two sockets claim one driver name: the later registration wins, and removing the earlier
/// socket leaves the driver registered.
#[tokio::test]
async fn a_second_socket_for_a_driver_replaces_the_first_and_outlives_it() {
    let env = Env::start(&[]).await;
    let old_socket = env.dir.path().join("old/csi.sock");
    let new_socket = env.dir.path().join("new/csi.sock");
    let old_driver = start_driver(
        &old_socket,
        &DriverAnswers::new("dup.csi.rs", "id-old", &[], 0),
    );
    let new_driver = start_driver(
        &new_socket,
        &DriverAnswers::new("dup.csi.rs", "id-new", &[], 0),
    );
    let old_reg_socket = env.socket("dup.csi.rs-reg.sock");
    let (old_reg, old_statuses) = start_registration(
        &old_reg_socket,
        plugin_info(
            "CSIPlugin",
            "dup.csi.rs",
            &old_socket.display().to_string(),
            &["1.0.0"],
        ),
        None,
    );
    wait_for_status(&old_statuses, "old registered", |s| s.plugin_registered).await;
    env.wait_for_entry("dup.csi.rs", |e| e.node_id == "id-old")
        .await;

    let (new_reg, new_statuses) = start_registration(
        &env.socket("dup.csi.rs-v2-reg.sock"),
        plugin_info(
            "CSIPlugin",
            "dup.csi.rs",
            &new_socket.display().to_string(),
            &["1.0.0"],
        ),
        None,
    );
    wait_for_status(&new_statuses, "new registered", |s| s.plugin_registered).await;
    env.wait_for_entry("dup.csi.rs", |e| e.node_id == "id-new")
        .await;
    env.wait_for_driver("dup.csi.rs", |d| {
        d.endpoint == new_socket.display().to_string()
    })
    .await;

    old_reg.stop().await;
    let old = old_reg_socket.display().to_string();
    test_support::eventually("the old socket leaves the metrics", PATIENCE, || async {
        (!env.metrics_text().contains(&old)).then_some(())
    })
    .await;
    // The deregistration of the old socket runs after it left the actual state; give it time
    // to (wrongly) remove the driver before checking that it did not.
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.wait_for_entry("dup.csi.rs", |e| e.node_id == "id-new")
        .await;
    let registered = env.drivers.get("dup.csi.rs").expect("still registered");
    assert_eq!(registered.node_id, "id-new");

    new_reg.stop().await;
    env.wait_for_no_entry("dup.csi.rs").await;
    old_driver.stop().await;
    new_driver.stop().await;
    env.stop().await;
}

/// No endpoint in GetInfo: the driver serves CSI on the registration socket itself.
#[tokio::test]
async fn an_empty_endpoint_means_the_registration_socket() {
    let env = Env::start(&[]).await;
    let reg_socket = env.socket("self.csi.rs.sock");
    let answers = DriverAnswers::new("self.csi.rs", "self-node", &[], 2);
    let (reg, statuses) = start_registration(
        &reg_socket,
        plugin_info("CSIPlugin", "self.csi.rs", "", &["1.0.0"]),
        Some(&answers),
    );
    wait_for_status(&statuses, "registered", |s| s.plugin_registered).await;
    let entry = env.wait_for_entry("self.csi.rs", |_| true).await;
    assert_eq!(entry.node_id, "self-node");
    let registered = env.wait_for_driver("self.csi.rs", |_| true).await;
    assert_eq!(registered.endpoint, reg_socket.display().to_string());
    reg.stop().await;
    env.stop().await;
}

#[tokio::test]
async fn init_csinode_creates_a_csinode_owned_by_the_node() {
    let api = api_server().await;
    let node = create_node(&api.kube, &[]).await;
    let manager = NodeInfoManager::new(api.kube.clone(), NODE, migrated());
    let created = manager.init_csinode().await.unwrap();
    let stored = Api::<CSINode>::all(api.kube.clone())
        .get(NODE)
        .await
        .unwrap();
    assert_eq!(stored.metadata.uid, created.metadata.uid);
    let owners = stored.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].api_version, "v1");
    assert_eq!(owners[0].kind, "Node");
    assert_eq!(owners[0].name, NODE);
    assert_eq!(Some(&owners[0].uid), node.metadata.uid.as_ref());
    assert!(stored.spec.drivers.is_empty());
    assert_eq!(
        stored.metadata.annotations.unwrap()[MIGRATED_PLUGINS_ANNOTATION],
        "kubernetes.io/aws-ebs"
    );
}

#[tokio::test]
async fn init_csinode_adopts_an_existing_csinode_and_fixes_it() {
    let api = api_server().await;
    let node = create_node(&api.kube, &[]).await;
    let csinodes = Api::<CSINode>::all(api.kube.clone());
    let other = CSINodeDriver {
        name: "other.csi.rs".into(),
        node_id: "other-id".into(),
        ..CSINodeDriver::default()
    };
    csinodes
        .create(
            &PostParams::default(),
            &CSINode {
                metadata: ObjectMeta {
                    name: Some(NODE.into()),
                    annotations: Some(BTreeMap::from([
                        (
                            MIGRATED_PLUGINS_ANNOTATION.to_owned(),
                            "kubernetes.io/gce-pd".to_owned(),
                        ),
                        ("example.com/keep".to_owned(), "me".to_owned()),
                    ])),
                    ..ObjectMeta::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![other.clone()],
                },
            },
        )
        .await
        .unwrap();

    let manager = NodeInfoManager::new(api.kube.clone(), NODE, migrated());
    let adopted = manager.init_csinode().await.unwrap();
    let annotations = adopted.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations[MIGRATED_PLUGINS_ANNOTATION],
        "kubernetes.io/aws-ebs"
    );
    assert_eq!(
        annotations["example.com/keep"], "me",
        "other annotations kept"
    );
    let owners = adopted.metadata.owner_references.clone().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (owners[0].kind.as_str(), Some(&owners[0].uid)),
        ("Node", node.metadata.uid.as_ref())
    );
    assert_eq!(adopted.spec.drivers.len(), 1);
    assert_eq!(
        adopted.spec.drivers[0].name, "other.csi.rs",
        "existing drivers kept"
    );
    let stored = csinodes.get(NODE).await.unwrap();
    assert_eq!(
        stored.metadata.annotations.unwrap()[MIGRATED_PLUGINS_ANNOTATION],
        "kubernetes.io/aws-ebs"
    );

    // Again: nothing to fix, nothing written.
    let again = manager.init_csinode().await.unwrap();
    assert_eq!(
        again.metadata.resource_version,
        adopted.metadata.resource_version
    );
}

/// Two managers (no shared lock) install drivers at once: every write that read a stale
/// CSINode gets 409 and is redone, so no entry is lost.
#[tokio::test]
async fn concurrent_installs_lose_no_entry() {
    let api = api_server().await;
    create_node(&api.kube, &[]).await;
    let a = NodeInfoManager::new(api.kube.clone(), NODE, migrated());
    let b = NodeInfoManager::new(api.kube.clone(), NODE, migrated());
    a.init_csinode().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let manager = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let driver = node_agent::RegisteredDriver {
                name: format!("d{i}.csi.rs"),
                endpoint: "/nonexistent.sock".into(),
                node_id: format!("id-{i}"),
                max_volumes_per_node: None,
                topology: BTreeMap::from([(format!("topology.d{i}.csi.rs/zone"), "z".to_owned())]),
                stage_unstage: false,
                volume_stats: false,
                single_node_multi_writer: false,
                channel: csi_spec::connect_unix_lazy("/nonexistent.sock").unwrap(),
            };
            manager.install_driver(&driver).await
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let csinode = Api::<CSINode>::all(api.kube.clone())
        .get(NODE)
        .await
        .unwrap();
    let mut names: Vec<String> = csinode
        .spec
        .drivers
        .iter()
        .map(|d| d.name.clone())
        .collect();
    names.sort();
    assert_eq!(
        names,
        (0..6).map(|i| format!("d{i}.csi.rs")).collect::<Vec<_>>()
    );
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(api.kube.clone())
        .get(NODE)
        .await
        .unwrap();
    let labels = node.metadata.labels.unwrap();
    assert!(
        (0..6).all(|i| labels.contains_key(&format!("topology.d{i}.csi.rs/zone"))),
        "{labels:?}"
    );

    a.uninstall_driver("d0.csi.rs").await.unwrap();
    a.uninstall_driver("never-installed.csi.rs").await.unwrap();
    let csinode = Api::<CSINode>::all(api.kube.clone())
        .get(NODE)
        .await
        .unwrap();
    assert_eq!(csinode.spec.drivers.len(), 5);
    assert!(!csinode.spec.drivers.iter().any(|d| d.name == "d0.csi.rs"));
}
