//! A non-attachable (node-local) CSI driver through the whole pod volume lifecycle, with the
//! real hostpath driver, our registrar, the attach/detach controller and the node agent over
//! apiserver-lite, real bind mounts: skip attach (the skip-attach design,
//! docs/design/skip-attach.md) in both modes, and the same driver with attachRequired true
//! (csi-attacher's trivial handler).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use test_support::objects::create_json;

use common::{DRIVER, Env, PATIENCE, is_mounted};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::ListParams;
use volume_plugins::SkipAttachMode;
use volume_plugins::names::csi_unique_volume_name;

async fn volume_attachments(env: &Env) -> usize {
    Api::<VolumeAttachment>::all(env.kube.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len()
}

/// Writes through the pod's path and reads it back from the driver's volume directory.
fn write_through(path: &Path, state_dir: &Path, handle: &str) {
    std::fs::write(path.join("hello.txt"), b"from the pod").unwrap();
    let found = walk_find(state_dir, "hello.txt");
    assert!(
        found.iter().any(|p| p.to_string_lossy().contains(handle)),
        "the file must land in volume {handle}'s directory under {}: {found:?}",
        state_dir.display()
    );
}

fn walk_find(dir: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == name) {
            out.push(p.clone());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk_find(&p, name));
        }
    }
    out
}

/// The lifecycle for one configuration; returns the VolumeAttachments seen at Ready.
async fn lifecycle(mode: SkipAttachMode, attach_required: bool) {
    let mut env = Env::new().await;
    env.create_csidriver(attach_required).await;
    let n = env.add_node("node-a").await;
    env.start_adc(mode);
    if attach_required {
        env.start_attacher().await;
    }
    let options = env.agent_options(n, mode);
    env.start_agent(n, options);
    env.wait_registered("node-a").await;

    let handle = env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    env.create_pod("pod-1", "node-a", "claim-1").await;
    let paths = env.wait_ready("pod-1").await;
    let path = Path::new(&paths["data"]).to_path_buf();
    let unique = csi_unique_volume_name(DRIVER, &handle);

    // The path is the kubelet's publish path, and a real mount.
    let root = env.nodes[n].root.clone();
    assert_eq!(
        path,
        root.join("pods")
            .join(env.pods().get("pod-1").await.unwrap().metadata.uid.unwrap())
            .join("volumes/kubernetes.io~csi/pv-1/mount")
    );
    assert!(is_mounted(&path).await, "{} is mounted", path.display());
    write_through(&path, &env.nodes[n].state_dir, &handle);

    let (in_use, attached) = env.node_volumes("node-a").await;
    let vas = volume_attachments(&env).await;
    match (mode, attach_required) {
        (SkipAttachMode::BypassAdc, false) => {
            assert_eq!(vas, 0, "no VolumeAttachment for attachRequired: false");
            assert!(!attached.contains(&unique) && !in_use.contains(&unique));
        }
        (SkipAttachMode::ThroughAdc, false) => {
            assert_eq!(vas, 0, "no VolumeAttachment in through-adc mode either");
            assert!(
                attached.contains(&unique),
                "volumesAttached lists it: {attached:?}"
            );
            assert!(
                in_use.contains(&unique),
                "volumesInUse lists it: {in_use:?}"
            );
        }
        (_, true) => {
            assert_eq!(vas, 1, "one VolumeAttachment, attached by csi-attacher");
            assert!(attached.contains(&unique) && in_use.contains(&unique));
        }
    }

    env.delete_pod_and_wait("pod-1").await;
    assert!(!is_mounted(&path).await, "unpublished");
    assert!(!path.exists(), "the publish dir is gone");
    let staging = root.join("plugins/kubernetes.io/csi").join(DRIVER);
    test_support::eventually("unstaged", PATIENCE, || async {
        (!staging_mounted(&staging).await).then_some(())
    })
    .await;
    test_support::eventually("volumesInUse cleared", PATIENCE, || async {
        let (in_use, _) = env.node_volumes("node-a").await;
        (!in_use.contains(&unique)).then_some(())
    })
    .await;
    if attach_required || mode == SkipAttachMode::ThroughAdc {
        test_support::eventually("detached", PATIENCE, || async {
            let (_, attached) = env.node_volumes("node-a").await;
            (!attached.contains(&unique)).then_some(())
        })
        .await;
    }
    test_support::eventually("no VolumeAttachment left", PATIENCE, || async {
        (volume_attachments(&env).await == 0).then_some(())
    })
    .await;
    // The file is still in the volume.
    assert!(!walk_find(&env.nodes[n].state_dir, "hello.txt").is_empty());
    env.shutdown().await;
}

