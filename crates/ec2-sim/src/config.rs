//! Configuration of one simulated EC2 region: zones, timing, backing and faults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::auth::Credentials;

/// Nitro instances share 28 attachment slots between EBS volumes, network interfaces and
/// NVMe instance-store volumes. One slot goes to the primary ENI and one to the root volume,
/// which leaves 26 for data volumes.
pub const DEFAULT_MAX_ATTACHMENTS: usize = 26;

/// The AWS-managed default EBS key, which every account has.
pub const DEFAULT_KMS_ALIAS: &str = "alias/aws/ebs";

/// Everything the simulator needs to start.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Where `state.json`, `volumes/` and `snapshots/` live.
    pub state_dir: PathBuf,
    /// Region name reported by DescribeAvailabilityZones and used in ARNs.
    pub region: String,
    /// Availability zones of the region, e.g. `us-east-1a`.
    pub zones: Vec<String>,
    /// How long state changes take.
    pub timing: Timing,
    /// What an attachment is: nothing but state (`File`) or a real loop device (`Loop`).
    pub backing: Backing,
    /// Where attachment symlinks go; `None` means `state_dir/dev`.
    pub device_dir: Option<PathBuf>,
    /// One device dir for every instance, or one per instance under `device_dir`.
    pub device_layout: DeviceLayout,
    /// Fault injection, changeable at run time with [`crate::Simulator::set_faults`].
    pub faults: Faults,
    /// Volumes attachable to one instance (see [`DEFAULT_MAX_ATTACHMENTS`]).
    pub max_attachments_per_instance: usize,
    /// KMS key IDs, ARNs or aliases that exist; any other `KmsKeyId` makes the volume vanish.
    pub kms_keys: Vec<String>,
    /// Who may call the EC2 endpoint: every request must be signed (AWS Signature Version 4)
    /// with one of these pairs. The default is the test pair `AKIDTEST` / `secret`.
    pub credentials: Credentials,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            state_dir: PathBuf::from("ec2-sim-state"),
            region: "us-east-1".to_string(),
            zones: vec![
                "us-east-1a".to_string(),
                "us-east-1b".to_string(),
                "us-east-1c".to_string(),
            ],
            timing: Timing::Fast,
            backing: Backing::File,
            device_dir: None,
            device_layout: DeviceLayout::Shared,
            faults: Faults::default(),
            max_attachments_per_instance: DEFAULT_MAX_ATTACHMENTS,
            kms_keys: vec![DEFAULT_KMS_ALIAS.to_string()],
            credentials: Credentials::default(),
        }
    }
}

impl SimConfig {
    /// The directory attachment symlinks go to.
    pub fn device_dir(&self) -> PathBuf {
        self.device_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("dev"))
    }

    /// The directory where an instance's device links appear: what the EBS driver's node
    /// service on that instance takes as `--dev-root`. The device dir itself with
    /// [`DeviceLayout::Shared`], `DEVDIR/<instance-id>` with [`DeviceLayout::PerInstance`].
    pub fn node_dev_root(&self, instance_id: &str) -> PathBuf {
        self.device_layout
            .links_dir(&self.device_dir(), instance_id)
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.region.is_empty() {
            return Err(Error::Config("region: must not be empty".into()));
        }
        if self.zones.is_empty() {
            return Err(Error::Config("zones: at least one zone is needed".into()));
        }
        for zone in &self.zones {
            if !zone.starts_with(&self.region) || zone.len() <= self.region.len() {
                return Err(Error::Config(format!(
                    "zones: '{zone}' is not a zone of region '{}' (expected e.g. '{}a')",
                    self.region, self.region
                )));
            }
        }
        if self.max_attachments_per_instance == 0 {
            return Err(Error::Config(
                "max_attachments_per_instance: must be at least 1".into(),
            ));
        }
        if self.credentials.is_empty() {
            return Err(Error::Config(
                "credentials: at least one access key is needed (nobody could call the endpoint)"
                    .into(),
            ));
        }
        self.faults.validate()
    }
}

