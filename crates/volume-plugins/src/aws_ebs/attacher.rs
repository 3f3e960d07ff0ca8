//! The attach/detach controller's side of the in-tree plugin: EC2 calls through
//! [`ebs_cloud::Cloud`], each one idempotent step that looks at EC2 first, so a retry after a
//! timeout or a controller restart continues where the last attempt stopped.

use std::sync::Arc;
use std::time::Duration;

use ebs_cloud::{AttachmentState, Cloud, CloudError};
use tokio::time::Instant;

use super::volume_id_from_spec;
use crate::{Error, Result};

/// The in-tree `kubernetes.io/aws-ebs` plugin's attacher. Without a cloud (a controller started
/// without EC2 access) every operation is [`Error::NoCloud`], whose message says what to
/// configure: the controller records it as an Event instead of failing silently.
#[derive(Clone, Debug)]
pub struct AwsEbsPlugin {
    cloud: Option<Arc<dyn Cloud>>,
}

impl AwsEbsPlugin {
    pub fn new(cloud: Option<Arc<dyn Cloud>>) -> Self {
        Self { cloud }
    }

    /// Whether a cloud is configured.
    pub fn has_cloud(&self) -> bool {
        self.cloud.is_some()
    }

    fn cloud(&self, operation: &'static str, volume_id: &str) -> Result<&Arc<dyn Cloud>> {
        self.cloud.as_ref().ok_or_else(|| Error::NoCloud {
            operation,
            volume_id: volume_id.to_string(),
        })
    }

    /// Attaches the volume (`vol-...` or an `aws://` spec ID) to the instance and returns the
    /// device path EC2 reports for the attachment, what goes into
    /// `node.status.volumesAttached[].devicePath`.
    ///
    /// Looks at the volume first: already `attached` to this instance is success at once (its
    /// device), `attaching` there is waited for without a second AttachVolume, `detaching`
    /// there (a detach still running) is waited out before attaching again. Otherwise
    /// [`Cloud::attach_disk`] picks a free device name with the allocator and calls
    /// AttachVolume; then the attachment is waited for until `timeout` (counted from the call)
    /// passes: [`Error::Timeout`]. An attachment that does not finish is left as it is (never
    /// undone by force): a retry waits for it again, a detach cleans it up. What EC2 refuses is
    /// [`Error::Cloud`].
    pub async fn attach(
        &self,
        volume_id: &str,
        instance_id: &str,
        timeout: Duration,
    ) -> Result<String> {
        const OP: &str = "attach";
        let id = volume_id_from_spec(volume_id)?;
        let cloud = self.cloud(OP, &id)?;
        check_instance(instance_id, &id)?;
        let deadline = Instant::now() + timeout;
        let disk = cloud
            .get_disk_by_id(&id)
            .await
            .map_err(|e| cloud_error(OP, &id, e))?;
        let current = disk.attachment_to(instance_id).cloned();
        let requested = match current.as_ref().map(|a| a.state) {
            Some(AttachmentState::Attached | AttachmentState::Busy) => {
                let device = current.map(|a| a.device).unwrap_or_default();
                tracing::debug!(volume_id = %id, instance_id, device, "already attached");
                return Ok(device);
            }
            Some(AttachmentState::Attaching) => {
                tracing::info!(volume_id = %id, instance_id, "an attach is already in progress; waiting for it");
                current.map(|a| a.device).unwrap_or_default()
            }
            Some(AttachmentState::Detaching) => {
                tracing::info!(volume_id = %id, instance_id, "a detach is in progress; waiting for it before attaching");
                wait_for(
                    cloud.as_ref(),
                    OP,
                    &id,
                    instance_id,
                    AttachmentState::Detached,
                    deadline,
                )
                .await?;
                attach_disk(cloud.as_ref(), &id, instance_id).await?
            }
            Some(AttachmentState::Detached) | None => {
                attach_disk(cloud.as_ref(), &id, instance_id).await?
            }
        };
        let attachment = wait_for(
            cloud.as_ref(),
            OP,
            &id,
            instance_id,
            AttachmentState::Attached,
            deadline,
        )
        .await?;
        let device = attachment.map_or(requested, |a| a.device);
        tracing::info!(volume_id = %id, instance_id, device, "attached");
        Ok(device)
    }

