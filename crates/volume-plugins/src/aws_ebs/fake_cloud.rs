//! A small in-memory [`Cloud`] for the unit tests of the in-tree plugin's attacher: volumes,
//! instances whose block device mapping is derived from the attachments, the real device-name
//! allocator, EC2's asynchronous attach and detach (a wait moves `attaching` and `detaching`
//! on, unless the fake is "stuck"), one-shot failures per EC2 action, and a count of calls.
//! Only what the plugin calls is implemented; the rest answers an error.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ebs_cloud::{
    AttachmentState, BlockDevice, Cloud, CloudError, DeviceAllocator, Disk, DiskModification,
    DiskOptions, Instance, Result, Snapshot, SnapshotPage, VolumeAttachment,
};

#[derive(Debug, Default)]
struct State {
    volumes: BTreeMap<String, Disk>,
    instances: Vec<String>,
    calls: HashMap<&'static str, usize>,
    faults: HashMap<&'static str, CloudError>,
    stuck: bool,
    /// DetachVolume calls that came while the attachment was still `attaching` (EC2 answers
    /// IncorrectState to those).
    detach_refused: usize,
}

#[derive(Debug, Default)]
pub(crate) struct FakeCloud {
    state: Mutex<State>,
    devices: DeviceAllocator,
}

