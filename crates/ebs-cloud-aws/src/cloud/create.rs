//! CreateVolume for a CSI name: idempotent across retries, timeouts, restarts and concurrent
//! callers, and a name whose volume was deleted gets a new one.
//!
//! EC2 makes CreateVolume idempotent through its client token, and it remembers a token after
//! the token's volume is deleted: the same call again returns the deleted volume (ec2-sim, as
//! AWS answers within the token's lifetime), or fails with IdempotentParameterMismatch when a
//! parameter differs (AWS also answers so for a deleted volume's token). A token made from the
//! name alone would therefore refuse the name forever once its volume was deleted (csi-sanity
//! creates, deletes and creates the same name; so does a create-then-delete race in a cluster).
//!
//! The decision: a name has *generations*, each with its own token
//! ([`ebs_cloud::volume_client_token`]; generation 0 is the token earlier versions used), and
//! which one is current is found again on every call, from EC2 alone (nothing stored):
//!
//! 1. A live volume carrying the name tag is the answer: it is compared with the request and
//!    waited for; no CreateVolume is sent, so no token can make a second volume beside it (also
//!    not an expired token of an older generation).
//! 2. Otherwise the generations are walked in order from 0. A token whose volume is deleted or
//!    deleting, or that EC2 refuses as a mismatch while still no live volume carries the name,
//!    belongs to a generation that is over: the next one is tried. The first token that
//!    yields a live volume, or creates one, ends the walk.
//!
//! Why two callers never make two volumes: both walk the same tokens in the same order, and a
//! generation that is over stays over (a deleted volume does not come back), so both stop at
//! the same first token that is not over; EC2 creates at most one volume per token, and the
//! second caller gets the first one's. A caller that finds the name's live volume in step 1
//! sends no CreateVolume at all. Two callers with the same name and different parameters (a
//! caller's bug) could still end on different generations if EC2's DescribeVolumes has not yet
//! shown the first one's volume when the second re-checks after its mismatch; within one
//! driver process the controller refuses a second concurrent call for a name anyway (Aborted).

use aws_sdk_ec2::types::{self, ResourceType};
use ebs_cloud::{Cloud, CloudError, Disk, DiskOptions, VOLUME_NAME_TAG, volume_client_token};

use super::{AwsCloud, Result, int32};
use crate::convert;

/// How many generations of one name are tried before giving up. Kubernetes names volumes
/// after the claim's UID, so a name is reused only by tests and by a create-then-delete race;
/// each reuse (and each retry of a create whose KMS key is unusable, which EC2 drops)
/// moves the name one generation on.
pub(crate) const MAX_NAME_GENERATIONS: u32 = 100;

/// What one CreateVolume call answered: the volume ID and its state.
struct Created {
    volume_id: String,
    state: String,
}

impl Created {
    fn gone(&self) -> bool {
        self.state == "deleting" || self.state == "deleted"
    }
}

