//! Device names for AttachVolume. On AWS the caller picks the name, and the EBS driver design
//! (docs/design/ebs-driver.md, "Cache of used / free device names") describes how a cache of them
//! goes wrong across restarts. So the allocator keeps no cache of what is taken: every allocation
//! starts from the instance's block device mapping as DescribeInstances returns it *now*. The only
//! memory is about this process's own work, which DescribeInstances may not show yet:
//!
//! - names with an AttachVolume in flight (chosen, call not yet visible in the mapping), so two
//!   concurrent publishes to one node never pick the same name; an entry ends when the mapping
//!   shows the name, when the attach fails, or after [`IN_FLIGHT_TTL`];
//! - names that failed recently (AttachVolume said "in use", or an attach got stuck there and
//!   was undone), which are tried only when nothing else is free.
//!
//! Losing that memory in a restart is harmless: the mapping has the truth again by then.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{CloudError, Instance};

/// How long an allocated name counts as taken without showing up in the mapping. AttachVolume
/// returns within seconds; EC2's describe calls are eventually consistent, usually within a
/// second or two. Past this, the attach is known to have failed or the mapping shows it.
pub const IN_FLIGHT_TTL: Duration = Duration::from_secs(120);
/// How long a failed name is tried last.
pub const FAILED_TTL: Duration = Duration::from_secs(30 * 60);

/// `/dev/xvdba` ... `/dev/xvdzz`: 650 two-letter Linux names EC2 accepts. Single letters are
/// left to the AMI (root `xvda`, instance stores); starting at `b?` keeps clear of `xvda*`.
pub fn candidate_names() -> impl Iterator<Item = String> {
    (b'b'..=b'z')
        .flat_map(|a| (b'a'..=b'z').map(move |b| format!("/dev/xvd{}{}", a as char, b as char)))
}

/// `/dev/sdf` and `/dev/xvdf` are the same attachment point.
pub fn normalize(device: &str) -> String {
    match device.strip_prefix("/dev/sd") {
        Some(rest) => format!("/dev/xvd{rest}"),
        None if device.starts_with("/dev/") => device.to_string(),
        None => format!("/dev/{device}"),
    }
}

#[derive(Debug)]
struct InFlight {
    device: String,
    volume_id: String,
    since: Instant,
}

#[derive(Debug, Default)]
struct State {
    in_flight: HashMap<String, Vec<InFlight>>,
    failed: HashMap<String, HashMap<String, Instant>>,
}

/// Per-instance device-name allocation; see the module docs.
#[derive(Debug, Default)]
pub struct DeviceAllocator {
    state: Mutex<State>,
}

impl DeviceAllocator {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the maps are still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Picks the name for attaching `volume_id` to `instance` (as just described). The volume's
    /// current mapping entry or in-flight name is returned again, so a retried call reuses it.
    /// The name stays reserved until [`Self::release`] or the mapping shows it.
    pub fn allocate(&self, instance: &Instance, volume_id: &str) -> Result<String, CloudError> {
        if let Some(d) = instance.devices.iter().find(|d| d.volume_id == volume_id) {
            return Ok(d.device.clone());
        }
        let mut used: Vec<String> = instance
            .devices
            .iter()
            .map(|d| normalize(&d.device))
            .collect();
        if let Some(root) = &instance.root_device {
            used.push(normalize(root));
        }
        let now = Instant::now();
        let mut state = self.lock();
        let flights = state
            .in_flight
            .entry(instance.instance_id.clone())
            .or_default();
        flights
            .retain(|f| !used.contains(&f.device) && now.duration_since(f.since) < IN_FLIGHT_TTL);
        if let Some(f) = flights.iter().find(|f| f.volume_id == volume_id) {
            return Ok(f.device.clone());
        }
        used.extend(flights.iter().map(|f| f.device.clone()));
        let failed = state
            .failed
            .entry(instance.instance_id.clone())
            .or_default();
        failed.retain(|_, at| now.duration_since(*at) < FAILED_TTL);
        let free = candidate_names().filter(|n| !used.contains(n));
        let mut fallback: Vec<(Instant, String)> = Vec::new();
        let mut chosen = None;
        for name in free {
            match failed.get(&name) {
                Some(at) => fallback.push((*at, name)),
                None => {
                    chosen = Some(name);
                    break;
                }
            }
        }
        // Among failed names, the one that failed longest ago first.
        fallback.sort();
        let Some(device) = chosen.or_else(|| fallback.into_iter().next().map(|(_, n)| n)) else {
            return Err(CloudError::AttachmentLimit {
                instance_id: instance.instance_id.clone(),
                message: "no free device name is left".into(),
            });
        };
        state
            .in_flight
            .entry(instance.instance_id.clone())
            .or_default()
            .push(InFlight {
                device: device.clone(),
                volume_id: volume_id.to_string(),
                since: now,
            });
        Ok(device)
    }