impl FakeCloud {
    pub(crate) fn with_instances(ids: &[&str]) -> Arc<Self> {
        let cloud = Self::default();
        cloud.lock().instances = ids.iter().map(|s| s.to_string()).collect();
        Arc::new(cloud)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add_volume(&self, id: &str) {
        self.lock().volumes.insert(
            id.to_string(),
            Disk {
                volume_id: id.to_string(),
                size_gib: 1,
                zone: "us-east-1a".into(),
                state: "available".into(),
                volume_type: "gp3".into(),
                ..Disk::default()
            },
        );
    }

    pub(crate) fn set_attachment(
        &self,
        volume: &str,
        instance: &str,
        device: &str,
        state: AttachmentState,
    ) {
        let mut s = self.lock();
        let Some(disk) = s.volumes.get_mut(volume) else {
            panic!("no volume {volume}");
        };
        disk.attachments.retain(|a| a.instance_id != instance);
        disk.attachments.push(VolumeAttachment {
            instance_id: instance.into(),
            device: device.into(),
            state,
        });
    }

    pub(crate) fn attachment(&self, volume: &str, instance: &str) -> Option<AttachmentState> {
        self.lock()
            .volumes
            .get(volume)?
            .attachment_to(instance)
            .map(|a| a.state)
    }

    /// Attaches and detaches stop making progress.
    pub(crate) fn set_stuck(&self, stuck: bool) {
        self.lock().stuck = stuck;
    }

    /// The next call of `action` fails with `error`.
    pub(crate) fn fail(&self, action: &'static str, error: CloudError) {
        self.lock().faults.insert(action, error);
    }

    pub(crate) fn calls(&self, action: &str) -> usize {
        self.lock().calls.get(action).copied().unwrap_or(0)
    }

    pub(crate) fn detach_refused(&self) -> usize {
        self.lock().detach_refused
    }

    /// The volumes there are now.
    pub(crate) fn volume_ids(&self) -> Vec<String> {
        self.lock().volumes.keys().cloned().collect()
    }

    /// One volume as EC2 would describe it.
    pub(crate) fn volume(&self, id: &str) -> Option<Disk> {
        self.lock().volumes.get(id).cloned()
    }

    /// Counts the call and answers an injected failure, if any.
    fn call(&self, action: &'static str) -> Result<MutexGuard<'_, State>> {
        let mut s = self.lock();
        *s.calls.entry(action).or_default() += 1;
        match s.faults.remove(action) {
            Some(e) => Err(e),
            None => Ok(s),
        }
    }

    fn instance(s: &State, id: &str) -> Result<Instance> {
        if !s.instances.iter().any(|i| i == id) {
            return Err(CloudError::not_found("instance", id));
        }
        let devices = s
            .volumes
            .values()
            .filter_map(|d| {
                d.attachment_to(id).map(|a| BlockDevice {
                    device: a.device.clone(),
                    volume_id: d.volume_id.clone(),
                })
            })
            .collect();
        Ok(Instance {
            instance_id: id.to_string(),
            zone: "us-east-1a".into(),
            state: "running".into(),
            root_device: Some("/dev/xvda".into()),
            devices,
        })
    }
}

fn unsupported<T>(action: &'static str) -> Result<T> {
    Err(CloudError::other(
        action,
        "NotImplemented",
        "not in the unit-test fake",
    ))
}

#[async_trait::async_trait]
impl Cloud for FakeCloud {
    async fn create_disk(&self, name: &str, options: &DiskOptions) -> Result<Disk> {
        let mut s = self.call("CreateVolume")?;
        // EC2's client token: the same name gives the same volume.
        if let Some(d) = s
            .volumes
            .values()
            .find(|d| d.tags.get(ebs_cloud::VOLUME_NAME_TAG).map(String::as_str) == Some(name))
        {
            return Ok(d.clone());
        }
        let id = format!("vol-{:08x}", s.volumes.len() + 1);
        let mut tags = options.tags.clone();
        tags.insert(ebs_cloud::VOLUME_NAME_TAG.to_string(), name.to_string());
        let disk = Disk {
            volume_id: id.clone(),
            size_gib: options.size_gib,
            zone: options.zone.clone(),
            state: "available".into(),
            volume_type: options.volume_type.clone(),
            iops: options.iops,
            encrypted: options.encrypted,
            kms_key_id: options.kms_key_id.clone(),
            tags,
            ..Disk::default()
        };
        s.volumes.insert(id, disk.clone());
        Ok(disk)
    }

    async fn delete_disk(&self, volume_id: &str) -> Result<bool> {
        let mut s = self.call("DeleteVolume")?;
        Ok(s.volumes.remove(volume_id).is_some())
    }

    async fn attach_disk(&self, volume_id: &str, instance_id: &str) -> Result<String> {
        let mut s = self.call("AttachVolume")?;
        let instance = Self::instance(&s, instance_id)?;
        if let Some(d) = instance.devices.iter().find(|d| d.volume_id == volume_id) {
            return Ok(d.device.clone());
        }
        let device = self.devices.allocate(&instance, volume_id)?;
        let disk = s
            .volumes
            .get_mut(volume_id)
            .ok_or_else(|| CloudError::not_found("volume", volume_id))?;
        if let Some(other) = disk.attachments.first() {
            return Err(CloudError::VolumeInUse {
                volume_id: volume_id.into(),
                message: format!("attached to {}", other.instance_id),
            });
        }
        disk.attachments.push(VolumeAttachment {
            instance_id: instance_id.into(),
            device: device.clone(),
            state: AttachmentState::Attaching,
        });
        disk.state = "in-use".into();
        Ok(device)
    }

    async fn detach_disk(&self, volume_id: &str, instance_id: &str) -> Result<bool> {
        let mut s = self.call("DetachVolume")?;
        let Some(disk) = s.volumes.get_mut(volume_id) else {
            return Ok(false);
        };
        let Some(a) = disk
            .attachments
            .iter_mut()
            .find(|a| a.instance_id == instance_id)
        else {
            return Ok(false);
        };
        match a.state {
            AttachmentState::Attached | AttachmentState::Busy => {
                a.state = AttachmentState::Detaching;
                let device = a.device.clone();
                self.devices.release(instance_id, &device);
                Ok(true)
            }
            AttachmentState::Attaching => {
                s.detach_refused += 1;
                Ok(false)
            }
            AttachmentState::Detaching | AttachmentState::Detached => Ok(false),
        }
    }

    async fn wait_for_attachment_state(
        &self,
        volume_id: &str,
        instance_id: &str,
        state: AttachmentState,
        timeout: Duration,
    ) -> Result<Option<VolumeAttachment>> {
        let seen = {
            let mut s = self.call("DescribeVolumes")?;
            let stuck = s.stuck;
            let disk = s
                .volumes
                .get_mut(volume_id)
                .ok_or_else(|| CloudError::not_found("volume", volume_id))?;
            if !stuck {
                // EC2 finishes what is in progress.
                for a in &mut disk.attachments {
                    if a.instance_id == instance_id {
                        match a.state {
                            AttachmentState::Attaching => a.state = AttachmentState::Attached,
                            AttachmentState::Detaching => a.state = AttachmentState::Detached,
                            _ => {}
                        }
                    }
                }
                disk.attachments
                    .retain(|a| a.state != AttachmentState::Detached);
            }
            let seen = disk.attachment_to(instance_id).cloned();
            match &seen {
                None if state == AttachmentState::Detached => return Ok(None),
                Some(a) if a.state == state => return Ok(seen),
                _ => {}
            }
            seen
        };
        tokio::time::sleep(timeout).await;
        Err(CloudError::Timeout {
            what: format!(
                "volume {volume_id} to be {} on {instance_id} (it is {})",
                state.as_str(),
                seen.map_or("detached", |a| a.state.as_str())
            ),
            waited: timeout,
        })
    }

    fn device_failed(&self, instance_id: &str, device: &str) {
        self.devices.mark_failed(instance_id, device);
    }

    async fn get_disk_by_name(&self, name: &str) -> Result<Option<Disk>> {
        let s = self.call("DescribeVolumes")?;
        Ok(s.volumes
            .values()
            .find(|d| d.tags.get(ebs_cloud::VOLUME_NAME_TAG).map(String::as_str) == Some(name))
            .cloned())
    }

    async fn get_disk_by_id(&self, volume_id: &str) -> Result<Disk> {
        let s = self.call("DescribeVolumes")?;
        s.volumes
            .get(volume_id)
            .cloned()
            .ok_or_else(|| CloudError::not_found("volume", volume_id))
    }

    async fn get_instance(&self, instance_id: &str) -> Result<Instance> {
        let s = self.call("DescribeInstances")?;
        Self::instance(&s, instance_id)
    }

    async fn resize_disk(&self, _volume_id: &str, _size_gib: i64) -> Result<i64> {
        unsupported("ModifyVolume")
    }

    async fn modify_disk(
        &self,
        _volume_id: &str,
        _change: &DiskModification,
        _timeout: Duration,
    ) -> Result<bool> {
        unsupported("ModifyVolume")
    }

    async fn tag_disk(
        &self,
        _volume_id: &str,
        _add: &BTreeMap<String, String>,
        _remove: &[String],
    ) -> Result<()> {
        unsupported("CreateTags")
    }

    async fn create_snapshot(
        &self,
        _name: &str,
        _volume_id: &str,
        _tags: &[(String, String)],
    ) -> Result<Snapshot> {
        unsupported("CreateSnapshot")
    }

    async fn delete_snapshot(&self, _snapshot_id: &str) -> Result<bool> {
        unsupported("DeleteSnapshot")
    }

    async fn get_snapshot_by_name(&self, _name: &str) -> Result<Option<Snapshot>> {
        unsupported("DescribeSnapshots")
    }

    async fn get_snapshot_by_id(&self, _snapshot_id: &str) -> Result<Snapshot> {
        unsupported("DescribeSnapshots")
    }

    async fn list_snapshots(
        &self,
        _source_volume_id: Option<&str>,
        _max_entries: Option<i32>,
        _next_token: Option<&str>,
    ) -> Result<SnapshotPage> {
        unsupported("DescribeSnapshots")
    }

    async fn availability_zones(&self) -> Result<Vec<String>> {
        Ok(vec!["us-east-1a".into()])
    }
}
