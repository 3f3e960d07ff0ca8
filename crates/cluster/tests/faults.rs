//! Faults: a workload of 30 pods, each with its own EBS volume and file, moving between three
//! nodes while every component of the volume path is killed in turn (the in-process SIGKILL:
//! the component's runtime dropped with every task it spawned) and started again: the EBS
//! controller during AttachVolume calls and again while ec2-sim holds the attachments in
//! `attaching`, csi-attacher during DetachVolume calls and again while the detaches are held
//! in `detaching`, the attach/detach controller (once more while detaches are held), node-1's
//! agent and then its EBS driver while pods are deleted, csi-provisioner during CreateVolume,
//! node-2's EBS driver and node-0's agent while volumes are staged; then apiserver-lite is
//! restarted from its data dir. Afterwards every pod is Ready on its new node with its file
//! intact, ec2-sim's attachment history shows no volume ever held by two instances, asked for
//! by a second one or detached under a mounted device, the VolumeAttachments, mounts, loop
//! devices and nodes' volumesAttached are exactly the volumes in use; then everything is
//! deleted and no VolumeAttachment, PV, EC2 volume, mount or loop device is left, and the
//! cluster stops cleanly. `CSI_RS_FAULTS_KEEP_LOGS=DIR` copies the component logs there at
//! the end.
//!
//! One zone, so every volume can move to every node. Pods are held to nodes with a
//! `nodeSelector` and placed by the scheduler.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cluster::{RunningCluster, UpConfig};
use faults_support::{
    DataDirGuard, Timeline, bound_volume, check_file, create_claim, create_pod, delete_pod,
    volume_attachments, volumes, wait_ready, write_file,
};
use kube::Client;

const NODES: usize = 3;
/// Pods (and claims) in all.
const PODS: usize = 30;
/// Claims created while the provisioner is killed (the rest exist from the start).
const LATE: usize = 3;
/// Pods moved to the next node during each fault.
const BATCH: usize = 15;
/// How long a killed component stays down.
const DOWN: Duration = Duration::from_secs(2);
/// How long one phase (create, one fault's moves, cleanup) may take.
const PHASE: Duration = Duration::from_secs(90);
/// The whole test (about 40 s on an idle 2-core machine).
const TOTAL: Duration = Duration::from_secs(240);

/// Where each pod is, and its volume.
#[derive(Debug, Clone)]
struct Placement {
    node: usize,
    path: PathBuf,
    /// Every node it has been on, in order.
    nodes: Vec<usize>,
}

/// What to break in one step.
#[derive(Debug, Clone)]
enum Fault {
    /// Kill a component at `When`, start it again after [`DOWN`].
    Kill(String, When),
    /// The same, while ec2-sim holds every attachment in `attaching` (or every detach in
    /// `detaching`) from the step's start until a second after the restart: the component
    /// dies while it waits for EC2, and its restarted self must find the half-done change.
    KillWhileHeld(String, When, Held),
    /// Kill the provisioner once its CreateVolume for a late claim reached ec2-sim.
    KillProvisioner,
    /// Restart apiserver-lite once the batch's first pod is recreated.
    RestartApiServer,
}