    /// Ends the reservation of a name (the attach failed, or is visible in the mapping).
    pub fn release(&self, instance_id: &str, device: &str) {
        let mut state = self.lock();
        if let Some(f) = state.in_flight.get_mut(instance_id) {
            f.retain(|f| f.device != device);
        }
    }

    /// Remembers that `device` failed on the instance: it is tried last for a while.
    pub fn mark_failed(&self, instance_id: &str, device: &str) {
        let mut state = self.lock();
        if let Some(f) = state.in_flight.get_mut(instance_id) {
            f.retain(|f| f.device != device);
        }
        state
            .failed
            .entry(instance_id.to_string())
            .or_default()
            .insert(normalize(device), Instant::now());
    }

    /// Names currently reserved for in-flight attaches on the instance.
    pub fn in_flight(&self, instance_id: &str) -> Vec<String> {
        self.lock()
            .in_flight
            .get(instance_id)
            .map(|f| f.iter().map(|f| f.device.clone()).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockDevice;

    fn instance(devices: &[(&str, &str)]) -> Instance {
        Instance {
            instance_id: "i-1".into(),
            zone: "us-east-1a".into(),
            state: "running".into(),
            root_device: Some("/dev/xvda".into()),
            devices: devices
                .iter()
                .map(|(d, v)| BlockDevice {
                    device: d.to_string(),
                    volume_id: v.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn names_are_valid_and_distinct() {
        let names: Vec<String> = candidate_names().collect();
        assert_eq!(names.len(), 25 * 26);
        assert_eq!(names[0], "/dev/xvdba");
        assert_eq!(names.last().map(String::as_str), Some("/dev/xvdzz"));
        let mut sorted = names.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
    }

    #[test]
    fn skips_names_in_the_mapping_and_in_flight() {
        let a = DeviceAllocator::new();
        let i = instance(&[("/dev/xvdba", "vol-a"), ("/dev/sdbb", "vol-b")]);
        assert_eq!(a.allocate(&i, "vol-c").unwrap(), "/dev/xvdbc");
        // A second volume while the first attach is in flight gets another name.
        assert_eq!(a.allocate(&i, "vol-d").unwrap(), "/dev/xvdbd");
        // The same volume again gets its reserved name.
        assert_eq!(a.allocate(&i, "vol-c").unwrap(), "/dev/xvdbc");
        // Already in the mapping: that name.
        assert_eq!(a.allocate(&i, "vol-b").unwrap(), "/dev/sdbb");
        a.release("i-1", "/dev/xvdbc");
        assert_eq!(a.allocate(&i, "vol-e").unwrap(), "/dev/xvdbc");
    }

    #[test]
    fn a_fresh_allocator_trusts_the_mapping_only() {
        // "Restart": nothing in memory, the mapping is the truth.
        let i = instance(&[("/dev/xvdba", "vol-a"), ("/dev/xvdbb", "vol-b")]);
        assert_eq!(
            DeviceAllocator::new().allocate(&i, "vol-c").unwrap(),
            "/dev/xvdbc"
        );
    }

    #[test]
    fn failed_names_come_last() {
        let a = DeviceAllocator::new();
        let i = instance(&[]);
        a.mark_failed("i-1", "/dev/xvdba");
        assert_eq!(a.allocate(&i, "vol-a").unwrap(), "/dev/xvdbb");
        // When every other name is taken, the failed one is used after all.
        let all: Vec<(String, String)> = candidate_names()
            .filter(|n| n != "/dev/xvdba")
            .enumerate()
            .map(|(k, n)| (n, format!("vol-{k}")))
            .collect();
        let refs: Vec<(&str, &str)> = all.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let full = instance(&refs);
        assert_eq!(a.allocate(&full, "vol-x").unwrap(), "/dev/xvdba");
        let err = a.allocate(&full, "vol-y").unwrap_err();
        assert!(matches!(err, CloudError::AttachmentLimit { .. }), "{err}");
    }

    #[test]
    fn normalize_maps_sd_to_xvd() {
        assert_eq!(normalize("/dev/sdf"), "/dev/xvdf");
        assert_eq!(normalize("/dev/xvdba"), "/dev/xvdba");
        assert_eq!(normalize("xvdf"), "/dev/xvdf");
    }
}
