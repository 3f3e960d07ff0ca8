//! Reconstruction (the kubelet's `reconstructVolumes`): after a restart, even after SIGKILL,
//! the actual state of the world is rebuilt from disk: the `vol_data.json` files written
//! before every stage and publish, and the mount table. Nothing is mounted again: a publish
//! that is still a mount point counts as done; one that is not (the agent died in the middle)
//! is "uncertain" and repeated if the pod still wants it, or cleaned up (NodeUnpublish, which
//! is idempotent) if not. Every staged volume comes back the same way, so one that no pod
//! uses any more is unstaged.
//!
//! A rebuilt publish has no pod volume name (`outer_name` is empty: the disk only names the
//! spec). The reconciler names it once one of the pod's volumes resolves to it, and until
//! then keeps it for a running pod that has an unresolved volume
//! (`PodToMount::keeps_unresolved`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use mount_utils::findmnt::{self, MountEntry};
use volume_plugins::names::{aws_ebs_unique_volume_name, csi_unique_volume_name};

use super::cache::{ActualStateOfWorld, MountedVolume, StagedVolume, VolumeHandle};
use super::operations::vol_data::{self, VolData};
use super::paths::{AWS_EBS_POD_DIR, CSI_POD_DIR, Paths, VOL_DATA_FILE};

/// What was found, for the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub staged: usize,
    pub published: usize,
    pub uncertain: usize,
}

async fn dir_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(mut rd) = tokio::fs::read_dir(dir).await else {
        return out;
    };
    while let Ok(Some(e)) = rd.next_entry().await {
        if let Some(name) = e.file_name().to_str() {
            out.push(name.to_string());
        }
    }
    out.sort();
    out
}

fn mounted_points(table: &[MountEntry]) -> HashSet<PathBuf> {
    table.iter().map(|e| e.mount_point.clone()).collect()
}

fn csi_handle(d: &VolData, block: bool) -> VolumeHandle {
    VolumeHandle::Csi {
        driver: d.driver_name.clone(),
        handle: d.volume_handle.clone(),
        block,
        ephemeral: d.is_ephemeral(),
    }
}