    /// Detaches the volume from the instance (DetachVolume, never forced) and waits until
    /// `timeout` for the attachment to be gone. `Ok(false)` when it was not attached there (or
    /// the volume no longer exists). An attachment still `attaching` is waited for first (EC2
    /// does not detach it before), one already `detaching` is only waited for.
    pub async fn detach(
        &self,
        volume_id: &str,
        instance_id: &str,
        timeout: Duration,
    ) -> Result<bool> {
        const OP: &str = "detach";
        let id = volume_id_from_spec(volume_id)?;
        let cloud = self.cloud(OP, &id)?;
        check_instance(instance_id, &id)?;
        let deadline = Instant::now() + timeout;
        let disk = match cloud.get_disk_by_id(&id).await {
            Ok(disk) => disk,
            Err(CloudError::NotFound { .. }) => {
                tracing::info!(volume_id = %id, instance_id, "volume does not exist; nothing to detach");
                return Ok(false);
            }
            Err(e) => return Err(cloud_error(OP, &id, e)),
        };
        let state = disk.attachment_to(instance_id).map(|a| a.state);
        match state {
            None | Some(AttachmentState::Detached) => {
                tracing::debug!(volume_id = %id, instance_id, "not attached there; nothing to detach");
                return Ok(false);
            }
            Some(AttachmentState::Detaching) => {
                tracing::info!(volume_id = %id, instance_id, "a detach is already in progress; waiting for it");
            }
            Some(s) => {
                if s == AttachmentState::Attaching {
                    tracing::info!(volume_id = %id, instance_id, "the volume is still attaching; waiting for it before detaching");
                    wait_for(
                        cloud.as_ref(),
                        OP,
                        &id,
                        instance_id,
                        AttachmentState::Attached,
                        deadline,
                    )
                    .await?;
                }
                let sent = cloud
                    .detach_disk(&id, instance_id)
                    .await
                    .map_err(|e| cloud_error(OP, &id, e))?;
                tracing::info!(volume_id = %id, instance_id, sent, "DetachVolume");
            }
        }
        wait_for(
            cloud.as_ref(),
            OP,
            &id,
            instance_id,
            AttachmentState::Detached,
            deadline,
        )
        .await?;
        tracing::info!(volume_id = %id, instance_id, "detached");
        Ok(true)
    }

    /// For the attach/detach controller's periodic verification: for each volume (in order),
    /// whether EC2 lists it in the instance's block device mapping (attaching, attached or
    /// detaching all count: the device may be in use). One DescribeInstances for all of them.
    ///
    /// As in Kubernetes: an instance that no longer exists has nothing attached (all false);
    /// a volume ID that cannot be read is answered `true` ("no news"), so the controller keeps
    /// what it knows instead of forgetting an attachment because of a spec it cannot parse.
    pub async fn volumes_are_attached(
        &self,
        volume_ids: &[String],
        instance_id: &str,
    ) -> Result<Vec<bool>> {
        const OP: &str = "check";
        if volume_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Option<String>> = volume_ids
            .iter()
            .map(|v| match volume_id_from_spec(v) {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::warn!(error = %e, instance_id, "cannot verify a volume it cannot read; left as attached");
                    None
                }
            })
            .collect();
        let names = || {
            let list: Vec<&str> = ids.iter().flatten().map(String::as_str).collect();
            format!("{} on instance {instance_id}", list.join(", "))
        };
        let cloud = self.cloud(OP, &names())?;
        check_instance(instance_id, &names())?;
        let instance = match cloud.get_instance(instance_id).await {
            Ok(instance) => instance,
            Err(CloudError::NotFound { .. }) => {
                tracing::info!(
                    instance_id,
                    "instance does not exist; no volume is attached to it"
                );
                return Ok(ids.iter().map(Option::is_none).collect());
            }
            Err(e) => return Err(cloud_error(OP, &names(), e)),
        };
        Ok(ids
            .iter()
            .map(|id| {
                id.as_ref()
                    .is_none_or(|id| instance.devices.iter().any(|d| &d.volume_id == id))
            })
            .collect())
    }
}

async fn attach_disk(cloud: &dyn Cloud, volume_id: &str, instance_id: &str) -> Result<String> {
    let device = cloud
        .attach_disk(volume_id, instance_id)
        .await
        .map_err(|e| cloud_error("attach", volume_id, e))?;
    tracing::info!(volume_id, instance_id, device, "AttachVolume");
    Ok(device)
}

