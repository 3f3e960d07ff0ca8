//! Volume images (sparse files), snapshot copies, and loop devices with the symlinks the
//! node side looks for.
//!
//! Loop devices are reconciled against the cloud state rather than driven by events: the set
//! of volumes that should have a device (an attachment in `attached` or `detaching`) is
//! compared with what exists, so a restart (even after SIGKILL) re-adopts or re-creates them
//! and nothing leaks for good.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;
use crate::config::{Backing, DeviceLayout};
use crate::links::{self, remove_link_to, replace_link};
use crate::model::{AttachState, Cloud};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// `EFBIG` and `EINVAL`: what `ftruncate` answers for a length past the filesystem's maximum
/// file size (ext4 with 4 KiB blocks stops just short of 16 TiB).
const EFBIG: i32 = 27;
const EINVAL: i32 = 22;

/// What the simulator made for one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Device {
    loop_dev: String,
    links: BTreeSet<PathBuf>,
}

pub(crate) struct Disks {
    state_dir: PathBuf,
    device_dir: PathBuf,
    backing: Backing,
    layout: DeviceLayout,
    devices: BTreeMap<String, Device>,
    /// The largest image length the state dir's filesystem accepts, once a volume needed
    /// more (0: not needed yet). Images of bigger volumes are capped to it.
    max_image_len: AtomicU64,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) use crate::links::by_id_name;

impl Disks {
    pub(crate) fn new(
        state_dir: &Path,
        device_dir: &Path,
        backing: Backing,
        layout: DeviceLayout,
    ) -> Result<Disks, Error> {
        for d in [state_dir.join("volumes"), state_dir.join("snapshots")] {
            fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        if backing == Backing::Loop {
            // Fail at start rather than at the first attach.
            if !Path::new("/dev/loop-control").exists() {
                return Err(Error::Loop(
                    "backing 'loop' needs /dev/loop-control (root with loop support); use backing 'file' otherwise".into(),
                ));
            }
            // Instance dirs (and their disk/by-id) are made with their first link.
            let dir = match layout {
                DeviceLayout::Shared => device_dir.join("disk/by-id"),
                DeviceLayout::PerInstance => device_dir.to_path_buf(),
            };
            fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        Ok(Disks {
            state_dir: state_dir.to_path_buf(),
            device_dir: device_dir.to_path_buf(),
            backing,
            layout,
            devices: BTreeMap::new(),
            max_image_len: AtomicU64::new(0),
        })
    }

    pub(crate) fn volume_path(&self, id: &str) -> PathBuf {
        self.state_dir.join("volumes").join(format!("{id}.img"))
    }

    pub(crate) fn snapshot_path(&self, id: &str) -> PathBuf {
        self.state_dir.join("snapshots").join(format!("{id}.img"))
    }

    /// A new sparse image, or a sparse copy of a snapshot grown to the volume size. The image
    /// is shorter than the volume when the filesystem cannot hold a file that large (see
    /// [`Disks::set_image_len`]).
    pub(crate) fn create_volume(
        &self,
        id: &str,
        size_gib: u64,
        snapshot: Option<&str>,
    ) -> Result<(), Error> {
        let path = self.volume_path(id);
        if let Some(snap) = snapshot {
            sparse_copy(&self.snapshot_path(snap), &path)?;
        }
        let f = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path))?;
        let result = self.set_image_len(&f, &path, size_gib * GIB);
        if result.is_err() {
            drop(f);
            self.remove_volume(id);
        }
        result.map(|_| ())
    }

    /// Sets an image's length to `want` bytes, or, when the filesystem refuses a file that
    /// large, to the largest length it accepts (found once by probing, then remembered). The
    /// volume keeps its nominal size in the state; only the device is smaller. Returns the
    /// length set.
    fn set_image_len(&self, f: &fs::File, path: &Path, want: u64) -> Result<u64, Error> {
        let cap = self.max_image_len.load(Ordering::Relaxed);
        let target = if cap == 0 { want } else { want.min(cap) };
        match f.set_len(target) {
            Ok(()) => Ok(target),
            Err(e) if too_large(&e) => {
                let cap = self.probe_max_len(want)?;
                self.max_image_len.store(cap, Ordering::Relaxed);
                tracing::info!(
                    path = %path.display(),
                    wanted = want,
                    length = cap,
                    "the state dir's filesystem cannot hold the full image; capped"
                );
                f.set_len(cap).map_err(io_err(path))?;
                Ok(cap)
            }
            Err(e) => Err(io_err(path)(e)),
        }
    }