/// The moment of a kill: when the component has work under way.
#[derive(Debug, Clone, Copy)]
enum When {
    /// ec2-sim received a call of this action in this step (and, slowed by
    /// [`slow_ec2_calls`], has not answered it yet).
    Ec2Call(&'static str),
    /// ec2-sim answered a call of this action in this step: the caller waits for the state
    /// change.
    Ec2Answered(&'static str),
    /// A pod of the batch was recreated on its new node (its attach is next).
    Recreated,
    /// A pod of the batch is being deleted (its unpublish and unstage are under way).
    Deleting,
    /// On this node, a pod of the batch is not Ready while its volume is attached there: the
    /// node agent's stage or publish is under way.
    Staging(&'static str),
}

/// Which EC2 state change ec2-sim holds back during a step.
#[derive(Debug, Clone, Copy)]
enum Held {
    Attaching,
    Detaching,
}

/// How the ec2-sim slows its state-changing calls, so the kills land while calls are in
/// flight (fast timing alone finishes an attach in 30 ms).
fn slow_ec2_calls() -> ec2_sim::Faults {
    let mut faults = ec2_sim::Faults::default();
    for action in [
        "AttachVolume",
        "DetachVolume",
        "CreateVolume",
        "DeleteVolume",
    ] {
        faults.latency_ms.insert(action.to_string(), 300);
    }
    faults
}

fn node(n: usize) -> String {
    format!("node-{n}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn components_killed_in_turn_during_moving_pods_lose_nothing_and_leak_nothing() {
    if !common::can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("d");
    let guard = DataDirGuard {
        dir: data_dir.clone(),
    };
    let timeline = Arc::new(Timeline::new());
    let result = tokio::time::timeout(TOTAL, run(&data_dir, timeline.clone())).await;
    timeline.print();
    assert!(
        result.is_ok(),
        "the fault test did not end within {TOTAL:?}"
    );
    drop(guard);
}

async fn run(data_dir: &std::path::Path, timeline: Arc<Timeline>) {
    let mut config = UpConfig::new(NODES, data_dir);
    config.zones = 1;
    config.port = Some(0);
    let mut cluster = RunningCluster::start(config).await.unwrap();
    cluster.wait_ready().await.unwrap();
    cluster.ec2().set_faults(slow_ec2_calls());
    timeline.note("cluster ready (3 nodes, one zone); ec2-sim's Create/Delete/Attach/DetachVolume take 300 ms more");
    let client = cluster.client().unwrap();

    // The workload: PODS - LATE pods, pod i on node i mod 3, each writing its file.
    let deadline = Instant::now() + PHASE;
    let mut placement: BTreeMap<usize, Placement> = BTreeMap::new();
    for i in 0..PODS - LATE {
        create_claim(&client, i, deadline).await;
        create_pod(&client, i, &node(i % NODES), deadline).await;
    }
    for i in 0..PODS - LATE {
        let path = wait_ready(&client, i, &node(i % NODES), deadline).await;
        write_file(&path, i);
        placement.insert(
            i,
            Placement {
                node: i % NODES,
                path,
                nodes: vec![i % NODES],
            },
        );
    }
    timeline.note(format!("{} pods Ready, files written", PODS - LATE));

    let steps = [
        Fault::Kill(
            cluster::EBS_CONTROLLER.into(),
            When::Ec2Call("AttachVolume"),
        ),
        Fault::KillWhileHeld(
            cluster::EBS_CONTROLLER.into(),
            When::Ec2Answered("AttachVolume"),
            Held::Attaching,
        ),
        Fault::Kill(cluster::ATTACHER.into(), When::Ec2Call("DetachVolume")),
        Fault::KillWhileHeld(
            cluster::ATTACHER.into(),
            When::Ec2Answered("DetachVolume"),
            Held::Detaching,
        ),
        Fault::Kill(cluster::ADC.into(), When::Recreated),
        Fault::KillWhileHeld(
            cluster::ADC.into(),
            When::Ec2Answered("DetachVolume"),
            Held::Detaching,
        ),
        Fault::Kill(cluster::node_agent("node-1"), When::Deleting),
        Fault::Kill(cluster::ebs_node_driver("node-1"), When::Deleting),
        Fault::KillProvisioner,
        Fault::Kill(cluster::ebs_node_driver("node-2"), When::Staging("node-2")),
        Fault::Kill(cluster::node_agent("node-0"), When::Staging("node-0")),
        Fault::RestartApiServer,
    ];
    let mut cursor = 0;
    for fault in steps {
        let batch: Vec<usize> = {
            let ids: Vec<usize> = placement.keys().copied().collect();
            (0..BATCH).map(|k| ids[(cursor + k) % ids.len()]).collect()
        };
        cursor += BATCH;
        step(
            &mut cluster,
            &client,
            &fault,
            &batch,
            &mut placement,
            &timeline,
        )
        .await;
    }
    let client = cluster.client().unwrap();
    let handles = verify_settled(&cluster, &client, &placement, &timeline).await;
    clean_up(&cluster, &client, &placement, &timeline).await;
    // DescribeVolumes, as `aws ec2` would ask: every volume the pods used is gone.
    let ec2 = cluster.ec2_client().await.unwrap();
    for handle in handles.values() {
        use ebs_cloud::Cloud as _;
        match ec2.get_disk_by_id(handle).await {
            Err(e) if e.is_not_found() => {}
            other => panic!("EC2 volume {handle} after clean-up: {other:?}"),
        }
    }
    timeline.note(format!(
        "DescribeVolumes: all {} volumes the pods used are gone",
        handles.len()
    ));
    let history = cluster.ec2().attachment_history();
    assert!(
        history.double_attachments().is_empty(),
        "a volume held by two instances during clean-up: {:?}",
        history.double_attachments()
    );
    assert!(
        history.refused.is_empty(),
        "a second attachment asked for: {:?}",
        history.refused
    );
    assert!(
        history.detached_while_in_use().is_empty(),
        "a volume detached while still mounted during clean-up: {:?}",
        history.detached_while_in_use()
    );
    cluster.stop().await.unwrap();
    timeline.note("stopped cleanly: nothing left below the data dir");
}

/// One fault during one batch of moves: each pod of `batch` is deleted and created again on
/// the next node while `fault` happens; waits until all of them are Ready there with their
/// files intact.
async fn step(
    cluster: &mut RunningCluster,
    client: &Client,
    fault: &Fault,
    batch: &[usize],
    placement: &mut BTreeMap<usize, Placement>,
    timeline: &Timeline,
) {
    let started = Instant::now();
    let deadline = started + PHASE;
    if let Fault::KillWhileHeld(_, _, held) = fault {
        let mut faults = slow_ec2_calls();
        match held {
            Held::Attaching => faults.stuck_attaching_all = true,
            Held::Detaching => faults.stuck_detaching_all = true,
        }
        cluster.ec2().set_faults(faults);
    }
    let calls_before = cluster.ec2().call_counts();
    let calls_since = |action: &str| {
        let now = cluster.ec2().call_counts();
        now.get(action).copied().unwrap_or(0) - calls_before.get(action).copied().unwrap_or(0)
    };
    let recreated = Arc::new(AtomicUsize::new(0));
    // Deletes the API server has accepted: a pod being deleted is a moment that can pass
    // between two looks at the pods (unmounting 15 pods takes a fraction of a second), so
    // `When::Deleting` also counts these.
    let deletes_accepted = Arc::new(AtomicUsize::new(0));
    let mut moves = tokio::task::JoinSet::new();
    for &i in batch {
        let to = (placement[&i].node + 1) % NODES;
        let (client, recreated, accepted) =
            (client.clone(), recreated.clone(), deletes_accepted.clone());
        moves.spawn(async move {
            faults_support::ask_to_delete_pod(&client, i, deadline).await;
            accepted.fetch_add(1, Ordering::SeqCst);
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::default_namespaced(client.clone());
            faults_support::wait_gone(&pods, &faults_support::pod_name(i), deadline).await;
            create_pod(&client, i, &node(to), deadline).await;
            recreated.fetch_add(1, Ordering::SeqCst);
            (i, to, wait_ready(&client, i, &node(to), deadline).await)
        });
    }
    let late: Vec<usize> = if matches!(fault, Fault::KillProvisioner) {
        let late: Vec<usize> = (PODS - LATE..PODS).collect();
        for &i in &late {
            create_claim(client, i, deadline).await;
            create_pod(client, i, &node(i % NODES), deadline).await;
        }
        late
    } else {
        Vec::new()
    };
    timeline.note(format!(
        "moving pods {batch:?}{}",
        if late.is_empty() {
            String::new()
        } else {
            format!(", creating pods {late:?}")
        }
    ));

    let name = match fault {
        Fault::Kill(c, when) | Fault::KillWhileHeld(c, when, _) => {
            wait_until(deadline, || async {
                let f = in_flight(client, batch, &late).await;
                match when {
                    When::Ec2Call(action) | When::Ec2Answered(action) => calls_since(action) > 0,
                    When::Recreated => recreated.load(Ordering::SeqCst) > 0,
                    When::Deleting => f.deleting > 0 || deletes_accepted.load(Ordering::SeqCst) > 0,
                    When::Staging(n) => f.staging.contains_key(*n),
                }
            })
            .await;
            if let When::Ec2Answered(_) = when {
                // Longer than slow_ec2_calls' latency: the first calls were answered.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            c.clone()
        }
        Fault::KillProvisioner => {
            wait_until(deadline, || async { calls_since("CreateVolume") > 0 }).await;
            cluster::PROVISIONER.to_string()
        }
        Fault::RestartApiServer => {
            wait_until(deadline, || async { recreated.load(Ordering::SeqCst) > 0 }).await;
            "apiserver-lite".to_string()
        }
    };
    let restarted = if matches!(fault, Fault::RestartApiServer) {
        timeline.note("restarting apiserver-lite from its data dir");
        cluster.restart_api_server().await.unwrap();
        timeline.note("apiserver-lite serving again on the same port");
        Instant::now()
    } else {
        cluster.kill(&name).unwrap();
        let flight = in_flight(client, batch, &late).await;
        timeline.note(format!(
            "killed {name} ({} of {} pods recreated; {flight:?}; EC2 calls this step: {} Attach, {} Detach, {} Create)",
            recreated.load(Ordering::SeqCst),
            batch.len(),
            calls_since("AttachVolume"),
            calls_since("DetachVolume"),
            calls_since("CreateVolume"),
        ));
        assert!(
            !cluster.is_running(&name),
            "{name} still running after kill"
        );
        tokio::time::sleep(DOWN).await;
        cluster.start_component(&name).unwrap();
        timeline.note(format!("started {name} again"));
        let restarted = Instant::now();
        if let Fault::KillWhileHeld(_, _, held) = fault {
            tokio::time::sleep(Duration::from_secs(1)).await;
            cluster.ec2().set_faults(slow_ec2_calls());
            timeline.note(format!(
                "ec2-sim lets the held {held:?} state changes finish"
            ));
        }
        restarted
    };

    while let Some(done) = moves.join_next().await {
        let (i, to, path) = done.unwrap_or_else(|e| {
            std::panic::resume_unwind(e.into_panic());
        });
        check_file(&path, i).unwrap_or_else(|e| panic!("after moving pod {i}: {e}"));
        let p = placement.get_mut(&i).unwrap();
        p.node = to;
        p.path = path;
        p.nodes.push(to);
    }
    for &i in &late {
        let path = wait_ready(client, i, &node(i % NODES), deadline).await;
        write_file(&path, i);
        placement.insert(
            i,
            Placement {
                node: i % NODES,
                path,
                nodes: vec![i % NODES],
            },
        );
    }
    timeline.note(format!(
        "{name}: batch Ready on the new nodes, files intact: {:.1} s after the restart, {:.1} s for the step",
        restarted.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
}

/// What is under way for a batch.
#[derive(Debug, Default)]
#[allow(dead_code)] // `api_down` is read through Debug in the timeline.
struct Flight {
    /// Pods of the batch being deleted.
    deleting: usize,
    /// Pods of the batch bound to a node and not Ready.
    waiting: usize,
    /// VolumeAttachments not attached yet.
    attaching: usize,
    /// VolumeAttachments being deleted.
    detaching: usize,
    /// Per node: pods of the batch not Ready whose volume is attached there.
    staging: BTreeMap<String, usize>,
    api_down: bool,
}

/// What is under way now: the batch's pods not Ready yet (or being deleted), and the
/// VolumeAttachments not attached or being deleted.
async fn in_flight(client: &Client, batch: &[usize], late: &[usize]) -> Flight {
    let mut f = Flight::default();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::default_namespaced(client.clone());
    let vas: kube::Api<k8s_openapi::api::storage::v1::VolumeAttachment> =
        kube::Api::all(client.clone());
    let claims: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::default_namespaced(client.clone());
    let (Ok(pods), Ok(vas), Ok(claims)) = (
        pods.list(&Default::default()).await,
        vas.list(&Default::default()).await,
        claims.list(&Default::default()).await,
    ) else {
        f.api_down = true;
        return f;
    };
    let bound: BTreeMap<String, String> = claims
        .items
        .into_iter()
        .filter_map(|c| Some((c.metadata.name?, c.spec?.volume_name?)))
        .collect();
    let attached: BTreeSet<(String, String)> = vas
        .items
        .iter()
        .filter(|va| va.status.as_ref().is_some_and(|s| s.attached))
        .filter_map(|va| {
            Some((
                va.spec.source.persistent_volume_name.clone()?,
                va.spec.node_name.clone(),
            ))
        })
        .collect();
    let names: BTreeSet<String> = batch
        .iter()
        .chain(late)
        .map(|&i| faults_support::pod_name(i))
        .collect();
    for p in pods
        .items
        .iter()
        .filter(|p| p.metadata.name.as_ref().is_some_and(|n| names.contains(n)))
    {
        if p.metadata.deletion_timestamp.is_some() {
            f.deleting += 1;
        } else if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_deref())
            && faults_support::ready_path(p, n).is_none()
        {
            f.waiting += 1;
            let claim = p
                .metadata
                .name
                .as_deref()
                .and_then(|n| n.strip_prefix("app-"))
                .map(|i| format!("data-{i}"));
            if let Some(pv) = claim.and_then(|c| bound.get(&c))
                && attached.contains(&(pv.clone(), n.to_string()))
            {
                *f.staging.entry(n.to_string()).or_default() += 1;
            }
        }
    }
    for va in &vas.items {
        if va.metadata.deletion_timestamp.is_some() {
            f.detaching += 1;
        } else if !va.status.as_ref().is_some_and(|s| s.attached) {
            f.attaching += 1;
        }
    }
    f
}

async fn wait_until<F, Fut>(deadline: Instant, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    while !check().await {
        assert!(Instant::now() < deadline, "the fault's moment never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every pod Ready where it was moved, every file intact, no volume ever held by two
/// instances in ec2-sim's record (and the record saw every move), VolumeAttachments exactly
/// the (volume, node) pairs in use.
async fn verify_settled(
    cluster: &RunningCluster,
    client: &Client,
    placement: &BTreeMap<usize, Placement>,
    timeline: &Timeline,
) -> BTreeMap<usize, String> {
    let deadline = Instant::now() + PHASE;
    assert_eq!(placement.len(), PODS);
    let mut in_use = BTreeSet::new();
    let mut handles = BTreeMap::new();
    let pvs = volumes(client, deadline).await;
    for (&i, p) in placement {
        let path = wait_ready(client, i, &node(p.node), deadline).await;
        assert_eq!(path, p.path, "pod {i}'s volume path changed");
        check_file(&path, i).unwrap_or_else(|e| panic!("pod {i}: {e}"));
        let pv = bound_volume(client, i, deadline).await;
        let handle = pvs
            .iter()
            .find(|v| v.metadata.name.as_deref() == Some(pv.as_str()))
            .and_then(|v| v.spec.as_ref()?.csi.as_ref())
            .map(|c| c.volume_handle.clone())
            .unwrap_or_else(|| panic!("PV {pv} of pod {i} is not a CSI volume"));
        in_use.insert((pv, node(p.node)));
        handles.insert(i, handle);
    }
    let attachments: BTreeSet<(String, String)> = volume_attachments(client, deadline)
        .await
        .into_iter()
        .map(|va| {
            assert_eq!(va.status.as_ref().map(|s| s.attached), Some(true), "{va:?}");
            (
                va.spec.source.persistent_volume_name.clone().unwrap(),
                va.spec.node_name.clone(),
            )
        })
        .collect();
    assert_eq!(
        attachments, in_use,
        "VolumeAttachments differ from the volumes in use"
    );

    let history = cluster.ec2().attachment_history();
    assert_eq!(history.dropped, 0);
    let doubles = history.double_attachments();
    assert!(
        doubles.is_empty(),
        "volumes held by two instances at once: {doubles:?}"
    );
    assert!(
        history.refused.is_empty(),
        "second attachments asked for while another instance held the volume: {:?}",
        history.refused
    );
    let unsafe_detaches = history.detached_while_in_use();
    assert!(
        unsafe_detaches.is_empty(),
        "volumes detached while still mounted: {unsafe_detaches:?}"
    );
    // The record is not empty by accident: it saw each volume on every node it was used on.
    let instance = |n: usize| cluster.instance_id(&node(n)).unwrap().to_string();
    for (&i, p) in placement {
        let seen: BTreeSet<String> = history
            .of_volume(&handles[&i])
            .map(|e| e.instance_id.clone())
            .collect();
        let used: BTreeSet<String> = p.nodes.iter().map(|&n| instance(n)).collect();
        assert_eq!(
            seen, used,
            "pod {i}'s volume {} on nodes {:?}",
            handles[&i], p.nodes
        );
    }
    // Nothing left behind on the nodes the pods moved away from: one staging and one publish
    // mount per volume, one loop device per attached volume, and each node's
    // volumesAttached (the attach/detach controller's view) exactly its volumes.
    let mounts = common::mounts_below(cluster.data_dir());
    assert_eq!(mounts.len(), 2 * PODS, "mounts: {mounts:#?}");
    for (&i, p) in placement {
        assert!(
            mounts.iter().any(|m| std::path::Path::new(m) == p.path),
            "pod {i}'s volume not mounted at {}: {mounts:#?}",
            p.path.display()
        );
    }
    let loops = common::loop_devices_below(cluster.data_dir());
    assert_eq!(loops.len(), PODS, "loop devices: {loops:#?}");
    let wanted: BTreeSet<(String, String)> = placement
        .iter()
        .map(|(i, p)| (node(p.node), handles[i].clone()))
        .collect();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let mut reported = BTreeSet::new();
    for _ in 0..100 {
        reported = nodes
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|n| {
                let name = n.metadata.name.clone().unwrap_or_default();
                n.status
                    .and_then(|s| s.volumes_attached)
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |a| {
                        let handle = a.name.rsplit('^').next().unwrap_or_default().to_string();
                        (name.clone(), handle)
                    })
            })
            .collect();
        if reported == wanted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(reported, wanted, "the nodes' status.volumesAttached");
    let moves: usize = placement.values().map(|p| p.nodes.len() - 1).sum();
    timeline.note(format!(
        "settled: {PODS} pods Ready, files intact, {} VolumeAttachments = volumes in use, {} attachment changes in ec2-sim's record, {moves} moves, no volume ever on two instances, asked for by a second one or detached while mounted",
        attachments.len(),
        history.events.len()
    ));
    handles
}

/// Deletes every pod and claim; waits until no VolumeAttachment, PV, EC2 volume, mount or
/// loop device is left.
async fn clean_up(
    cluster: &RunningCluster,
    client: &Client,
    placement: &BTreeMap<usize, Placement>,
    timeline: &Timeline,
) {
    let deadline = Instant::now() + PHASE;
    let mut deletes = tokio::task::JoinSet::new();
    for &i in placement.keys() {
        let client = client.clone();
        deletes.spawn(async move { delete_pod(&client, i, deadline).await });
    }
    while let Some(r) = deletes.join_next().await {
        r.unwrap();
    }
    let claims: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::default_namespaced(client.clone());
    for &i in placement.keys() {
        let name = faults_support::claim_name(i);
        faults_support::retry(&format!("deleting claim {name}"), deadline, || async {
            match claims.delete(&name, &Default::default()).await {
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                other => other.map(|_| ()),
            }
        })
        .await;
    }
    timeline.note("pods and claims deleted");
    loop {
        let vas = volume_attachments(client, deadline).await.len();
        let pvs = volumes(client, deadline).await.len();
        let state: serde_json::Value = serde_json::from_slice(
            &std::fs::read(cluster.data_dir().join("ec2/state.json")).unwrap(),
        )
        .unwrap();
        let ec2 = state["volumes"].as_object().map_or(0, |v| v.len());
        let mounts = common::mounts_below(cluster.data_dir()).len();
        let loops = common::loop_devices_below(cluster.data_dir()).len();
        if vas + pvs + ec2 + mounts + loops == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left after deleting everything: {vas} VolumeAttachments, {pvs} PVs, {ec2} EC2 volumes, mounts {:?}, loop devices {:?}",
            common::mounts_below(cluster.data_dir()),
            common::loop_devices_below(cluster.data_dir())
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    timeline.note("no VolumeAttachment, PV, EC2 volume, mount or loop device left");
}
