//! [`AwsCloud`]: the [`Cloud`] trait over `aws-sdk-ec2`.

mod create;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::{self, ResourceType};
use ebs_cloud::batcher::ExecFuture;
use ebs_cloud::{
    AttachmentState, Batcher, Cloud, CloudError, CloudMetrics, DeviceAllocator, Disk,
    DiskModification, DiskOptions, Instance, SNAPSHOT_NAME_TAG, Snapshot, SnapshotPage,
    VOLUME_NAME_TAG, VolumeAttachment,
};

use crate::ec2::{Ec2, Failure, build_client};
use crate::{AwsConfig, Error, convert};

type Result<T, E = CloudError> = std::result::Result<T, E>;

/// See the crate docs.
#[derive(Debug)]
pub struct AwsCloud {
    ec2: Ec2,
    config: AwsConfig,
    devices: DeviceAllocator,
    volumes: Batcher<Disk>,
    instances: Batcher<Instance>,
}

fn int32(field: &'static str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| CloudError::InvalidArgument {
        action: "CreateVolume",
        code: "InvalidParameterValue".into(),
        message: format!("{field} {v} is out of range"),
    })
}

impl AwsCloud {
    /// Builds the SDK client (region, endpoint, credentials as configured). Makes no EC2 call.
    pub async fn new(config: AwsConfig, metrics: CloudMetrics) -> Result<Self, Error> {
        let client = build_client(&config).await?;
        let ec2 = Ec2 {
            client,
            metrics,
            retry: config.retry,
        };
        let e = ec2.clone();
        let volumes = Batcher::new("volume", config.batching, move |ids: Vec<String>| {
            let e = e.clone();
            Box::pin(async move { describe_volumes(&e, ids).await }) as ExecFuture<Disk>
        });
        let e = ec2.clone();
        let instances = Batcher::new("instance", config.batching, move |ids: Vec<String>| {
            let e = e.clone();
            Box::pin(async move { describe_instances(&e, ids).await }) as ExecFuture<Instance>
        });
        Ok(Self {
            ec2,
            config,
            devices: DeviceAllocator::new(),
            volumes,
            instances,
        })
    }

    /// The SDK client (the embedded mode registers the machine with it).
    pub fn client(&self) -> &aws_sdk_ec2::Client {
        &self.ec2.client
    }

    pub fn metrics(&self) -> &CloudMetrics {
        &self.ec2.metrics
    }