    /// The largest whole-MiB length below `refused` that a scratch file in the volumes dir
    /// may have: a binary search with `ftruncate`, which costs no space on a sparse file.
    fn probe_max_len(&self, refused: u64) -> Result<u64, Error> {
        let path = self.state_dir.join("volumes").join(".max-len-probe");
        let f = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let (mut lo, mut hi) = (0u64, refused);
        let result = loop {
            let mid = (lo + (hi - lo) / 2) / MIB * MIB;
            if mid <= lo {
                break Ok(lo);
            }
            match f.set_len(mid) {
                Ok(()) => lo = mid,
                Err(e) if too_large(&e) => hi = mid,
                Err(e) => break Err(io_err(&path)(e)),
            }
        };
        drop(f);
        let _ = fs::remove_file(&path);
        match result {
            Ok(0) => Err(Error::Io {
                path,
                source: std::io::Error::other("the filesystem accepts no image length at all"),
            }),
            other => other,
        }
    }

    pub(crate) fn remove_volume(&self, id: &str) {
        let path = self.volume_path(id);
        if let Err(e) = fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(volume_id = id, path = %path.display(), error = %e, "cannot remove volume image");
            }
        }
    }

    /// Grows the image and tells an attached loop device about the new capacity.
    pub(crate) fn grow_volume(&self, id: &str, size_gib: u64) -> Result<(), Error> {
        let path = self.volume_path(id);
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let len = f.metadata().map_err(io_err(&path))?.len();
        if len < size_gib * GIB {
            self.set_image_len(&f, &path, size_gib * GIB)?;
        }
        if let Some(dev) = self.devices.get(id) {
            losetup(&["-c", &dev.loop_dev])?;
        }
        Ok(())
    }

    pub(crate) fn snapshot_volume(&self, volume_id: &str, snapshot_id: &str) -> Result<(), Error> {
        sparse_copy(
            &self.volume_path(volume_id),
            &self.snapshot_path(snapshot_id),
        )
    }

    pub(crate) fn remove_snapshot(&self, id: &str) {
        let path = self.snapshot_path(id);
        if let Err(e) = fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(snapshot_id = id, error = %e, "cannot remove snapshot image");
            }
        }
    }

    /// The loop device currently backing a volume, if any.
    pub(crate) fn loop_device(&self, volume_id: &str) -> Option<&str> {
        self.devices.get(volume_id).map(|d| d.loop_dev.as_str())
    }

    /// Makes the loop devices and symlinks match the attachments in `cloud`. Errors are
    /// logged and retried on the next call; the first one is returned.
    pub(crate) fn reconcile(&mut self, cloud: &Cloud) -> Result<(), Error> {
        if self.backing != Backing::Loop {
            return Ok(());
        }
        let want = links::wanted(cloud, &self.device_dir, self.layout);
        let mut first_err = None;
        let stale: Vec<String> = self
            .devices
            .keys()
            .filter(|k| !want.contains_key(*k))
            .cloned()
            .collect();
        for id in stale {
            if let Err(e) = self.release(&id) {
                tracing::error!(volume_id = %id, error = %e, "cannot release loop device");
                first_err.get_or_insert(e);
            }
        }
        for (id, links) in want {
            if self.devices.get(&id).is_some_and(|d| d.links == links) {
                continue;
            }
            if let Err(e) = self.ensure(&id, links) {
                tracing::error!(volume_id = %id, error = %e, "cannot set up loop device");
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn ensure(&mut self, id: &str, links: BTreeSet<PathBuf>) -> Result<(), Error> {
        let loop_dev = match self.devices.get(id) {
            Some(d) => d.loop_dev.clone(),
            None => {
                let image = self.volume_path(id);
                let image_str = image.to_string_lossy().to_string();
                match attached_loops(&image)?
                    .into_iter()
                    .find(|dev| !detach_pending(dev))
                {
                    Some(dev) => {
                        tracing::info!(volume_id = id, device = %dev, "re-adopted loop device");
                        dev
                    }
                    None => {
                        let dev = losetup(&["--find", "--show", &image_str])?;
                        tracing::info!(volume_id = id, device = %dev, "attached loop device");
                        dev
                    }
                }
            }
        };
        let old = self
            .devices
            .insert(
                id.to_string(),
                Device {
                    loop_dev: loop_dev.clone(),
                    links: BTreeSet::new(),
                },
            )
            .map(|d| d.links)
            .unwrap_or_default();
        for gone in old.difference(&links) {
            remove_link_to(gone, Path::new(&loop_dev));
        }
        for link in &links {
            replace_link(link, Path::new(&loop_dev))?;
            if let Some(d) = self.devices.get_mut(id) {
                d.links.insert(link.clone());
            }
        }
        Ok(())
    }

    fn release(&mut self, id: &str) -> Result<(), Error> {
        if let Some(dev) = self.devices.remove(id) {
            for link in &dev.links {
                remove_link_to(link, Path::new(&dev.loop_dev));
            }
            // Only if the device still serves this volume's image: were it freed behind our back
            // (an autoclear detach) and taken for another image, `-d` would cut off that one.
            let image = self.volume_path(id);
            if attached_loops(&image)?.contains(&dev.loop_dev) {
                losetup(&["-d", &dev.loop_dev])?;
                tracing::info!(volume_id = id, device = %dev.loop_dev, "released loop device");
            } else {
                tracing::warn!(volume_id = id, device = %dev.loop_dev, "loop device no longer serves this volume; left alone");
            }
        }
        Ok(())
    }

    /// Which of these volumes' loop devices are mounted (their `major:minor` appears in
    /// `/proc/self/mountinfo`) or held by another block device (`/sys/block/loopN/holders`).
    pub(crate) fn in_use(&self, volume_ids: &[&str]) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mounted: BTreeSet<&str> = mountinfo
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .collect();
        for id in volume_ids {
            let Some(dev) = self.devices.get(*id) else {
                continue;
            };
            let name = dev.loop_dev.trim_start_matches("/dev/");
            let sys = Path::new("/sys/block").join(name);
            let majmin = fs::read_to_string(sys.join("dev")).unwrap_or_default();
            let held = fs::read_dir(sys.join("holders"))
                .map(|mut d| d.next().is_some())
                .unwrap_or(false);
            if held || mounted.contains(majmin.trim()) {
                out.insert((*id).to_string());
            }
        }
        out
    }

    /// Releases loop devices of images that no attachment needs (left over by a process
    /// killed between finishing a detach and releasing its device).
    pub(crate) fn release_orphans(&self, cloud: &Cloud) {
        if self.backing != Backing::Loop {
            return;
        }
        for v in cloud.volumes.values() {
            let needed = v.attachments.iter().any(|a| {
                a.state == AttachState::Attached
                    || (a.state == AttachState::Detaching && !a.never_attached)
            });
            if needed || self.devices.contains_key(&v.id) {
                continue;
            }
            let Ok(devs) = attached_loops(&self.volume_path(&v.id)) else {
                continue;
            };
            for dev in devs {
                match losetup(&["-d", &dev]) {
                    Ok(_) => {
                        tracing::info!(volume_id = %v.id, device = %dev, "released orphaned loop device")
                    }
                    Err(e) => {
                        tracing::warn!(volume_id = %v.id, error = %e, "cannot release orphaned loop device")
                    }
                }
            }
        }
    }

    /// With `PerInstance`, removes device links in instance dirs that no device of this
    /// process has (left by a process killed while a detach finished). Called at start, after
    /// the first reconcile, when every wanted link is known.
    pub(crate) fn sweep_stale_links(&self) {
        if self.backing != Backing::Loop || self.layout != DeviceLayout::PerInstance {
            return;
        }
        let keep: BTreeSet<&Path> = self
            .devices
            .values()
            .flat_map(|d| d.links.iter().map(PathBuf::as_path))
            .collect();
        links::sweep_stale(&self.device_dir, &keep);
    }

    /// Releases every loop device this process holds (shutdown); the state still says
    /// attached, and the next start brings them back.
    pub(crate) fn release_all(&mut self) -> Result<(), Error> {
        let ids: Vec<String> = self.devices.keys().cloned().collect();
        let mut first_err = None;
        for id in ids {
            if let Err(e) = self.release(&id) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn too_large(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(EFBIG | EINVAL))
}

/// Runs losetup and returns its trimmed stdout.
fn losetup(args: &[&str]) -> Result<String, Error> {
    let out = Command::new("losetup")
        .args(args)
        .output()
        .map_err(|e| Error::Loop(format!("cannot run losetup {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(Error::Loop(format!(
            "losetup {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Loop devices whose backing file is `image` (`losetup -j`).
fn attached_loops(image: &Path) -> Result<Vec<String>, Error> {
    let out = losetup(&["-j", &image.to_string_lossy()])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(':').map(|(dev, _)| dev.trim().to_string()))
        .filter(|d| d.starts_with("/dev/loop"))
        .collect())
}

/// Whether `losetup -d` was already asked of loop device `dev` while something still held it
/// open: the kernel then only sets autoclear and frees the device at the last close, after
/// which another process's `losetup --find` may take it for a different image. Re-adopting
/// such a device would leave our device links pointing at whatever gets it next (seen with two
/// test runs at once: the driver's identity check refused a link that resolved to another
/// run's volume), so attach a fresh one instead.
fn detach_pending(dev: &str) -> bool {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/autoclear"))
        .map(|v| v.trim() == "1")
        .unwrap_or(false)
}

/// Copies a file keeping holes (`cp --sparse=always`), so a 1 TiB empty volume stays empty.
fn sparse_copy(from: &Path, to: &Path) -> Result<(), Error> {
    let out = Command::new("cp")
        .arg("--sparse=always")
        .arg(from)
        .arg(to)
        .output()
        .map_err(io_err(to))?;
    if !out.status.success() {
        return Err(Error::Io {
            path: to.to_path_buf(),
            source: std::io::Error::other(format!(
                "cp {} failed: {}",
                from.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn images_are_sparse_and_snapshots_copy_content() {
        let dir = tempfile::tempdir().unwrap();
        let disks = Disks::new(
            dir.path(),
            &dir.path().join("dev"),
            Backing::File,
            DeviceLayout::Shared,
        )
        .unwrap();
        disks.create_volume("vol-1", 2, None).unwrap();
        let meta = fs::metadata(disks.volume_path("vol-1")).unwrap();
        assert_eq!(meta.len(), 2 * GIB);
        assert!(meta.blocks() * 512 < 1 << 20, "image is sparse");

        use std::io::{Read as _, Write as _};
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(disks.volume_path("vol-1"))
            .unwrap();
        f.write_all(b"hello").unwrap();
        drop(f);
        disks.grow_volume("vol-1", 3).unwrap();
        assert_eq!(
            fs::metadata(disks.volume_path("vol-1")).unwrap().len(),
            3 * GIB
        );
        disks.snapshot_volume("vol-1", "snap-1").unwrap();
        disks.create_volume("vol-2", 4, Some("snap-1")).unwrap();
        let mut head = [0u8; 5];
        fs::File::open(disks.volume_path("vol-2"))
            .unwrap()
            .read_exact(&mut head)
            .unwrap();
        assert_eq!(&head, b"hello");
        let meta = fs::metadata(disks.volume_path("vol-2")).unwrap();
        assert_eq!(meta.len(), 4 * GIB);
        assert!(meta.blocks() * 512 < 1 << 20, "copy stays sparse");
        disks.remove_volume("vol-2");
        assert!(!disks.volume_path("vol-2").exists());
    }

    #[test]
    fn images_too_large_for_the_filesystem_are_capped_and_keep_working() {
        let dir = tempfile::tempdir().unwrap();
        let disks = Disks::new(
            dir.path(),
            &dir.path().join("dev"),
            Backing::File,
            DeviceLayout::Shared,
        )
        .unwrap();
        // 64 TiB: more than ext4 (16 TiB - 4 KiB) or any 32-bit-block filesystem holds.
        let nominal = 65_536 * GIB;
        disks.create_volume("vol-big", 16_384, None).unwrap();
        let len16 = fs::metadata(disks.volume_path("vol-big")).unwrap().len();
        assert!((16_383 * GIB..=16_384 * GIB).contains(&len16), "{len16}");
        disks.create_volume("vol-huge", 65_536, None).unwrap();
        let len = fs::metadata(disks.volume_path("vol-huge")).unwrap().len();
        assert!(len > 0 && len <= nominal, "{len}");
        assert!(
            fs::metadata(disks.volume_path("vol-huge"))
                .unwrap()
                .blocks()
                * 512
                < 1 << 20
        );
        if len < nominal {
            // Capped: the cap is the filesystem's limit, so one MiB more is refused.
            assert_eq!(len % MIB, 0);
            assert_eq!(len, disks.max_image_len.load(Ordering::Relaxed));
            let probe = dir.path().join("probe");
            let f = fs::File::create(&probe).unwrap();
            assert!(too_large(&f.set_len(len + MIB).unwrap_err()));
            assert!(!dir.path().join("volumes/.max-len-probe").exists());
        }

        // Data, growth, snapshots and restores of capped images.
        use std::io::{Read as _, Seek as _, Write as _};
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(disks.volume_path("vol-big"))
            .unwrap();
        f.seek(std::io::SeekFrom::Start(len16 - 5)).unwrap();
        f.write_all(b"tail!").unwrap();
        drop(f);
        disks.grow_volume("vol-big", 65_536).unwrap();
        assert_eq!(
            fs::metadata(disks.volume_path("vol-big")).unwrap().len(),
            len
        );
        disks.snapshot_volume("vol-big", "snap-big").unwrap();
        assert_eq!(
            fs::metadata(disks.snapshot_path("snap-big")).unwrap().len(),
            len
        );
        disks
            .create_volume("vol-restored", 65_536, Some("snap-big"))
            .unwrap();
        let mut f = fs::File::open(disks.volume_path("vol-restored")).unwrap();
        assert_eq!(f.metadata().unwrap().len(), len);
        f.seek(std::io::SeekFrom::Start(len16 - 5)).unwrap();
        let mut tail = [0u8; 5];
        f.read_exact(&mut tail).unwrap();
        assert_eq!(&tail, b"tail!");
    }

    #[test]
    fn by_id_drops_the_dash() {
        assert_eq!(
            by_id_name("vol-0123456789abcdef0"),
            "nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"
        );
    }
}