/// How long state changes take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Timing {
    /// Every change is done by the time the call returns (unit tests).
    Instant,
    /// Tens of milliseconds: the states are observable, tests stay quick.
    Fast,
    /// AWS's published medians, jittered: create ~1.5 s, attach and detach 1-4 s.
    Realistic,
}

impl FromStr for Timing {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "instant" => Ok(Timing::Instant),
            "fast" => Ok(Timing::Fast),
            "realistic" => Ok(Timing::Realistic),
            other => Err(Error::Config(format!(
                "timing: '{other}' is not one of instant, fast, realistic"
            ))),
        }
    }
}

/// What backs an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backing {
    /// Sparse image files only; attachments are state.
    File,
    /// Sparse image files, and every attached volume is a real loop device (needs root).
    Loop,
}

impl FromStr for Backing {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "file" => Ok(Backing::File),
            "loop" => Ok(Backing::Loop),
            other => Err(Error::Config(format!(
                "backing: '{other}' is not one of file, loop"
            ))),
        }
    }
}

/// Where the device links of an attachment go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceLayout {
    /// One directory for all instances, as if they were one host: `DEVDIR/xvdba` and
    /// `DEVDIR/disk/by-id/...`. Two instances using one device name for different volumes
    /// overwrite each other's name link.
    #[default]
    Shared,
    /// One directory per instance, `DEVDIR/<instance-id>/xvdba` and
    /// `DEVDIR/<instance-id>/disk/by-id/...`, so that each instance can be a node with its own
    /// device root and device names never collide across instances.
    PerInstance,
}

impl DeviceLayout {
    /// The directory holding `instance_id`'s links under `device_dir`.
    pub(crate) fn links_dir(self, device_dir: &Path, instance_id: &str) -> PathBuf {
        match self {
            DeviceLayout::Shared => device_dir.to_path_buf(),
            DeviceLayout::PerInstance => instance_device_dir(device_dir, instance_id),
        }
    }
}

/// `device_dir/<instance-id>`: where [`DeviceLayout::PerInstance`] puts an instance's device
/// links (`xvdba`, `disk/by-id/...`), and so the `--dev-root` of that instance's node.
pub fn instance_device_dir(device_dir: &Path, instance_id: &str) -> PathBuf {
    device_dir.join(instance_id)
}

/// Fault injection knobs (JSON via `GET/PUT /_sim/faults`). Every field is optional.
///
/// ```json
/// {"throttle": [{"action": "DescribeVolumes", "rate": 0.5}, {"next": 3}],
///  "latency_ms": {"AttachVolume": 200, "*": 5},
///  "stuck_attaching": ["vol-0123456789abcdef0"], "stuck_detaching_all": true}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Throttling rules; a call is throttled when any rule matching its action fires.
    pub throttle: Vec<Throttle>,
    /// Added latency per action in milliseconds; the key `*` applies to every action.
    pub latency_ms: BTreeMap<String, u64>,
    /// Volumes whose attachments stay `attaching` while listed.
    pub stuck_attaching: Vec<String>,
    /// Every attachment stays `attaching` while set.
    pub stuck_attaching_all: bool,
    /// Volumes whose detach never finishes while listed (a `Force` detach still finishes).
    pub stuck_detaching: Vec<String>,
    /// Every detach never finishes while set (a `Force` detach still finishes).
    pub stuck_detaching_all: bool,
    /// `Backing::Loop` only: like AWS with an instance that still uses the volume, a detach
    /// stays `detaching` while its loop device is mounted (or held by a device-mapper
    /// holder); a `Force` detach still finishes.
    pub detach_waits_for_unmount: bool,
}

/// One throttling rule: `RequestLimitExceeded` (HTTP 503).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Throttle {
    /// EC2 action the rule applies to; absent or `*` means every action.
    pub action: Option<String>,
    /// Probability in 0..=1 that a matching call is throttled.
    pub rate: f64,
    /// Throttle the next N matching calls; counts down as they happen.
    pub next: u64,
}