    /// RunInstances with a client token, so that the same token always names the same instance:
    /// the embedded simulator registers "this machine" with it.
    pub async fn run_instance(&self, token: &str, zone: Option<&str>) -> Result<Instance> {
        let out = self
            .ec2
            .call("RunInstances", || {
                self.ec2
                    .client
                    .run_instances()
                    .image_id("ami-12345678")
                    .instance_type(types::InstanceType::M5Large)
                    .min_count(1)
                    .max_count(1)
                    .client_token(token)
                    .set_placement(
                        zone.map(|z| types::Placement::builder().availability_zone(z).build()),
                    )
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud(token))?;
        out.instances()
            .first()
            .map(convert::instance)
            .ok_or_else(|| CloudError::other("RunInstances", "Empty", "no instance returned"))
    }

    /// Sleeps the next poll delay of a wait and grows it.
    async fn poll_sleep(&self, delay: &mut Duration) {
        tokio::time::sleep(*delay).await;
        *delay = delay.mul_f64(1.5).min(self.config.poll_max);
    }

    async fn wait_available(&self, name: &str, options: &DiskOptions, id: &str) -> Result<Disk> {
        let started = Instant::now();
        let mut delay = self.config.poll_initial;
        loop {
            match self.volumes.get(id).await {
                Ok(d) if d.state == "available" || d.state == "in-use" => return Ok(d),
                Ok(d) if d.state == "creating" => {}
                Ok(d) => {
                    return Err(CloudError::other(
                        "CreateVolume",
                        "VolumeFailed",
                        format!("volume {id} for {name} went to state '{}'", d.state),
                    ));
                }
                // EC2 drops a volume whose KMS key is unusable a moment after creating it.
                Err(CloudError::NotFound { .. }) => return Err(vanished(name, options, id)),
                Err(e) => return Err(e),
            }
            if started.elapsed() > self.config.create_timeout {
                return Err(CloudError::Timeout {
                    what: format!("volume {id} ({name}) to become available"),
                    waited: started.elapsed(),
                });
            }
            self.poll_sleep(&mut delay).await;
        }
    }

    /// The modifications EC2 remembers for the volume; the caller decides which failure codes
    /// mean "none".
    async fn describe_modifications(
        &self,
        volume_id: &str,
    ) -> Result<Vec<types::VolumeModification>, Failure> {
        self.ec2
            .call("DescribeVolumesModifications", || {
                self.ec2
                    .client
                    .describe_volumes_modifications()
                    .volume_ids(volume_id)
                    .send()
            })
            .await
            .map(|o| o.volumes_modifications().to_vec())
    }

    /// The volume's latest modification, if EC2 remembers one.
    async fn latest_modification(
        &self,
        volume_id: &str,
    ) -> Result<Option<types::VolumeModification>> {
        match self.describe_modifications(volume_id).await {
            Ok(mods) => Ok(mods
                .into_iter()
                .filter(|m| m.volume_id() == Some(volume_id))
                .max_by_key(|m| m.start_time().map(|t| (t.secs(), t.subsec_nanos())))),
            Err(f) if f.is("InvalidVolumeModification.NotFound") => Ok(None),
            Err(f) => Err(f.into_cloud(volume_id)),
        }
    }

    /// Polls until the latest modification has `change`'s target and is `optimizing` or
    /// `completed` (the new type and performance are in effect then).
    async fn wait_modified(
        &self,
        volume_id: &str,
        change: &DiskModification,
        timeout: Duration,
    ) -> Result<()> {
        let started = Instant::now();
        let mut delay = self.config.poll_initial;
        loop {
            let latest = self.latest_modification(volume_id).await?;
            let state = latest
                .as_ref()
                .filter(|m| targets(m, change))
                .and_then(|m| m.modification_state())
                .map(|s| s.as_str().to_string());
            match state.as_deref() {
                Some("optimizing") | Some("completed") => return Ok(()),
                Some("failed") => {
                    let reason = latest
                        .as_ref()
                        .and_then(|m| m.status_message())
                        .unwrap_or("no reason given");
                    return Err(CloudError::other(
                        "ModifyVolume",
                        "ModificationFailed",
                        format!("modifying {volume_id} to {change:?} failed: {reason}"),
                    ));
                }
                _ => {}
            }
            if started.elapsed() + delay > timeout {
                return Err(CloudError::Timeout {
                    what: format!(
                        "the modification of {volume_id} ({}) to reach 'optimizing'; it goes on, and a repeat of the call waits for it",
                        describe_change(change)
                    ),
                    waited: started.elapsed(),
                });
            }
            self.poll_sleep(&mut delay).await;
        }
    }

    async fn find_by_tag<T>(
        &self,
        action: &'static str,
        name: &str,
        found: Vec<T>,
    ) -> Result<Option<T>> {
        let mut found = found;
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            n => Err(CloudError::other(
                action,
                "Ambiguous",
                format!("{n} objects carry the name tag {name}; expected at most one"),
            )),
        }
    }
}

/// Whether a modification's target has everything `change` asks for.
fn targets(m: &types::VolumeModification, change: &DiskModification) -> bool {
    change.satisfied_by(
        m.target_volume_type().map(|t| t.as_str()).unwrap_or(""),
        m.target_iops().map(i64::from),
        m.target_throughput().map(i64::from),
    )
}

fn describe_change(change: &DiskModification) -> String {
    let mut parts = Vec::new();
    if let Some(t) = &change.volume_type {
        parts.push(format!("type {t}"));
    }
    if let Some(i) = change.iops {
        parts.push(format!("iops {i}"));
    }
    if let Some(t) = change.throughput {
        parts.push(format!("throughput {t}"));
    }
    parts.join(", ")
}

fn vanished(name: &str, options: &DiskOptions, id: &str) -> CloudError {
    if options.encrypted {
        CloudError::KmsKeyUnavailable {
            volume_id: id.to_string(),
            name: name.to_string(),
            kms_key: options
                .kms_key_id
                .clone()
                .unwrap_or_else(|| "(the default EBS key)".into()),
        }
    } else {
        CloudError::other(
            "CreateVolume",
            "VolumeVanished",
            format!("volume {id} for {name} disappeared while being created"),
        )
    }
}