impl AwsCloud {
    /// See the module docs.
    pub(super) async fn create_for_name(&self, name: &str, options: &DiskOptions) -> Result<Disk> {
        if let Some(live) = self.get_disk_by_name(name).await? {
            return self.adopt(name, options, live).await;
        }
        for generation in 0..MAX_NAME_GENERATIONS {
            let token = volume_client_token(name, generation);
            match self.create_volume_call(name, options, &token).await {
                Ok(c) if c.gone() => {
                    tracing::info!(
                        name,
                        generation,
                        volume_id = %c.volume_id,
                        state = %c.state,
                        "this generation's client token belongs to a deleted volume; trying the next generation"
                    );
                }
                Ok(c) => {
                    tracing::info!(name, generation, volume_id = %c.volume_id, state = %c.state, "CreateVolume");
                    return self.wait_available(name, options, &c.volume_id).await;
                }
                Err(CloudError::IdempotentParameterMismatch { .. }) => {
                    // Either a live volume of this generation has other parameters (the name is
                    // taken), or the generation's volume is gone: the name tag tells which.
                    if let Some(live) = self.get_disk_by_name(name).await? {
                        return self.adopt(name, options, live).await;
                    }
                    tracing::info!(
                        name,
                        generation,
                        "this generation's client token was used with other parameters and no live volume carries the name; trying the next generation"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        Err(CloudError::other(
            "CreateVolume",
            "NameGenerationsExhausted",
            format!(
                "the name {name} was used for {MAX_NAME_GENERATIONS} volumes that are all deleted (EC2 still remembers their client tokens); use another name"
            ),
        ))
    }

    /// The name's live volume as the answer, when it is what `options` asks for.
    async fn adopt(&self, name: &str, options: &DiskOptions, live: Disk) -> Result<Disk> {
        if let Some(why) = differs(options, &live) {
            tracing::info!(name, volume_id = %live.volume_id, why = %why, "the name's volume differs from the request");
            return Err(CloudError::IdempotentParameterMismatch {
                what: "volume",
                name: name.to_string(),
            });
        }
        if live.state == "available" || live.state == "in-use" {
            return Ok(live);
        }
        self.wait_available(name, options, &live.volume_id).await
    }

    /// One CreateVolume with `token`.
    async fn create_volume_call(
        &self,
        name: &str,
        options: &DiskOptions,
        token: &str,
    ) -> Result<Created> {
        let mut tags = options.tags.clone();
        tags.insert(VOLUME_NAME_TAG.to_string(), name.to_string());
        let size = int32("size", options.size_gib)?;
        let iops = options.iops.map(|v| int32("iops", v)).transpose()?;
        let throughput = options
            .throughput
            .map(|v| int32("throughput", v))
            .transpose()?;
        let out = self
            .ec2
            .call("CreateVolume", || {
                self.ec2
                    .client
                    .create_volume()
                    .client_token(token)
                    .availability_zone(&options.zone)
                    .size(size)
                    .volume_type(types::VolumeType::from(options.volume_type.as_str()))
                    .set_iops(iops)
                    .set_throughput(throughput)
                    .set_encrypted(options.encrypted.then_some(true))
                    .set_kms_key_id(options.kms_key_id.clone())
                    .set_snapshot_id(options.snapshot_id.clone())
                    .set_multi_attach_enabled(options.multi_attach.then_some(true))
                    .tag_specifications(convert::tag_spec(ResourceType::Volume, &tags))
                    .send()
            })
            .await
            .map_err(|f| f.into_cloud(name))?;
        let volume_id = out.volume_id().unwrap_or_default().to_string();
        if volume_id.is_empty() {
            return Err(CloudError::other(
                "CreateVolume",
                "Empty",
                "the response has no volume ID",
            ));
        }
        // `error` is not over: it is the name's volume, and the wait reports it failed.
        let state = out.state().map(|s| s.as_str()).unwrap_or("").to_string();
        Ok(Created { volume_id, state })
    }
}

/// Why a live volume of the name is not what `options` asks for, if it is not. Looser than
/// EC2's token check on purpose (a volume grown since, or with other tags, is still the name's
/// volume); the controller compares the CSI request itself before it gets here.
fn differs(options: &DiskOptions, have: &Disk) -> Option<String> {
    if have.size_gib < options.size_gib {
        return Some(format!(
            "it has {} GiB, {} GiB asked",
            have.size_gib, options.size_gib
        ));
    }
    if have.volume_type != options.volume_type {
        return Some(format!(
            "it is {}, {} asked",
            have.volume_type, options.volume_type
        ));
    }
    if have.encrypted != options.encrypted {
        return Some(format!("encrypted is {}", have.encrypted));
    }
    if have.snapshot_id != options.snapshot_id {
        return Some(format!(
            "its snapshot is {:?}, {:?} asked",
            have.snapshot_id, options.snapshot_id
        ));
    }
    if have.zone != options.zone {
        return Some(format!("it is in {}, {} asked", have.zone, options.zone));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(size: i64, zone: &str) -> Disk {
        Disk {
            volume_id: "vol-1".into(),
            size_gib: size,
            volume_type: "gp3".into(),
            zone: zone.into(),
            state: "available".into(),
            ..Disk::default()
        }
    }

    fn opts(size: i64) -> DiskOptions {
        DiskOptions {
            size_gib: size,
            volume_type: "gp3".into(),
            zone: "us-east-1a".into(),
            ..DiskOptions::default()
        }
    }

    #[test]
    fn a_live_volume_is_the_names_when_it_has_what_is_asked() {
        assert_eq!(differs(&opts(4), &disk(4, "us-east-1a")), None);
        // Grown since: still the name's volume.
        assert_eq!(differs(&opts(4), &disk(8, "us-east-1a")), None);
        for (o, d, needle) in [
            (opts(8), disk(4, "us-east-1a"), "4 GiB"),
            (opts(4), disk(4, "us-east-1b"), "us-east-1b"),
            (
                DiskOptions {
                    volume_type: "io2".into(),
                    ..opts(4)
                },
                disk(4, "us-east-1a"),
                "io2",
            ),
            (
                DiskOptions {
                    encrypted: true,
                    ..opts(4)
                },
                disk(4, "us-east-1a"),
                "encrypted",
            ),
        ] {
            let why = differs(&o, &d).unwrap();
            assert!(why.contains(needle), "{why}");
        }
    }

    #[test]
    fn only_deleting_and_deleted_end_a_generation() {
        for (state, gone) in [
            ("deleting", true),
            ("deleted", true),
            ("creating", false),
            ("available", false),
            ("in-use", false),
        ] {
            let c = Created {
                volume_id: "vol-1".into(),
                state: state.into(),
            };
            assert_eq!(c.gone(), gone, "{state}");
        }
    }
}
