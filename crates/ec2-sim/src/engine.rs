//! The simulator's core: the cloud state, its persistence and backing. The actions run on it
//! (`Engine::handle`, in [`crate::actions`], which reads and changes it).

use crate::Error;
use crate::backing::Disks;
use crate::config::{Faults, SimConfig};
use crate::history::{AttachmentLog, HISTORY_CAPACITY};
use crate::ids::now_ms;
use crate::model::{AttachState, Cloud, Effect};
use crate::store;

pub(crate) struct Engine {
    pub(crate) config: SimConfig,
    pub(crate) cloud: Cloud,
    pub(crate) faults: Faults,
    pub(crate) disks: Disks,
    /// Something changed since the last save.
    pub(crate) dirty: bool,
    /// The last loop-device reconciliation failed; retry at the next tick.
    reconcile_failed: bool,
    /// Every attachment state change seen (in memory only).
    pub(crate) history: AttachmentLog,
}

/// Every EC2 action the simulator implements.
pub(crate) const ACTIONS: &[&str] = &[
    "AttachVolume",
    "CreateSnapshot",
    "CreateTags",
    "CreateVolume",
    "DeleteSnapshot",
    "DeleteTags",
    "DeleteVolume",
    "DescribeAvailabilityZones",
    "DescribeInstances",
    "DescribeSnapshots",
    "DescribeVolumes",
    "DescribeVolumesModifications",
    "DetachVolume",
    "ModifyVolume",
    "RunInstances",
    "TerminateInstances",
];

impl Engine {
    /// Loads the state, brings the backing in line with it (re-adopting loop devices) and
    /// writes the state back.
    pub(crate) fn open(config: SimConfig) -> Result<Engine, Error> {
        config.validate()?;
        std::fs::create_dir_all(&config.state_dir).map_err(|source| Error::Io {
            path: config.state_dir.clone(),
            source,
        })?;
        let cloud = store::load(&config.state_dir)?;
        let disks = Disks::new(
            &config.state_dir,
            &config.device_dir(),
            config.backing,
            config.device_layout,
        )?;
        let faults = config.faults.clone();
        let mut engine = Engine {
            config,
            cloud,
            faults,
            disks,
            dirty: true,
            reconcile_failed: false,
            history: AttachmentLog::new(HISTORY_CAPACITY),
        };
        engine.tick();
        // Adopt or create the devices attachments need first, then drop leftovers.
        engine.disks.reconcile(&engine.cloud)?;
        engine.disks.release_orphans(&engine.cloud);
        engine.disks.sweep_stale_links();
        Ok(engine)
    }

    /// Applies due transitions, carries out their effects, syncs loop devices and saves.
    pub(crate) fn tick(&mut self) {
        let now = now_ms();
        // Which due detaches would finish under a mounted device: held back with the fault,
        // and either way marked in the attachment history.
        let mounted = self.mounted_detaching(now);
        let busy = if self.faults.detach_waits_for_unmount {
            mounted.clone()
        } else {
            Default::default()
        };
        let (changed, effects) = self.cloud.settle_with(now, &self.faults, &busy);
        self.dirty |= changed;
        for effect in effects {
            match effect {
                Effect::VolumeGone(id) => self.disks.remove_volume(&id),
                Effect::Grow(id, size) => {
                    if let Err(e) = self.disks.grow_volume(&id, size) {
                        tracing::error!(volume_id = %id, error = %e, "cannot grow volume image");
                    }
                }
            }
        }
        if changed || self.reconcile_failed {
            self.reconcile();
        }
        self.history.observe(&self.cloud, now, &mounted);
        self.save();
    }

    /// Brings loop devices in line with the state; errors are logged inside and retried at
    /// the next tick.
    pub(crate) fn reconcile(&mut self) {
        self.reconcile_failed = self.disks.reconcile(&self.cloud).is_err();
    }

    /// Volumes whose detach is due (forced or not) but whose loop device is still mounted or
    /// held. Reads mountinfo only when some detach is due.
    fn mounted_detaching(&self, now: u64) -> std::collections::BTreeSet<String> {
        let due: Vec<&str> = self
            .cloud
            .volumes
            .values()
            .filter(|v| {
                v.attachments.iter().any(|a| {
                    a.state == AttachState::Detaching && !a.never_attached && now >= a.done_ms
                })
            })
            .map(|v| v.id.as_str())
            .collect();
        if due.is_empty() {
            return Default::default();
        }
        self.disks.in_use(&due)
    }

    pub(crate) fn save(&mut self) {
        if !self.dirty {
            return;
        }
        match store::save(&self.config.state_dir, &self.cloud) {
            Ok(()) => self.dirty = false,
            Err(e) => tracing::error!(error = %e, "cannot save state; will retry"),
        }
    }

    pub(crate) fn shutdown(&mut self) -> Result<(), Error> {
        self.save();
        self.disks.release_all()
    }
}
