//! One operation per volume at a time. A second call for a volume that is busy fails at once
//! (the CO retries: "Timeouts" in the EBS driver design, docs/design/ebs-driver.md) instead of
//! queueing behind a mkfs; calls for other volumes never wait on this one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Error, Result};

#[derive(Debug, Clone, Default)]
pub(crate) struct VolumeLocks {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Held while an operation on a volume runs; dropping it frees the volume.
#[derive(Debug)]
pub(crate) struct VolumeGuard {
    busy: Arc<Mutex<HashSet<String>>>,
    volume_id: String,
}

impl VolumeLocks {
    pub(crate) fn try_lock(&self, volume_id: &str) -> Result<VolumeGuard> {
        if !lock(&self.busy).insert(volume_id.to_string()) {
            return Err(Error::OperationInFlight(volume_id.to_string()));
        }
        Ok(VolumeGuard {
            busy: Arc::clone(&self.busy),
            volume_id: volume_id.to_string(),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        lock(&self.busy).remove(&self.volume_id);
    }
}

/// The set is only ever inserted into or removed from, so a panic elsewhere cannot leave it
/// half-updated: recovering from poisoning is safe.
fn lock(m: &Mutex<HashSet<String>>) -> MutexGuard<'_, HashSet<String>> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_volume_is_refused_while_held_and_free_after() {
        let locks = VolumeLocks::default();
        let g = locks.try_lock("vol-1").unwrap();
        let err = locks.try_lock("vol-1").unwrap_err();
        assert!(
            matches!(err, Error::OperationInFlight(ref v) if v == "vol-1"),
            "{err}"
        );
        // Other volumes are independent.
        let _other = locks.try_lock("vol-2").unwrap();
        drop(g);
        locks.try_lock("vol-1").unwrap();
    }
}