async fn describe_volumes(e: &Ec2, ids: Vec<String>) -> Result<HashMap<String, Disk>> {
    // A filter, not VolumeIds: with VolumeIds one missing ID fails the whole batch.
    let mut out = HashMap::new();
    let mut token: Option<String> = None;
    loop {
        let page = e
            .call("DescribeVolumes", || {
                e.client
                    .describe_volumes()
                    .filters(convert::filter("volume-id", ids.iter().cloned()))
                    .set_next_token(token.clone())
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud("(batch)"))?;
        for v in page.volumes() {
            let d = convert::disk(v);
            out.insert(d.volume_id.clone(), d);
        }
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            return Ok(out);
        }
    }
}

async fn describe_instances(e: &Ec2, ids: Vec<String>) -> Result<HashMap<String, Instance>> {
    let mut out = HashMap::new();
    let mut token: Option<String> = None;
    loop {
        let page = e
            .call("DescribeInstances", || {
                e.client
                    .describe_instances()
                    .filters(convert::filter("instance-id", ids.iter().cloned()))
                    .set_next_token(token.clone())
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud("(batch)"))?;
        for r in page.reservations() {
            for i in r.instances() {
                let i = convert::instance(i);
                out.insert(i.instance_id.clone(), i);
            }
        }
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            return Ok(out);
        }
    }
}

fn attach_failure(f: Failure, volume_id: &str, instance_id: &str) -> CloudError {
    match f.code.as_str() {
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" => {
            CloudError::not_found("instance", instance_id)
        }
        "AttachmentLimitExceeded" => CloudError::AttachmentLimit {
            instance_id: instance_id.to_string(),
            message: f.message,
        },
        _ => f.into_cloud(volume_id),
    }
}

#[async_trait::async_trait]
impl Cloud for AwsCloud {
    async fn create_disk(&self, name: &str, options: &DiskOptions) -> Result<Disk> {
        self.create_for_name(name, options).await
    }