impl Faults {
    /// Parses the Faults JSON, naming the offending field on error.
    pub fn from_json(text: &str) -> Result<Faults, Error> {
        let faults: Faults = serde_json::from_str(text)
            .map_err(|e| Error::Config(format!("faults: invalid JSON: {e}")))?;
        faults.validate()?;
        Ok(faults)
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        for (i, rule) in self.throttle.iter().enumerate() {
            if !(0.0..=1.0).contains(&rule.rate) || rule.rate.is_nan() {
                return Err(Error::Config(format!(
                    "faults.throttle[{i}].rate: {} is not within 0..=1",
                    rule.rate
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn latency_for(&self, action: &str) -> u64 {
        self.latency_ms
            .get(action)
            .or_else(|| self.latency_ms.get("*"))
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn attach_stuck(&self, volume_id: &str) -> bool {
        self.stuck_attaching_all || self.stuck_attaching.iter().any(|v| v == volume_id)
    }

    pub(crate) fn detach_stuck(&self, volume_id: &str) -> bool {
        self.stuck_detaching_all || self.stuck_detaching.iter().any(|v| v == volume_id)
    }

    /// Decides whether this call is throttled, counting down `next` budgets. `roll` is a
    /// uniform sample in 0..1.
    pub(crate) fn take_throttle(&mut self, action: &str, mut roll: impl FnMut() -> f64) -> bool {
        let mut throttled = false;
        for rule in &mut self.throttle {
            let matches = match rule.action.as_deref() {
                None | Some("*") => true,
                Some(a) => a == action,
            };
            if !matches {
                continue;
            }
            if rule.next > 0 {
                rule.next -= 1;
                throttled = true;
            } else if rule.rate > 0.0 && roll() < rule.rate {
                throttled = true;
            }
        }
        throttled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_json_round_trip_and_unknown_field() {
        let f = Faults::from_json(
            r#"{"throttle":[{"action":"DescribeVolumes","next":2}],"latency_ms":{"*":5}}"#,
        )
        .unwrap();
        assert_eq!(f.throttle[0].next, 2);
        assert_eq!(f.latency_for("CreateVolume"), 5);
        let err = Faults::from_json(r#"{"throttel":[]}"#).unwrap_err();
        assert!(err.to_string().contains("throttel"), "{err}");
        let err = Faults::from_json(r#"{"throttle":[{"rate":2.0}]}"#).unwrap_err();
        assert!(err.to_string().contains("faults.throttle[0].rate"), "{err}");
    }

    #[test]
    fn throttle_next_counts_down_per_action() {
        let mut f = Faults {
            throttle: vec![Throttle {
                action: Some("AttachVolume".into()),
                rate: 0.0,
                next: 2,
            }],
            ..Faults::default()
        };
        assert!(!f.take_throttle("DescribeVolumes", || 0.0));
        assert!(f.take_throttle("AttachVolume", || 0.0));
        assert!(f.take_throttle("AttachVolume", || 0.0));
        assert!(!f.take_throttle("AttachVolume", || 0.0));
        assert_eq!(f.throttle[0].next, 0);
    }

    #[test]
    fn node_dev_root_follows_the_layout() {
        let mut c = SimConfig {
            state_dir: PathBuf::from("/s"),
            ..SimConfig::default()
        };
        assert_eq!(c.node_dev_root("i-0123456789abcdef0"), Path::new("/s/dev"));
        c.device_layout = DeviceLayout::PerInstance;
        assert_eq!(
            c.node_dev_root("i-0123456789abcdef0"),
            Path::new("/s/dev/i-0123456789abcdef0")
        );
        c.device_dir = Some(PathBuf::from("/d"));
        assert_eq!(
            c.node_dev_root("i-0123456789abcdef0"),
            instance_device_dir(Path::new("/d"), "i-0123456789abcdef0")
        );
        assert_eq!(
            instance_device_dir(Path::new("/d"), "i-0123456789abcdef0"),
            Path::new("/d/i-0123456789abcdef0")
        );
    }

    #[test]
    fn config_rejects_foreign_zone() {
        let c = SimConfig {
            zones: vec!["eu-west-1a".into()],
            ..SimConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("zones"));
    }
}