/// Rebuilds the actual state from `paths`' root dir.
pub async fn reconstruct(paths: &Paths) -> (ActualStateOfWorld, Found) {
    let mut asw = ActualStateOfWorld::default();
    let mut found = Found::default();
    let table = match findmnt::read().await {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "reconstruction: cannot read the mount table; starting from an empty actual state");
            return (asw, found);
        }
    };
    let mounted = mounted_points(&table);
    let is_mounted = |p: &Path| mounted.contains(&findmnt::canonical(p));

    // CSI staging: plugins/kubernetes.io/csi/<driver>/<sha>/vol_data.json.
    let csi_dir = paths.csi_plugin_dir();
    for driver in dir_names(&csi_dir).await {
        if driver == "volumeDevices" {
            continue;
        }
        for digest in dir_names(&csi_dir.join(&driver)).await {
            let digest_dir = csi_dir.join(&driver).join(&digest);
            let Ok(d) = vol_data::read(&digest_dir.join(VOL_DATA_FILE)).await else {
                // An unstage removes vol_data.json before the dirs: killed in between, only
                // empty dirs are left. rmdir removes nothing else (a mount point is busy, a
                // dir with files is not empty).
                let _ = tokio::fs::remove_dir(digest_dir.join("globalmount")).await;
                let _ = tokio::fs::remove_dir(&digest_dir).await;
                continue;
            };
            let staging = paths.csi_staging_path(&d.driver_name, &d.volume_handle);
            let uncertain = !is_mounted(&staging);
            found.uncertain += usize::from(uncertain);
            asw.add_staged(StagedVolume {
                unique_name: csi_unique_volume_name(&d.driver_name, &d.volume_handle),
                spec_name: d.spec_vol_id.clone(),
                handle: csi_handle(&d, false),
                staging_path: Some(staging),
                reported_in_use: true,
                uncertain,
            });
            found.staged += 1;
        }
    }
    // CSI block volumes: volumeDevices/<spec>/data/vol_data.json, publish/<spec>/<uid>.
    let block_dir = csi_dir.join("volumeDevices");
    for spec in dir_names(&block_dir).await {
        if spec == "staging" || spec == "publish" {
            continue;
        }
        let Ok(d) = vol_data::read(&paths.csi_block_vol_data(&spec)).await else {
            // Killed between an unstage's removal of vol_data.json and of its dirs.
            let _ = tokio::fs::remove_dir(block_dir.join(&spec).join("data")).await;
            let _ = tokio::fs::remove_dir(block_dir.join(&spec)).await;
            continue;
        };
        let unique = csi_unique_volume_name(&d.driver_name, &d.volume_handle);
        let staging = paths.csi_block_staging_path(&spec);
        asw.add_staged(StagedVolume {
            unique_name: unique.clone(),
            spec_name: spec.clone(),
            handle: csi_handle(&d, true),
            staging_path: Some(staging),
            reported_in_use: true,
            // Nothing is mounted at a block staging path: no way to tell from here.
            uncertain: true,
        });
        found.staged += 1;
        found.uncertain += 1;
        for uid in dir_names(&block_dir.join("publish").join(&spec)).await {
            let target = paths.csi_block_publish_path(&spec, &uid);
            let uncertain = !is_mounted(&target);
            found.published += 1;
            found.uncertain += usize::from(uncertain);
            asw.add_mounted(MountedVolume {
                unique_name: unique.clone(),
                pod_uid: uid.clone(),
                outer_name: String::new(),
                spec_name: spec.clone(),
                handle: csi_handle(&d, true),
                host_path: paths.pod_block_link(&uid, &spec),
                uncertain,
                reported_in_use: true,
            });
        }
    }
    // In-tree aws-ebs staging mounts.
    let ebs_mounts = paths.aws_ebs_mounts_dir();
    let ebs_root = findmnt::canonical(&ebs_mounts);
    for e in &table {
        let Ok(rel) = e.mount_point.strip_prefix(&ebs_root) else {
            continue;
        };
        let volume_id = ebs_volume_id(rel);
        asw.add_staged(StagedVolume {
            unique_name: aws_ebs_unique_volume_name(&volume_id),
            spec_name: volume_id.clone(),
            handle: VolumeHandle::AwsEbs {
                volume_id: volume_id.clone(),
            },
            staging_path: Some(ebs_mounts.join(rel)),
            reported_in_use: true,
            // Found in the mount table: staged for sure.
            uncertain: false,
        });
        found.staged += 1;
    }
    // Pod volumes.
    for uid in dir_names(&paths.pods_dir()).await {
        let csi = paths.pod_plugin_dir(&uid, CSI_POD_DIR);
        for spec in dir_names(&csi).await {
            let Ok(d) = vol_data::read(&csi.join(&spec).join(VOL_DATA_FILE)).await else {
                continue;
            };
            let target = paths.csi_publish_path(&uid, &spec);
            let uncertain = !is_mounted(&target);
            found.published += 1;
            found.uncertain += usize::from(uncertain);
            asw.add_mounted(MountedVolume {
                unique_name: csi_unique_volume_name(&d.driver_name, &d.volume_handle),
                pod_uid: uid.clone(),
                outer_name: String::new(),
                spec_name: spec.clone(),
                handle: csi_handle(&d, false),
                host_path: target,
                uncertain,
                // Ephemeral volumes never are; the others stay reported until torn down.
                reported_in_use: !d.is_ephemeral(),
            });
        }
        let ebs = paths.pod_plugin_dir(&uid, AWS_EBS_POD_DIR);
        for spec in dir_names(&ebs).await {
            let target = ebs.join(&spec);
            let Some(entry) = findmnt::mount_at(&table, &target) else {
                // Never mounted, or the unmount finished but the dir stayed: nothing to do.
                let _ = tokio::fs::remove_dir(&target).await;
                continue;
            };
            // The staging mount of the same device names the volume.
            let staging = table
                .iter()
                .find(|s| s.dev() == entry.dev() && s.mount_point.starts_with(&ebs_root));
            let Some(staging) = staging else {
                tracing::warn!(path = %target.display(), "reconstruction: aws-ebs pod mount without its staging mount; left as it is");
                continue;
            };
            let rel = staging
                .mount_point
                .strip_prefix(&ebs_root)
                .map(Path::to_path_buf)
                .unwrap_or_default();
            let volume_id = ebs_volume_id(&rel);
            found.published += 1;
            asw.add_mounted(MountedVolume {
                unique_name: aws_ebs_unique_volume_name(&volume_id),
                pod_uid: uid.clone(),
                outer_name: String::new(),
                spec_name: spec.clone(),
                handle: VolumeHandle::AwsEbs { volume_id },
                host_path: target,
                uncertain: false,
                reported_in_use: true,
            });
        }
    }
    (asw, found)
}