    async fn delete_disk(&self, volume_id: &str) -> Result<bool> {
        match self
            .ec2
            .call("DeleteVolume", || {
                self.ec2.client.delete_volume().volume_id(volume_id).send()
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(f) if f.is_not_found() => Ok(false),
            Err(f) => Err(f.into_cloud(volume_id)),
        }
    }

    async fn attach_disk(&self, volume_id: &str, instance_id: &str) -> Result<String> {
        // A name EC2 says is in use (an attachment we cannot see yet) is marked failed and
        // the next one tried; a few rounds are plenty.
        for _ in 0..5 {
            let instance = self.instances.get(instance_id).await?;
            if let Some(d) = instance.devices.iter().find(|d| d.volume_id == volume_id) {
                return Ok(d.device.clone());
            }
            let device = self.devices.allocate(&instance, volume_id)?;
            let result = self
                .ec2
                .call("AttachVolume", || {
                    self.ec2
                        .client
                        .attach_volume()
                        .device(&device)
                        .instance_id(instance_id)
                        .volume_id(volume_id)
                        .send()
                })
                .await;
            match result {
                Ok(_) => {
                    tracing::info!(volume_id, instance_id, device, "AttachVolume");
                    return Ok(device);
                }
                Err(f) if f.is("InvalidParameterValue") && f.message.contains("in use") => {
                    tracing::warn!(volume_id, instance_id, device, message = %f.message, "device name in use; trying another");
                    self.devices.mark_failed(instance_id, &device);
                }
                Err(f) => {
                    self.devices.release(instance_id, &device);
                    return Err(attach_failure(f, volume_id, instance_id));
                }
            }
        }
        Err(CloudError::other(
            "AttachVolume",
            "NoUsableDevice",
            format!("every device name tried for {volume_id} on {instance_id} was in use"),
        ))
    }

    async fn detach_disk(&self, volume_id: &str, instance_id: &str) -> Result<bool> {
        let result = self
            .ec2
            .call("DetachVolume", || {
                self.ec2
                    .client
                    .detach_volume()
                    .volume_id(volume_id)
                    .instance_id(instance_id)
                    .send()
            })
            .await;
        match result {
            Ok(out) => {
                if let Some(d) = out.device() {
                    self.devices.release(instance_id, d);
                }
                tracing::info!(volume_id, instance_id, "DetachVolume");
                Ok(true)
            }
            // Not attached (anywhere, or there), or no such volume: nothing to detach.
            Err(f) if f.is_not_found() || f.is("IncorrectState") => Ok(false),
            Err(f) => Err(f.into_cloud(volume_id)),
        }
    }

    async fn wait_for_attachment_state(
        &self,
        volume_id: &str,
        instance_id: &str,
        state: AttachmentState,
        timeout: Duration,
    ) -> Result<Option<VolumeAttachment>> {
        let started = Instant::now();
        let mut delay = self.config.poll_initial;
        loop {
            let attachment = match self.volumes.get(volume_id).await {
                Ok(d) => d.attachment_to(instance_id).cloned(),
                Err(CloudError::NotFound { .. }) if state == AttachmentState::Detached => None,
                Err(e) => return Err(e),
            };
            match &attachment {
                None if state == AttachmentState::Detached => return Ok(None),
                Some(a) if a.state == state => return Ok(attachment),
                _ => {}
            }
            if started.elapsed() >= timeout {
                return Err(CloudError::Timeout {
                    what: format!(
                        "volume {volume_id} to be {} on {instance_id} (it is {})",
                        state.as_str(),
                        attachment.map(|a| a.state.as_str()).unwrap_or("detached")
                    ),
                    waited: started.elapsed(),
                });
            }
            self.poll_sleep(&mut delay).await;
        }
    }

    fn device_failed(&self, instance_id: &str, device: &str) {
        self.devices.mark_failed(instance_id, device);
    }

    async fn get_disk_by_name(&self, name: &str) -> Result<Option<Disk>> {
        let out = self
            .ec2
            .call("DescribeVolumes", || {
                self.ec2
                    .client
                    .describe_volumes()
                    .filters(convert::filter(
                        &format!("tag:{VOLUME_NAME_TAG}"),
                        [name.to_string()],
                    ))
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud(name))?;
        let disks: Vec<Disk> = out
            .volumes()
            .iter()
            .map(convert::disk)
            .filter(|d| d.state != "deleted" && d.state != "deleting")
            .collect();
        self.find_by_tag("DescribeVolumes", name, disks).await
    }

    async fn get_disk_by_id(&self, volume_id: &str) -> Result<Disk> {
        self.volumes.get(volume_id).await
    }

    async fn get_instance(&self, instance_id: &str) -> Result<Instance> {
        self.instances.get(instance_id).await
    }

    async fn resize_disk(&self, volume_id: &str, size_gib: i64) -> Result<i64> {
        let disk = self.volumes.get(volume_id).await?;
        let target = int32("size", size_gib)?;
        if disk.size_gib < size_gib {
            let result = self
                .ec2
                .call("ModifyVolume", || {
                    self.ec2
                        .client
                        .modify_volume()
                        .volume_id(volume_id)
                        .size(target)
                        .send()
                })
                .await;
            match result {
                Ok(_) => {}
                // A modification to this size may be running already (a retried call).
                Err(f) if f.is("IncorrectModificationState") => {}
                Err(f) => return Err(f.into_cloud(volume_id)),
            }
        }
        // The new size is usable once the modification is optimizing or completed.
        let started = Instant::now();
        let mut delay = self.config.poll_initial;
        loop {
            let mods = match self.describe_modifications(volume_id).await {
                Ok(mods) => mods,
                Err(f) if f.is_not_found() || f.code.contains("Modification.NotFound") => {
                    Vec::new()
                }
                Err(f) => return Err(f.into_cloud(volume_id)),
            };
            let newest = mods
                .iter()
                .filter(|m| m.target_size().map(i64::from).unwrap_or(0) >= size_gib)
                .map(|m| {
                    m.modification_state()
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_default()
                })
                .next();
            match newest.as_deref() {
                Some("optimizing") | Some("completed") => return Ok(size_gib),
                Some("failed") => {
                    return Err(CloudError::other(
                        "ModifyVolume",
                        "ModificationFailed",
                        format!("resizing {volume_id} to {size_gib} GiB failed"),
                    ));
                }
                Some(_) => {}
                None => {
                    // No modification: done already if the volume is that big.
                    let d = self.volumes.get(volume_id).await?;
                    if d.size_gib >= size_gib {
                        return Ok(d.size_gib);
                    }
                }
            }
            if started.elapsed() > self.config.create_timeout {
                return Err(CloudError::Timeout {
                    what: format!("volume {volume_id} to grow to {size_gib} GiB"),
                    waited: started.elapsed(),
                });
            }
            self.poll_sleep(&mut delay).await;
        }
    }

    async fn modify_disk(
        &self,
        volume_id: &str,
        change: &DiskModification,
        timeout: Duration,
    ) -> Result<bool> {
        if change.is_empty() {
            self.volumes.get(volume_id).await?;
            return Ok(false);
        }
        let disk = self.volumes.get(volume_id).await?;
        let latest = self.latest_modification(volume_id).await?;
        let running = latest.as_ref().is_some_and(|m| {
            matches!(
                m.modification_state().map(|s| s.as_str()),
                Some("modifying") | Some("optimizing")
            )
        });
        if running && latest.as_ref().is_some_and(|m| targets(m, change)) {
            // The same modification is under way (a retried call): wait for it, ask nothing.
            self.wait_modified(volume_id, change, timeout).await?;
            return Ok(false);
        }
        if change.satisfied_by(&disk.volume_type, disk.iops, disk.throughput) {
            return Ok(false);
        }
        let iops = change.iops.map(|i| int32("iops", i)).transpose()?;
        let throughput = change
            .throughput
            .map(|t| int32("throughput", t))
            .transpose()?;
        self.ec2
            .call("ModifyVolume", || {
                self.ec2
                    .client
                    .modify_volume()
                    .volume_id(volume_id)
                    .set_volume_type(change.volume_type.as_deref().map(types::VolumeType::from))
                    .set_iops(iops)
                    .set_throughput(throughput)
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud(volume_id))?;
        self.wait_modified(volume_id, change, timeout).await?;
        Ok(true)
    }

    async fn tag_disk(
        &self,
        volume_id: &str,
        add: &BTreeMap<String, String>,
        remove: &[String],
    ) -> Result<()> {
        if !add.is_empty() {
            self.ec2
                .call("CreateTags", || {
                    self.ec2
                        .client
                        .create_tags()
                        .resources(volume_id)
                        .set_tags(Some(
                            add.iter()
                                .map(|(k, v)| types::Tag::builder().key(k).value(v).build())
                                .collect(),
                        ))
                        .send()
                })
                .await
                .map_err(|f| f.into_cloud(volume_id))?;
        }
        if !remove.is_empty() {
            self.ec2
                .call("DeleteTags", || {
                    self.ec2
                        .client
                        .delete_tags()
                        .resources(volume_id)
                        .set_tags(Some(
                            remove
                                .iter()
                                .map(|k| types::Tag::builder().key(k).build())
                                .collect(),
                        ))
                        .send()
                })
                .await
                .map_err(|f| f.into_cloud(volume_id))?;
        }
        Ok(())
    }

    async fn create_snapshot(
        &self,
        name: &str,
        volume_id: &str,
        tags: &[(String, String)],
    ) -> Result<Snapshot> {
        if let Some(s) = self.get_snapshot_by_name(name).await? {
            if s.source_volume_id != volume_id {
                return Err(CloudError::IdempotentParameterMismatch {
                    what: "snapshot",
                    name: name.to_string(),
                });
            }
            return Ok(s);
        }
        let mut all: BTreeMap<String, String> = tags.iter().cloned().collect();
        all.insert(SNAPSHOT_NAME_TAG.to_string(), name.to_string());
        let out = self
            .ec2
            .call("CreateSnapshot", || {
                self.ec2
                    .client
                    .create_snapshot()
                    .volume_id(volume_id)
                    .description(format!("Created by the EBS CSI driver for {name}"))
                    .tag_specifications(convert::tag_spec(ResourceType::Snapshot, &all))
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud(volume_id))?;
        Ok(Snapshot {
            snapshot_id: out.snapshot_id().unwrap_or_default().to_string(),
            source_volume_id: out.volume_id().unwrap_or(volume_id).to_string(),
            size_gib: i64::from(out.volume_size().unwrap_or(0)),
            state: out
                .state()
                .map(|s| s.as_str().to_string())
                .unwrap_or_default(),
            created: out
                .start_time()
                .map(|t| (t.secs(), t.subsec_nanos()))
                .unwrap_or((0, 0)),
            tags: all,
        })
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool> {
        match self
            .ec2
            .call("DeleteSnapshot", || {
                self.ec2
                    .client
                    .delete_snapshot()
                    .snapshot_id(snapshot_id)
                    .send()
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(f) if f.is_not_found() => Ok(false),
            Err(f) => Err(f.into_cloud(snapshot_id)),
        }
    }

    async fn get_snapshot_by_name(&self, name: &str) -> Result<Option<Snapshot>> {
        let out = self
            .ec2
            .call("DescribeSnapshots", || {
                self.ec2
                    .client
                    .describe_snapshots()
                    .owner_ids("self")
                    .filters(convert::filter(
                        &format!("tag:{SNAPSHOT_NAME_TAG}"),
                        [name.to_string()],
                    ))
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud(name))?;
        let found: Vec<Snapshot> = out.snapshots().iter().map(convert::snapshot).collect();
        self.find_by_tag("DescribeSnapshots", name, found).await
    }

    async fn get_snapshot_by_id(&self, snapshot_id: &str) -> Result<Snapshot> {
        let out = self
            .ec2
            .call("DescribeSnapshots", || {
                self.ec2
                    .client
                    .describe_snapshots()
                    .snapshot_ids(snapshot_id)
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud(snapshot_id))?;
        out.snapshots()
            .first()
            .map(convert::snapshot)
            .ok_or_else(|| CloudError::not_found("snapshot", snapshot_id))
    }

    async fn list_snapshots(
        &self,
        source_volume_id: Option<&str>,
        max_entries: Option<i32>,
        next_token: Option<&str>,
    ) -> Result<SnapshotPage> {
        // EC2 pages hold 5..=1000. A smaller page is cut from a larger one, and our token then
        // says where in that EC2 page to go on: `skip:N:<EC2 token>`.
        let want = max_entries.filter(|n| *n > 0).map(|n| n.min(1000));
        let (ec2_token, skip) = match next_token.and_then(|t| t.strip_prefix("skip:")) {
            Some(rest) => {
                let (n, tok) = rest.split_once(':').unwrap_or((rest, ""));
                let n: i32 = n.parse().map_err(|_| CloudError::InvalidArgument {
                    action: "DescribeSnapshots",
                    code: "InvalidPaginationToken".into(),
                    message: format!("the token {rest:?} is not one this driver made"),
                })?;
                (Some(tok.to_string()).filter(|t| !t.is_empty()), n.max(0))
            }
            None => (next_token.map(str::to_string), 0),
        };
        let page_size = want.map(|n| (n + skip).clamp(5, 1000));
        let out = self
            .ec2
            .call("DescribeSnapshots", || {
                self.ec2
                    .client
                    .describe_snapshots()
                    .owner_ids("self")
                    .set_filters(
                        source_volume_id
                            .map(|v| vec![convert::filter("volume-id", [v.to_string()])]),
                    )
                    .set_max_results(page_size)
                    .set_next_token(ec2_token.clone())
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud(next_token.unwrap_or("snapshots")))?;
        let all: Vec<Snapshot> = out.snapshots().iter().map(convert::snapshot).collect();
        let skip = usize::try_from(skip).unwrap_or(0);
        let mut snapshots: Vec<Snapshot> = all.into_iter().skip(skip).collect();
        let mut token = out.next_token().map(str::to_string);
        if let Some(n) = want.and_then(|n| usize::try_from(n).ok()) {
            if snapshots.len() > n {
                snapshots.truncate(n);
                token = Some(format!(
                    "skip:{}:{}",
                    skip + n,
                    ec2_token.as_deref().unwrap_or("")
                ));
            }
        }
        Ok(SnapshotPage {
            snapshots,
            next_token: token,
        })
    }

    async fn availability_zones(&self) -> Result<Vec<String>> {
        let out = self
            .ec2
            .call("DescribeAvailabilityZones", || {
                self.ec2.client.describe_availability_zones().send()
            })
            .await
            .map_err(|f| f.into_cloud("zones"))?;
        Ok(out
            .availability_zones()
            .iter()
            .filter_map(|z| z.zone_name().map(str::to_string))
            .collect())
    }
}
