//! Polling through `DescribeVolumes` until a volume reaches a state, recording the states seen
//! on the way (the timing tests assert the intermediate states, not only the end state).

use std::time::{Duration, Instant};

use aws_sdk_ec2::types::{Volume, VolumeAttachmentState, VolumeState};

use crate::Error;

/// Poll interval: short, the fast timing profile changes states within tens of milliseconds.
const POLL: Duration = Duration::from_millis(20);

/// One observation of a volume: its state and, if any, its first attachment's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub volume: Option<VolumeState>,
    pub attachment: Option<VolumeAttachmentState>,
}

/// The volume as `DescribeVolumes` reports it now; `Ok(None)` when it does not exist.
pub async fn describe_volume(
    client: &aws_sdk_ec2::Client,
    volume_id: &str,
) -> Result<Option<Volume>, Error> {
    match client.describe_volumes().volume_ids(volume_id).send().await {
        Ok(out) => Ok(out.volumes().first().cloned()),
        Err(err) => {
            let failure = crate::errors::failure(&err);
            if failure.code.as_deref() == Some("InvalidVolume.NotFound") {
                Ok(None)
            } else {
                Err(Error::Ec2 {
                    action: "DescribeVolumes".into(),
                    detail: failure.display,
                })
            }
        }
    }
}

/// Polls the volume until `done` holds for it (or for its absence), and returns the last
/// description with the distinct observations in order.
pub async fn poll_volume(
    client: &aws_sdk_ec2::Client,
    volume_id: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(Option<&Volume>) -> bool,
) -> Result<(Option<Volume>, Vec<Observed>), Error> {
    let started = Instant::now();
    let mut seen: Vec<Observed> = Vec::new();
    loop {
        let volume = describe_volume(client, volume_id).await?;
        let now = Observed {
            volume: volume.as_ref().and_then(|v| v.state().cloned()),
            attachment: volume
                .as_ref()
                .and_then(|v| v.attachments().first())
                .and_then(|a| a.state().cloned()),
        };
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        if done(volume.as_ref()) {
            return Ok((volume, seen));
        }
        if started.elapsed() > timeout {
            return Err(Error::Timeout {
                what: format!("{volume_id}: {what} (seen {seen:?})"),
                waited: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the volume is in `state`.
pub async fn volume_state(
    client: &aws_sdk_ec2::Client,
    volume_id: &str,
    state: VolumeState,
    timeout: Duration,
) -> Result<(Volume, Vec<Observed>), Error> {
    let what = format!("state {state}");
    let (volume, seen) = poll_volume(client, volume_id, timeout, &what, |v| {
        v.and_then(|v| v.state()) == Some(&state)
    })
    .await?;
    volume.map(|v| (v, seen)).ok_or_else(|| Error::Timeout {
        what: format!("{volume_id}: {what}"),
        waited: timeout,
    })
}

/// Waits until the volume has an attachment to `instance_id` in `state`.
pub async fn attachment_state(
    client: &aws_sdk_ec2::Client,
    volume_id: &str,
    instance_id: &str,
    state: VolumeAttachmentState,
    timeout: Duration,
) -> Result<(Volume, Vec<Observed>), Error> {
    let what = format!("attachment to {instance_id} {state}");
    let (volume, seen) = poll_volume(client, volume_id, timeout, &what, |v| {
        v.is_some_and(|v| {
            v.attachments()
                .iter()
                .any(|a| a.instance_id() == Some(instance_id) && a.state() == Some(&state))
        })
    })
    .await?;
    volume.map(|v| (v, seen)).ok_or_else(|| Error::Timeout {
        what: format!("{volume_id}: {what}"),
        waited: timeout,
    })
}

/// Waits until the volume has no attachment to `instance_id` any more.
pub async fn detached(
    client: &aws_sdk_ec2::Client,
    volume_id: &str,
    instance_id: &str,
    timeout: Duration,
) -> Result<(Option<Volume>, Vec<Observed>), Error> {
    poll_volume(client, volume_id, timeout, "detached", |v| {
        v.is_none_or(|v| {
            !v.attachments()
                .iter()
                .any(|a| a.instance_id() == Some(instance_id))
        })
    })
    .await
}

/// Waits until `DescribeVolumes` no longer knows the volume.
pub async fn gone(
    client: &aws_sdk_ec2::Client,
    volume_id: &str,
    timeout: Duration,
) -> Result<Vec<Observed>, Error> {
    poll_volume(client, volume_id, timeout, "gone", |v| v.is_none())
        .await
        .map(|(_, seen)| seen)
}