/// The spec's volume ID from its staging path below `mounts/` (`aws/us-east-1a/vol-1` was
/// `aws://us-east-1a/vol-1`).
fn ebs_volume_id(rel: &Path) -> String {
    let s = rel.to_string_lossy();
    match s.strip_prefix("aws/") {
        Some(rest) => format!("aws://{rest}"),
        None => s.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ebs_volume_ids_come_back_from_staging_paths() {
        assert_eq!(
            ebs_volume_id(Path::new("aws/us-east-1a/vol-1")),
            "aws://us-east-1a/vol-1"
        );
        assert_eq!(ebs_volume_id(Path::new("vol-1")), "vol-1");
    }

    #[tokio::test]
    async fn empty_staging_dirs_without_vol_data_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let paths = Paths::new(root.path());
        let staging = paths.csi_staging_path("hostpath.csi.k8s.io", "vol-gone");
        std::fs::create_dir_all(&staging).unwrap();
        let kept = paths.csi_staging_path("hostpath.csi.k8s.io", "vol-other");
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::write(kept.join("a-file"), b"not ours to remove").unwrap();
        let (asw, found) = reconstruct(&paths).await;
        assert_eq!(found, Found::default());
        assert_eq!(asw.all_staged().count(), 0);
        assert!(
            !staging.parent().unwrap().exists(),
            "the empty digest dir is gone"
        );
        assert!(
            kept.join("a-file").exists(),
            "a dir with content is left alone"
        );
    }

    #[tokio::test]
    async fn unmounted_publish_dirs_come_back_uncertain_and_staging_dirs_staged() {
        let root = tempfile::tempdir().unwrap();
        let paths = Paths::new(root.path());
        let d = VolData {
            spec_vol_id: "pv-1".into(),
            volume_handle: "vol-1".into(),
            driver_name: "hostpath.csi.k8s.io".into(),
            node_name: "n1".into(),
            attachment_id: String::new(),
            volume_lifecycle_mode: "Persistent".into(),
        };
        vol_data::write(
            &paths.csi_staging_vol_data("hostpath.csi.k8s.io", "vol-1"),
            &d,
        )
        .await
        .unwrap();
        vol_data::write(
            &paths
                .csi_pod_volume_dir("uid-1", "pv-1")
                .join(VOL_DATA_FILE),
            &d,
        )
        .await
        .unwrap();
        let (asw, found) = reconstruct(&paths).await;
        assert_eq!(
            found,
            Found {
                staged: 1,
                published: 1,
                uncertain: 2
            }
        );
        let unique = csi_unique_volume_name("hostpath.csi.k8s.io", "vol-1");
        let m = asw.mounted(&unique, "uid-1").unwrap();
        assert!(
            m.uncertain,
            "not a mount point: the publish must be redone or undone"
        );
        assert_eq!(m.host_path, paths.csi_publish_path("uid-1", "pv-1"));
        let s = asw.staged(&unique).unwrap();
        assert!(s.uncertain, "not a mount point: NodeStage must be repeated");
        assert_eq!(
            s.staging_path.as_deref(),
            Some(
                paths
                    .csi_staging_path("hostpath.csi.k8s.io", "vol-1")
                    .as_path()
            )
        );
    }
}
