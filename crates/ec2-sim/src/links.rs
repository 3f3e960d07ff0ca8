//! The device links of attached volumes: which ones the cloud state asks for under each
//! [`DeviceLayout`], and making, removing and sweeping them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::Error;
use crate::config::DeviceLayout;
use crate::model::{AttachState, Cloud};

/// The Nitro-style by-id name: `nvme-Amazon_Elastic_Block_Store_vol0123...` (no dash).
pub(crate) fn by_id_name(volume_id: &str) -> String {
    format!(
        "nvme-Amazon_Elastic_Block_Store_{}",
        volume_id.replace('-', "")
    )
}

/// Volume ID → the links its loop device should have, for every volume that needs a device
/// (an attachment in `attached`, or `detaching` after having been attached). Each visible
/// attachment gets its device name and the volume's by-id link in its instance's links dir,
/// so a Multi-Attach volume has them in every instance's dir with `PerInstance`.
pub(crate) fn wanted(
    cloud: &Cloud,
    device_dir: &Path,
    layout: DeviceLayout,
) -> BTreeMap<String, BTreeSet<PathBuf>> {
    let mut want = BTreeMap::new();
    for v in cloud.volumes.values() {
        let mut links = BTreeSet::new();
        for a in &v.attachments {
            let visible = match a.state {
                AttachState::Attached => true,
                AttachState::Detaching => !a.never_attached,
                AttachState::Attaching => false,
            };
            if visible {
                let dir = layout.links_dir(device_dir, &a.instance_id);
                links.insert(dir.join(a.device.trim_start_matches("/dev/")));
                links.insert(dir.join("disk/by-id").join(by_id_name(&v.id)));
            }
        }
        if !links.is_empty() {
            want.insert(v.id.clone(), links);
        }
    }
    want
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Points `link` at `target`, creating its directory (an instance's `disk/by-id`) if needed.
pub(crate) fn replace_link(link: &Path, target: &Path) -> Result<(), Error> {
    if fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    if let Some(parent) = link.parent() {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let _ = fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).map_err(io_err(link))
}

/// Removes `link` if it still points at `target`. One that points elsewhere was taken over by
/// another volume's device (the same name reused in the same pass) and stays.
pub(crate) fn remove_link_to(link: &Path, target: &Path) {
    match fs::read_link(link) {
        Ok(t) if t == target => {}
        Ok(t) => {
            tracing::debug!(link = %link.display(), now = %t.display(), "device link taken over; left alone");
            return;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        // Not a symlink, or unreadable: let remove_file report it.
        Err(_) => {}
    }
    if let Err(e) = fs::remove_file(link) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(link = %link.display(), error = %e, "cannot remove device symlink");
        }
    }
}

/// With `PerInstance`, removes the links in the instance dirs (`DEVDIR/i-*/` and their
/// `disk/by-id/`) that point into `/dev` and are not in `keep`: links left by a process killed
/// while a detach was finishing, which would otherwise point at a freed (or reused) loop device.
/// Anything that is not such a symlink is left alone. Returns the links removed.
pub(crate) fn sweep_stale(device_dir: &Path, keep: &BTreeSet<&Path>) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = fs::read_dir(device_dir) else {
        return removed;
    };
    for entry in entries.flatten() {
        let is_instance = entry.file_name().to_string_lossy().starts_with("i-")
            && entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_instance {
            continue;
        }
        let dir = entry.path();
        for d in [dir.clone(), dir.join("disk/by-id")] {
            let Ok(links) = fs::read_dir(&d) else {
                continue;
            };
            for link in links.flatten().map(|l| l.path()) {
                let ours = fs::read_link(&link).is_ok_and(|t| t.starts_with("/dev/"));
                if ours && !keep.contains(link.as_path()) {
                    match fs::remove_file(&link) {
                        Ok(()) => {
                            tracing::info!(link = %link.display(), "removed stale device link");
                            removed.push(link);
                        }
                        Err(e) => {
                            tracing::warn!(link = %link.display(), error = %e, "cannot remove stale device link")
                        }
                    }
                }
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Attachment, Volume};

    fn attachment(instance: &str, device: &str, state: AttachState) -> Attachment {
        Attachment {
            instance_id: instance.into(),
            device: device.into(),
            state,
            attach_ms: 0,
            done_ms: 0,
            force: false,
            delete_on_termination: false,
            never_attached: false,
        }
    }

    fn volume(id: &str, attachments: Vec<Attachment>) -> Volume {
        Volume {
            id: id.into(),
            size_gib: 4,
            snapshot_id: None,
            zone: "us-east-1a".into(),
            volume_type: "io2".into(),
            iops: Some(100),
            throughput: None,
            encrypted: false,
            kms_key_id: None,
            multi_attach: true,
            tags: vec![],
            create_ms: 0,
            available_ms: 0,
            vanishes: false,
            deleted_ms: None,
            delete_when_detached: None,
            attachments,
        }
    }

    fn cloud() -> Cloud {
        let mut c = Cloud::default();
        for v in [
            volume(
                "vol-1",
                vec![attachment("i-a", "/dev/xvdba", AttachState::Attached)],
            ),
            volume(
                "vol-2",
                vec![
                    attachment("i-b", "/dev/xvdba", AttachState::Attached),
                    attachment("i-a", "/dev/xvdbb", AttachState::Detaching),
                    attachment("i-c", "/dev/xvdbc", AttachState::Attaching),
                ],
            ),
            volume(
                "vol-3",
                vec![attachment("i-c", "/dev/xvdbd", AttachState::Attaching)],
            ),
        ] {
            c.volumes.insert(v.id.clone(), v);
        }
        c
    }

    fn set(paths: &[&str]) -> BTreeSet<PathBuf> {
        paths.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn per_instance_links_go_to_each_instance_dir() {
        let want = wanted(&cloud(), Path::new("/d"), DeviceLayout::PerInstance);
        assert_eq!(want.len(), 2, "vol-3 is only attaching: {want:?}");
        assert_eq!(
            want["vol-1"],
            set(&[
                "/d/i-a/xvdba",
                "/d/i-a/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol1"
            ])
        );
        assert_eq!(
            want["vol-2"],
            set(&[
                "/d/i-a/xvdbb",
                "/d/i-a/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol2",
                "/d/i-b/xvdba",
                "/d/i-b/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol2",
            ])
        );
    }

    #[test]
    fn shared_links_are_the_old_layout() {
        let want = wanted(&cloud(), Path::new("/d"), DeviceLayout::Shared);
        assert_eq!(
            want["vol-1"],
            set(&[
                "/d/xvdba",
                "/d/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol1"
            ])
        );
        assert_eq!(
            want["vol-2"],
            set(&[
                "/d/xvdba",
                "/d/xvdbb",
                "/d/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol2"
            ])
        );
    }

    #[test]
    fn links_are_removed_only_while_they_point_at_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("i-a/disk/by-id/x");
        replace_link(&link, Path::new("/dev/loop7")).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("/dev/loop7"));
        remove_link_to(&link, Path::new("/dev/loop8"));
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("/dev/loop7"));
        remove_link_to(&link, Path::new("/dev/loop7"));
        assert!(fs::symlink_metadata(&link).is_err());
        remove_link_to(&link, Path::new("/dev/loop7")); // already gone: no panic, no error
    }

    #[test]
    fn sweep_removes_only_unwanted_device_links_in_instance_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let keep_link = d.join("i-a/xvdba");
        let stale_name = d.join("i-a/xvdbb");
        let stale_by_id = d.join("i-b/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol9");
        let elsewhere = d.join("i-b/other");
        let not_instance = d.join("xvdba");
        for l in [&keep_link, &stale_name, &stale_by_id, &not_instance] {
            replace_link(l, Path::new("/dev/loop3")).unwrap();
        }
        replace_link(&elsewhere, Path::new("/tmp/not-a-device")).unwrap();
        fs::write(d.join("i-a/plain-file"), b"x").unwrap();
        let keep: BTreeSet<&Path> = [keep_link.as_path()].into_iter().collect();
        let mut removed = sweep_stale(d, &keep);
        removed.sort();
        assert_eq!(removed, vec![stale_name.clone(), stale_by_id.clone()]);
        assert!(fs::symlink_metadata(&keep_link).is_ok());
        assert!(fs::symlink_metadata(&elsewhere).is_ok());
        assert!(fs::symlink_metadata(&not_instance).is_ok());
        assert!(d.join("i-a/plain-file").exists());
        assert!(sweep_stale(&d.join("missing"), &keep).is_empty());
    }
}