async fn staging_mounted(dir: &Path) -> bool {
    let table = mount_utils::findmnt::read().await.unwrap();
    let root = mount_utils::findmnt::canonical(dir);
    table.iter().any(|e| e.mount_point.starts_with(&root))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_not_required_bypasses_the_adc_and_makes_no_volume_attachment() {
    if !common::can_mount() {
        return;
    }
    lifecycle(SkipAttachMode::BypassAdc, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_not_required_through_the_adc_is_listed_attached_without_a_volume_attachment() {
    if !common::can_mount() {
        return;
    }
    lifecycle(SkipAttachMode::ThroughAdc, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_required_goes_through_a_volume_attachment() {
    if !common::can_mount() {
        return;
    }
    lifecycle(SkipAttachMode::BypassAdc, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_driver_gets_a_failed_mount_event_that_says_so() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(false).await;
    let n = env.add_node("node-a").await;
    let handle = env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    // The driver's registration socket goes away: the agent never learns of the driver.
    env.stop_driver(n).await;
    let _ = handle;
    let options = env.agent_options(n, SkipAttachMode::BypassAdc);
    let registry = env.nodes[n].registry_dir();
    for e in std::fs::read_dir(&registry).unwrap().flatten() {
        std::fs::remove_file(e.path()).unwrap();
    }
    env.start_agent(n, options);
    env.create_pod("pod-1", "node-a", "claim-1").await;
    let message = env.event_message(Some("FailedMount"), "").await;
    assert!(
        message.contains(
            "driver name hostpath.csi.k8s.io not found in the list of registered CSI drivers"
        ),
        "{message}"
    );
    assert!(
        message.contains("\"data\""),
        "names the pod volume: {message}"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_block_and_ephemeral_inline_volumes() {
    use std::os::unix::fs::FileTypeExt;
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(false).await;
    let n = env.add_node("node-a").await;
    let options = env.agent_options(n, SkipAttachMode::BypassAdc);
    env.start_agent(n, options);
    env.wait_registered("node-a").await;

    // A raw block volume: the pod's link resolves to a block device.
    env.create_bound_claim(n, "pv-block", "claim-block", true)
        .await;
    env.create_pod("pod-block", "node-a", "claim-block").await;
    let paths = env.wait_ready("pod-block").await;
    let link = Path::new(&paths["data"]).to_path_buf();
    let uid = env
        .pods()
        .get("pod-block")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    assert_eq!(
        link,
        env.nodes[n]
            .root
            .join("pods")
            .join(&uid)
            .join("volumeDevices/kubernetes.io~csi/pv-block")
    );
    let meta = std::fs::metadata(&link).unwrap();
    assert!(
        meta.file_type().is_block_device(),
        "{link:?} is a block device"
    );

    // A CSI ephemeral inline volume: published without any PV, gone with the pod.
    create_json::<k8s_openapi::api::core::v1::Pod>(
        env.pods(),
        serde_json::json!({
            "metadata": {"name": "pod-eph"},
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "scratch", "csi": {"driver": DRIVER}}],
            },
        }),
    )
    .await;
    let paths = env.wait_ready("pod-eph").await;
    let scratch = Path::new(&paths["scratch"]).to_path_buf();
    assert!(is_mounted(&scratch).await);
    assert!(
        scratch.ends_with("volumes/kubernetes.io~csi/scratch/mount"),
        "{scratch:?}"
    );
    std::fs::write(scratch.join("tmp.txt"), b"scratch").unwrap();

    env.delete_pod_and_wait("pod-eph").await;
    assert!(!is_mounted(&scratch).await && !scratch.exists());
    env.delete_pod_and_wait("pod-block").await;
    assert!(!link.exists(), "the block link is gone");
    let root = env.nodes[n].root.clone();
    test_support::eventually("nothing mounted under the root dir", PATIENCE, || async {
        let table = mount_utils::findmnt::read().await.ok()?;
        let r = mount_utils::findmnt::canonical(&root);
        (!table.iter().any(|e| e.mount_point.starts_with(&r))).then_some(())
    })
    .await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_error_is_named_in_a_failed_mount_event() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(true).await;
    let n = env.add_node("node-a").await;
    env.start_adc(SkipAttachMode::BypassAdc);
    // No csi-attacher: the test plays one that fails.
    let options = env.agent_options(n, SkipAttachMode::BypassAdc);
    env.start_agent(n, options);
    env.wait_registered("node-a").await;
    env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    env.create_pod("pod-1", "node-a", "claim-1").await;
    let vas: Api<VolumeAttachment> = Api::all(env.kube.clone());
    let va = test_support::eventually("the VolumeAttachment", PATIENCE, || async {
        vas.list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let name = va.metadata.name.clone().unwrap();
    vas.patch_status(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&serde_json::json!({"status": {"attached": false,
            "attachError": {"message": "rpc error: code = Internal desc = the disk is on fire", "time": "2026-01-01T00:00:00Z"}}})),
    )
    .await
    .unwrap();
    let message = env
        .event_message(Some("FailedMount"), "the disk is on fire")
        .await;
    assert!(
        message.contains(&name),
        "names the VolumeAttachment: {message}"
    );
    let pod = env.pods().get("pod-1").await.unwrap();
    let ready = pod
        .status
        .and_then(|s| s.conditions)
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    assert!(!ready, "not Ready while the attach fails");
    env.shutdown().await;
}
