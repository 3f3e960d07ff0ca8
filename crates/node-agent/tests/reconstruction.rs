//! The agent killed with SIGKILL in the middle of mounting and in the middle of tearing down
//! 20 pods (the real binary, the real hostpath driver staying up, as a kubelet restart leaves
//! its drivers): after each restart the agent rebuilds its actual state from the mount table
//! and `vol_data.json`: every volume ends up published exactly once and staged exactly once,
//! and after the teardown nothing is left mounted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Stdio;

use common::{DRIVER, Env, PATIENCE};
use kube::api::ListParams;
use tokio::process::{Child, Command};

const PODS: usize = 20;

fn spawn_agent(env: &Env, node: usize) -> Child {
    let n = &env.nodes[node];
    Command::new(env!("CARGO_BIN_EXE_csi-node-agent"))
        .args([
            "--node-name",
            &n.name,
            "--kubeconfig",
            &env.kubeconfig_file().display().to_string(),
            "--root-dir",
            &n.root.display().to_string(),
            "--kube-api-qps=-1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start csi-node-agent")
}

async fn kill(mut child: Child) {
    child.start_kill().expect("SIGKILL");
    let _ = child.wait().await;
}

async fn ready_count(env: &Env) -> usize {
    let pods = env.pods().list(&ListParams::default()).await.unwrap();
    pods.items
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count()
}

/// Mount points below `dir` and how often each is mounted.
async fn mounts_below(dir: &Path) -> Vec<(std::path::PathBuf, usize)> {
    let table = mount_utils::findmnt::read().await.unwrap();
    let root = mount_utils::findmnt::canonical(dir);
    let mut points: Vec<std::path::PathBuf> = table
        .iter()
        .map(|e| e.mount_point.clone())
        .filter(|p| p.starts_with(&root))
        .collect();
    points.sort();
    let mut out: Vec<(std::path::PathBuf, usize)> = Vec::new();
    for p in points {
        match out.last_mut() {
            Some((last, n)) if *last == p => *n += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_mount_and_mid_teardown_leaks_nothing_and_stages_once() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(false).await;
    let n = env.add_node("node-a").await;
    for i in 0..PODS {
        env.create_bound_claim(n, &format!("pv-{i}"), &format!("claim-{i}"), false)
            .await;
    }
    let root = env.nodes[n].root.clone();

    // Mid-mount: killed as soon as the first pods are Ready.
    let agent = spawn_agent(&env, n);
    for i in 0..PODS {
        env.create_pod(&format!("pod-{i}"), "node-a", &format!("claim-{i}"))
            .await;
    }
    test_support::eventually("the first pods Ready", PATIENCE, || async {
        (ready_count(&env).await >= 1).then_some(())
    })
    .await;
    kill(agent).await;
    let at_kill = ready_count(&env).await;
    eprintln!("at the first kill {at_kill} of {PODS} pods were Ready");

    let agent = spawn_agent(&env, n);
    test_support::eventually("all pods Ready after the restart", PATIENCE, || async {
        (ready_count(&env).await == PODS).then_some(())
    })
    .await;
    let mounts = mounts_below(&root).await;
    let doubled: Vec<_> = mounts.iter().filter(|(_, c)| *c > 1).collect();
    assert!(doubled.is_empty(), "mounted twice: {doubled:?}");
    let published = mounts.iter().filter(|(p, _)| p.ends_with("mount")).count();
    let staged = mounts
        .iter()
        .filter(|(p, _)| p.ends_with("globalmount"))
        .count();
    assert_eq!(
        (published, staged),
        (PODS, PODS),
        "one publish and one stage per volume ({at_kill} pods were Ready at the kill): {mounts:?}"
    );

    // Mid-teardown: all pods deleted, killed once some are gone.
    for i in 0..PODS {
        env.pods()
            .delete(&format!("pod-{i}"), &Default::default())
            .await
            .unwrap();
    }
    test_support::eventually("the first pods gone", PATIENCE, || async {
        let left = env
            .pods()
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        (left < PODS).then_some(())
    })
    .await;
    kill(agent).await;
    let left = env
        .pods()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    eprintln!("at the second kill {left} of {PODS} pods were left");
    let agent = spawn_agent(&env, n);
    test_support::eventually("all pods gone after the restart", PATIENCE, || async {
        let left = env
            .pods()
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        (left == 0).then_some(())
    })
    .await;
    test_support::eventually("nothing left mounted", PATIENCE, || async {
        mounts_below(&root).await.is_empty().then_some(())
    })
    .await;
    // The pod and staging dirs are gone too (a pod dir whose last teardown finished just
    // before the kill goes with the agent's periodic orphan sweep, every 5 s).
    let left = || {
        let mut files = Vec::new();
        for dir in [
            root.join("pods"),
            root.join("plugins/kubernetes.io/csi").join(DRIVER),
        ] {
            walk(&dir, &mut files);
        }
        files
    };
    let deadline = std::time::Instant::now() + PATIENCE;
    while !left().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "pod and staging dirs still there after {PATIENCE:?}: {:?}",
            left()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    kill(agent).await;
    env.shutdown().await;
}

/// Every file and directory below `dir` (not `dir` itself).
fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        out.push(e.path());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&e.path(), out);
        }
    }
}