/// Waits (until `deadline`) for the volume's attachment to the instance to be in `state`.
async fn wait_for(
    cloud: &dyn Cloud,
    operation: &'static str,
    volume_id: &str,
    instance_id: &str,
    state: AttachmentState,
    deadline: Instant,
) -> Result<Option<ebs_cloud::VolumeAttachment>> {
    cloud
        .wait_for_attachment_state(volume_id, instance_id, state, remaining(deadline))
        .await
        .map_err(|e| cloud_error(operation, volume_id, e))
}

fn check_instance(instance_id: &str, volume_id: &str) -> Result<()> {
    if instance_id.trim().is_empty() {
        return Err(Error::InvalidSpec(format!(
            "volume {volume_id}: the node has no EC2 instance ID (its spec.providerID is empty or not aws:///<zone>/i-...)"
        )));
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// A wait that ran out is this crate's [`Error::Timeout`]; anything else EC2 said is
/// [`Error::Cloud`].
fn cloud_error(operation: &'static str, volume_id: &str, source: CloudError) -> Error {
    match source {
        CloudError::Timeout { what, waited } => Error::Timeout { what, waited },
        source => Error::Cloud {
            operation,
            volume_id: volume_id.to_string(),
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws_ebs::fake_cloud::FakeCloud;

    const VOL: &str = "vol-0123456789abcdef0";
    const SPEC: &str = "aws://us-east-1a/vol-0123456789abcdef0";
    const NODE: &str = "i-0aaaaaaaaaaaaaaaa";
    const OTHER: &str = "i-0bbbbbbbbbbbbbbbb";
    const T: Duration = Duration::from_secs(5);

    fn plugin(cloud: &Arc<FakeCloud>) -> AwsEbsPlugin {
        AwsEbsPlugin::new(Some(cloud.clone() as Arc<dyn Cloud>))
    }

    #[tokio::test]
    async fn attach_returns_the_device_ec2_reports_and_is_idempotent() {
        let cloud = FakeCloud::with_instances(&[NODE, OTHER]);
        cloud.add_volume(VOL);
        let p = plugin(&cloud);
        assert!(p.has_cloud());
        let device = p.attach(SPEC, NODE, T).await.unwrap();
        assert_eq!(device, "/dev/xvdba");
        assert_eq!(cloud.attachment(VOL, NODE), Some(AttachmentState::Attached));
        // Again, with either spelling of the volume: no second AttachVolume, same device.
        assert_eq!(p.attach(SPEC, NODE, T).await.unwrap(), device);
        assert_eq!(p.attach(VOL, NODE, T).await.unwrap(), device);
        assert_eq!(cloud.calls("AttachVolume"), 1);
        // A second volume gets the next name.
        cloud.add_volume("vol-2");
        assert_eq!(p.attach("vol-2", NODE, T).await.unwrap(), "/dev/xvdbb");
    }

    #[tokio::test]
    async fn attach_waits_for_an_attach_in_progress_instead_of_sending_another() {
        let cloud = FakeCloud::with_instances(&[NODE]);
        cloud.add_volume(VOL);
        cloud.set_attachment(VOL, NODE, "/dev/xvdcz", AttachmentState::Attaching);
        let device = plugin(&cloud).attach(VOL, NODE, T).await.unwrap();
        assert_eq!(device, "/dev/xvdcz");
        assert_eq!(cloud.calls("AttachVolume"), 0);
    }

    #[tokio::test]
    async fn attach_after_a_detach_in_progress_waits_for_it_then_attaches() {
        let cloud = FakeCloud::with_instances(&[NODE]);
        cloud.add_volume(VOL);
        cloud.set_attachment(VOL, NODE, "/dev/xvdcz", AttachmentState::Detaching);
        let device = plugin(&cloud).attach(VOL, NODE, T).await.unwrap();
        assert_eq!(device, "/dev/xvdba");
        assert_eq!(cloud.calls("AttachVolume"), 1);
        assert_eq!(cloud.attachment(VOL, NODE), Some(AttachmentState::Attached));
    }

    #[tokio::test]
    async fn an_attach_that_does_not_finish_is_a_timeout_and_left_alone() {
        let cloud = FakeCloud::with_instances(&[NODE]);
        cloud.add_volume(VOL);
        cloud.set_stuck(true);
        let err = plugin(&cloud)
            .attach(VOL, NODE, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(err.to_string().contains(VOL), "{err}");
        assert_eq!(
            cloud.attachment(VOL, NODE),
            Some(AttachmentState::Attaching)
        );
        assert_eq!(cloud.calls("DetachVolume"), 0, "never undone by force");
    }

    #[tokio::test]
    async fn ec2_errors_are_cloud_errors_naming_the_operation_and_volume() {
        let cloud = FakeCloud::with_instances(&[NODE]);
        cloud.add_volume(VOL);
        cloud.fail(
            "AttachVolume",
            CloudError::AttachmentLimit {
                instance_id: NODE.into(),
                message: "no free slot".into(),
            },
        );
        let err = plugin(&cloud).attach(SPEC, NODE, T).await.unwrap_err();
        match &err {
            Error::Cloud {
                operation,
                volume_id,
                source: CloudError::AttachmentLimit { .. },
            } => {
                assert_eq!(*operation, "attach");
                assert_eq!(volume_id, VOL);
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("attach of volume {VOL}")) && msg.contains("no free slot"),
            "{msg}"
        );
        // A volume EC2 does not know.
        let err = plugin(&cloud)
            .attach("vol-missing", NODE, T)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Cloud { source, .. } if source.is_not_found()),
            "{err}"
        );
        // Detach: DetachVolume refused.
        cloud.set_attachment(VOL, NODE, "/dev/xvdba", AttachmentState::Attached);
        cloud.fail(
            "DetachVolume",
            CloudError::other("DetachVolume", "UnauthorizedOperation", "denied"),
        );
        let err = plugin(&cloud).detach(VOL, NODE, T).await.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Cloud {
                    operation: "detach",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("UnauthorizedOperation"), "{err}");
        // The periodic check: DescribeInstances failed.
        cloud.fail(
            "DescribeInstances",
            CloudError::Throttled {
                action: "DescribeInstances",
                message: "slow down".into(),
            },
        );
        let err = plugin(&cloud)
            .volumes_are_attached(&[VOL.to_string()], NODE)
            .await
            .unwrap_err();
        assert!(matches!(&err, Error::Cloud { .. }), "{err}");
        assert!(
            err.to_string().contains(VOL) && err.to_string().contains(NODE),
            "{err}"
        );
    }

    #[tokio::test]
    async fn without_a_cloud_every_operation_says_what_to_configure() {
        let p = AwsEbsPlugin::new(None);
        assert!(!p.has_cloud());
        let err = p.attach(SPEC, NODE, T).await.unwrap_err();
        assert!(
            matches!(&err, Error::NoCloud { operation: "attach", volume_id } if volume_id == VOL),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("--cloud-provider=aws")
                && msg.contains("CSIMigrationAWS")
                && msg.contains(&format!("cannot attach volume {VOL}")),
            "{msg}"
        );
        let err = p.detach(VOL, NODE, T).await.unwrap_err();
        assert!(err.to_string().contains("cannot detach volume"), "{err}");
        let err = p
            .volumes_are_attached(&[VOL.to_string()], NODE)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NoCloud { .. }), "{err}");
        // A spec that is wrong is said so first, cloud or not.
        let err = p.attach("pd-1", NODE, T).await.unwrap_err();
        assert!(matches!(err, Error::InvalidSpec(_)), "{err}");
    }

    #[tokio::test]
    async fn a_node_without_an_instance_is_an_invalid_spec() {
        let cloud = FakeCloud::with_instances(&[NODE]);
        cloud.add_volume(VOL);
        let err = plugin(&cloud).attach(VOL, "", T).await.unwrap_err();
        assert!(matches!(err, Error::InvalidSpec(_)), "{err}");
        assert!(err.to_string().contains("providerID"), "{err}");
        assert_eq!(cloud.calls("AttachVolume"), 0);
    }

    #[tokio::test]
    async fn detach_of_a_volume_not_attached_there_is_false_and_calls_nothing() {
        let cloud = FakeCloud::with_instances(&[NODE, OTHER]);
        cloud.add_volume(VOL);
        let p = plugin(&cloud);
        assert!(
            !p.detach(VOL, NODE, T).await.unwrap(),
            "not attached anywhere"
        );
        cloud.set_attachment(VOL, OTHER, "/dev/xvdba", AttachmentState::Attached);
        assert!(!p.detach(VOL, NODE, T).await.unwrap(), "attached elsewhere");
        assert!(
            !p.detach("vol-gone", NODE, T).await.unwrap(),
            "no such volume"
        );
        assert_eq!(cloud.calls("DetachVolume"), 0);
        assert_eq!(
            cloud.attachment(VOL, OTHER),
            Some(AttachmentState::Attached)
        );
    }

    #[tokio::test]
    async fn detach_detaches_and_waits_until_gone() {
        let cloud = FakeCloud::with_instances(&[NODE]);
        cloud.add_volume(VOL);
        let p = plugin(&cloud);
        p.attach(VOL, NODE, T).await.unwrap();
        assert!(p.detach(SPEC, NODE, T).await.unwrap());
        assert_eq!(cloud.attachment(VOL, NODE), None);
        assert_eq!(cloud.calls("DetachVolume"), 1);
        // Again: nothing to do.
        assert!(!p.detach(SPEC, NODE, T).await.unwrap());
        assert_eq!(cloud.calls("DetachVolume"), 1);
    }

    #[tokio::test]
    async fn detach_of_an_attaching_volume_waits_for_it_first_and_of_a_detaching_one_only_waits() {
        let cloud = FakeCloud::with_instances(&[NODE]);
        cloud.add_volume(VOL);
        cloud.set_attachment(VOL, NODE, "/dev/xvdba", AttachmentState::Attaching);
        let p = plugin(&cloud);
        assert!(p.detach(VOL, NODE, T).await.unwrap());
        assert_eq!(cloud.calls("DetachVolume"), 1);
        assert_eq!(cloud.detach_refused(), 0, "never sent while attaching");
        cloud.set_attachment(VOL, NODE, "/dev/xvdba", AttachmentState::Detaching);
        assert!(p.detach(VOL, NODE, T).await.unwrap());
        assert_eq!(cloud.calls("DetachVolume"), 1, "no second DetachVolume");
        assert_eq!(cloud.attachment(VOL, NODE), None);
    }

    #[tokio::test]
    async fn a_detach_that_does_not_finish_is_a_timeout() {
        let cloud = FakeCloud::with_instances(&[NODE]);
        cloud.add_volume(VOL);
        cloud.set_attachment(VOL, NODE, "/dev/xvdba", AttachmentState::Attached);
        cloud.set_stuck(true);
        let err = plugin(&cloud)
            .detach(VOL, NODE, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert_eq!(
            cloud.attachment(VOL, NODE),
            Some(AttachmentState::Detaching)
        );
    }

    #[tokio::test]
    async fn volumes_are_attached_follows_the_instance_mapping() {
        let cloud = FakeCloud::with_instances(&[NODE, OTHER]);
        for v in [VOL, "vol-2", "vol-3"] {
            cloud.add_volume(v);
        }
        let p = plugin(&cloud);
        p.attach(VOL, NODE, T).await.unwrap();
        p.attach("vol-3", OTHER, T).await.unwrap();
        // Still attaching counts: the device may already be in use.
        cloud.set_attachment("vol-2", NODE, "/dev/xvdbz", AttachmentState::Attaching);
        let ids: Vec<String> = [SPEC, "vol-2", "vol-3", "aws:///vol-3"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            p.volumes_are_attached(&ids, NODE).await.unwrap(),
            [true, true, false, false]
        );
        assert_eq!(
            p.volumes_are_attached(&ids, OTHER).await.unwrap(),
            [false, false, true, true]
        );
        assert_eq!(cloud.calls("DescribeInstances"), 2, "one call per check");
        // A spec that cannot be read is "no news", an instance that is gone has nothing.
        let odd = vec!["not-a-volume".to_string(), VOL.to_string()];
        assert_eq!(
            p.volumes_are_attached(&odd, NODE).await.unwrap(),
            [true, true]
        );
        assert_eq!(
            p.volumes_are_attached(&odd, "i-0ccccccccccccccccc")
                .await
                .unwrap(),
            [true, false]
        );
        assert!(p.volumes_are_attached(&[], NODE).await.unwrap().is_empty());
    }
}
