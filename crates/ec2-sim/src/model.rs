//! The simulated cloud: volumes, instances, snapshots, modifications and client tokens.
//!
//! States are stored as timestamps ("available at", "attached at", ...) and derived on read,
//! so a restart computes the same states; `settle` applies the transitions that have side
//! effects (removals, growth) and reports them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{Faults, Timing};
use crate::ids;

/// The whole persisted state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Cloud {
    pub(crate) volumes: BTreeMap<String, Volume>,
    pub(crate) instances: BTreeMap<String, Instance>,
    pub(crate) snapshots: BTreeMap<String, Snapshot>,
    /// Latest modification per volume ID.
    pub(crate) modifications: BTreeMap<String, Modification>,
    /// `Action/ClientToken` -> what that call created.
    pub(crate) tokens: BTreeMap<String, Token>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Volume {
    pub(crate) id: String,
    pub(crate) size_gib: u64,
    pub(crate) snapshot_id: Option<String>,
    pub(crate) zone: String,
    pub(crate) volume_type: String,
    pub(crate) iops: Option<u32>,
    pub(crate) throughput: Option<u32>,
    pub(crate) encrypted: bool,
    pub(crate) kms_key_id: Option<String>,
    pub(crate) multi_attach: bool,
    pub(crate) tags: Vec<(String, String)>,
    pub(crate) create_ms: u64,
    /// `creating` until then.
    pub(crate) available_ms: u64,
    /// The KMS key did not exist: the volume disappears at `available_ms`.
    pub(crate) vanishes: bool,
    /// `deleting` until then, then gone.
    pub(crate) deleted_ms: Option<u64>,
    /// Set when the instance of a DeleteOnTermination attachment terminates: once the
    /// volume has no attachment left it is deleted, taking this many milliseconds.
    #[serde(default)]
    pub(crate) delete_when_detached: Option<u64>,
    pub(crate) attachments: Vec<Attachment>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AttachState {
    Attaching,
    Attached,
    Detaching,
}

impl AttachState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AttachState::Attaching => "attaching",
            AttachState::Attached => "attached",
            AttachState::Detaching => "detaching",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Attachment {
    pub(crate) instance_id: String,
    pub(crate) device: String,
    pub(crate) state: AttachState,
    pub(crate) attach_ms: u64,
    /// When the current transition (attaching or detaching) completes.
    pub(crate) done_ms: u64,
    /// A forced detach ignores the "detach never finishes" fault.
    pub(crate) force: bool,
    pub(crate) delete_on_termination: bool,
    /// Detached before it was ever attached: no device ever appeared for it.
    #[serde(default)]
    pub(crate) never_attached: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Instance {
    pub(crate) id: String,
    pub(crate) reservation_id: String,
    pub(crate) zone: String,
    pub(crate) image_id: String,
    pub(crate) instance_type: String,
    pub(crate) launch_ms: u64,
    pub(crate) running_ms: u64,
    /// TerminateInstances time and when shutting-down becomes terminated.
    pub(crate) terminate: Option<(u64, u64)>,
    pub(crate) tags: Vec<(String, String)>,
}

impl Instance {
    /// (code, name) as in EC2's InstanceState.
    pub(crate) fn state(&self, now: u64) -> (u32, &'static str) {
        match self.terminate {
            Some((_, done)) if now >= done => (48, "terminated"),
            Some(_) => (32, "shutting-down"),
            None if now >= self.running_ms => (16, "running"),
            None => (0, "pending"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) id: String,
    pub(crate) volume_id: String,
    pub(crate) volume_size: u64,
    pub(crate) description: String,
    pub(crate) start_ms: u64,
    pub(crate) completed_ms: u64,
    pub(crate) encrypted: bool,
    pub(crate) kms_key_id: Option<String>,
    pub(crate) tags: Vec<(String, String)>,
}

impl Snapshot {
    pub(crate) fn status(&self, now: u64) -> &'static str {
        if now >= self.completed_ms {
            "completed"
        } else {
            "pending"
        }
    }

    pub(crate) fn progress(&self, now: u64) -> u64 {
        if now >= self.completed_ms {
            return 100;
        }
        let total = self.completed_ms.saturating_sub(self.start_ms).max(1);
        (now.saturating_sub(self.start_ms) * 100 / total).min(99)
    }
}

/// The attributes ModifyVolume can change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct VolumeShape {
    pub(crate) size_gib: u64,
    pub(crate) volume_type: String,
    pub(crate) iops: Option<u32>,
    pub(crate) throughput: Option<u32>,
    pub(crate) multi_attach: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Modification {
    pub(crate) volume_id: String,
    pub(crate) original: VolumeShape,
    pub(crate) target: VolumeShape,
    pub(crate) start_ms: u64,
    /// `modifying` until then; the new shape takes effect here (the image file grows).
    pub(crate) optimizing_ms: u64,
    /// `optimizing` until then, `completed` after.
    pub(crate) completed_ms: u64,
    /// Whether the target shape has been applied to the volume.
    pub(crate) applied: bool,
}

impl Modification {
    pub(crate) fn state(&self, now: u64) -> &'static str {
        if now >= self.completed_ms {
            "completed"
        } else if now >= self.optimizing_ms {
            "optimizing"
        } else {
            "modifying"
        }
    }

    pub(crate) fn progress(&self, now: u64) -> u64 {
        if now >= self.completed_ms {
            return 100;
        }
        let total = self.completed_ms.saturating_sub(self.start_ms).max(1);
        (now.saturating_sub(self.start_ms) * 100 / total).min(99)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Token {
    pub(crate) fingerprint: String,
    /// IDs created by the first call (one volume, or the instances of a reservation).
    pub(crate) ids: Vec<String>,
    /// The volume as first created, to answer a retry after it is gone.
    pub(crate) volume: Option<Volume>,
}

impl Volume {
    /// EC2's volume `status`.
    pub(crate) fn status(&self, now: u64) -> &'static str {
        if self.deleted_ms.is_some() {
            "deleting"
        } else if now < self.available_ms || self.vanishes {
            "creating"
        } else if self.attachments.is_empty() {
            "available"
        } else {
            "in-use"
        }
    }

    pub(crate) fn shape(&self) -> VolumeShape {
        VolumeShape {
            size_gib: self.size_gib,
            volume_type: self.volume_type.clone(),
            iops: self.iops,
            throughput: self.throughput,
            multi_attach: self.multi_attach,
        }
    }
}

/// Side effects of state transitions, carried out by the backing store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// The volume is gone: remove its image.
    VolumeGone(String),
    /// The volume's image must be at least this many GiB.
    Grow(String, u64),
}

/// How long each state change takes under a timing profile.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    Create,
    Delete,
    Attach,
    Detach,
    Snapshot,
    Modifying,
    Optimizing,
    Boot,
    Shutdown,
}

/// Duration of one step in milliseconds. Realistic values are AWS's published medians where
/// there are any (create ~1.5 s, attach and detach 1-4 s), jittered uniformly.
pub(crate) fn duration_ms(timing: Timing, step: Step) -> u64 {
    let (fast, lo, hi) = match step {
        Step::Create => (30, 1_000, 2_000),
        Step::Delete => (10, 500, 1_500),
        Step::Attach => (30, 1_000, 4_000),
        Step::Detach => (30, 1_000, 4_000),
        Step::Snapshot => (60, 5_000, 15_000),
        Step::Modifying => (20, 2_000, 5_000),
        Step::Optimizing => (40, 10_000, 20_000),
        Step::Boot => (20, 5_000, 10_000),
        Step::Shutdown => (20, 5_000, 10_000),
    };
    match timing {
        Timing::Instant => 0,
        Timing::Fast => fast,
        Timing::Realistic => lo + ids::next_u64() % (hi - lo + 1),
    }
}

impl Cloud {
    /// Applies every transition due at `now` and returns their side effects. Returns whether
    /// anything changed via the effects list or the `changed` flag.
    #[cfg(test)]
    pub(crate) fn settle(&mut self, now: u64, faults: &Faults) -> (bool, Vec<Effect>) {
        self.settle_with(now, faults, &std::collections::BTreeSet::new())
    }

    /// Like `settle`; a detach of a volume in `busy` (its device is still mounted) does not
    /// finish unless forced.
    pub(crate) fn settle_with(
        &mut self,
        now: u64,
        faults: &Faults,
        busy: &std::collections::BTreeSet<String>,
    ) -> (bool, Vec<Effect>) {
        let mut changed = false;
        let mut effects = Vec::new();

        // Modifications take effect when they reach `optimizing`.
        for m in self.modifications.values_mut() {
            if !m.applied && now >= m.optimizing_ms {
                m.applied = true;
                changed = true;
                if let Some(v) = self.volumes.get_mut(&m.volume_id) {
                    v.size_gib = m.target.size_gib;
                    v.volume_type = m.target.volume_type.clone();
                    v.iops = m.target.iops;
                    v.throughput = m.target.throughput;
                    v.multi_attach = m.target.multi_attach;
                    effects.push(Effect::Grow(v.id.clone(), v.size_gib));
                }
            }
        }

        let mut gone = Vec::new();
        for v in self.volumes.values_mut() {
            if v.vanishes && now >= v.available_ms {
                gone.push(v.id.clone());
                continue;
            }
            if let Some(t) = v.deleted_ms {
                if now >= t {
                    gone.push(v.id.clone());
                    continue;
                }
            }
            if v.attachments.is_empty() {
                continue;
            }
            let id = &v.id;
            let before = v.attachments.len();
            v.attachments.retain(|a| {
                !(a.state == AttachState::Detaching
                    && now >= a.done_ms
                    && (a.force || !(faults.detach_stuck(id) || busy.contains(id))))
            });
            if v.attachments.len() != before {
                changed = true;
                if let (true, Some(delay)) = (v.attachments.is_empty(), v.delete_when_detached) {
                    v.deleted_ms = Some(now + delay);
                }
            }
            for a in &mut v.attachments {
                if a.state == AttachState::Attaching && now >= a.done_ms && !faults.attach_stuck(id)
                {
                    a.state = AttachState::Attached;
                    changed = true;
                }
            }
        }
        for id in gone {
            self.volumes.remove(&id);
            self.modifications.remove(&id);
            effects.push(Effect::VolumeGone(id));
            changed = true;
        }
        (changed, effects)
    }

    /// Attachments of an instance that occupy a device name or a slot.
    pub(crate) fn attachments_of<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> impl Iterator<Item = (&'a Volume, &'a Attachment)> + 'a {
        self.volumes.values().flat_map(move |v| {
            v.attachments
                .iter()
                .filter(move |a| a.instance_id == instance_id)
                .map(move |a| (v, a))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(id: &str) -> Volume {
        Volume {
            id: id.into(),
            size_gib: 1,
            snapshot_id: None,
            zone: "us-east-1a".into(),
            volume_type: "gp3".into(),
            iops: Some(3000),
            throughput: Some(125),
            encrypted: false,
            kms_key_id: None,
            multi_attach: false,
            tags: vec![],
            create_ms: 100,
            available_ms: 200,
            vanishes: false,
            deleted_ms: None,
            delete_when_detached: None,
            attachments: vec![],
        }
    }

    #[test]
    fn volume_status_follows_time() {
        let mut v = volume("vol-1");
        assert_eq!(v.status(150), "creating");
        assert_eq!(v.status(200), "available");
        v.attachments.push(Attachment {
            instance_id: "i-1".into(),
            device: "/dev/xvdba".into(),
            state: AttachState::Attaching,
            attach_ms: 300,
            done_ms: 400,
            force: false,
            delete_on_termination: false,
            never_attached: false,
        });
        assert_eq!(v.status(350), "in-use");
    }

    #[test]
    fn settle_attaches_detaches_and_honours_faults() {
        let mut c = Cloud::default();
        let mut v = volume("vol-1");
        v.attachments.push(Attachment {
            instance_id: "i-1".into(),
            device: "/dev/xvdba".into(),
            state: AttachState::Attaching,
            attach_ms: 300,
            done_ms: 400,
            force: false,
            delete_on_termination: false,
            never_attached: false,
        });
        c.volumes.insert(v.id.clone(), v);
        let stuck = Faults {
            stuck_attaching: vec!["vol-1".into()],
            stuck_detaching_all: true,
            ..Faults::default()
        };
        c.settle(500, &stuck);
        assert_eq!(
            c.volumes["vol-1"].attachments[0].state,
            AttachState::Attaching
        );
        c.settle(500, &Faults::default());
        assert_eq!(
            c.volumes["vol-1"].attachments[0].state,
            AttachState::Attached
        );

        let a = &mut c.volumes.get_mut("vol-1").unwrap().attachments[0];
        a.state = AttachState::Detaching;
        a.done_ms = 600;
        c.settle(700, &stuck);
        assert_eq!(c.volumes["vol-1"].attachments.len(), 1, "detach is stuck");
        c.volumes.get_mut("vol-1").unwrap().attachments[0].force = true;
        c.settle(700, &stuck);
        assert!(c.volumes["vol-1"].attachments.is_empty(), "force wins");
    }

    #[test]
    fn busy_device_holds_detach_unless_forced() {
        let mut c = Cloud::default();
        let mut v = volume("vol-3");
        v.attachments.push(Attachment {
            instance_id: "i-1".into(),
            device: "/dev/xvdba".into(),
            state: AttachState::Detaching,
            attach_ms: 0,
            done_ms: 10,
            force: false,
            delete_on_termination: false,
            never_attached: false,
        });
        c.volumes.insert(v.id.clone(), v);
        let busy: std::collections::BTreeSet<String> = ["vol-3".to_string()].into();
        c.settle_with(100, &Faults::default(), &busy);
        assert_eq!(c.volumes["vol-3"].attachments.len(), 1);
        c.settle_with(100, &Faults::default(), &Default::default());
        assert!(c.volumes["vol-3"].attachments.is_empty());
    }

    #[test]
    fn vanishing_volume_is_removed_with_effect() {
        let mut c = Cloud::default();
        let mut v = volume("vol-2");
        v.vanishes = true;
        c.volumes.insert(v.id.clone(), v);
        assert_eq!(c.volumes["vol-2"].status(500), "creating");
        let (_, effects) = c.settle(500, &Faults::default());
        assert_eq!(effects, vec![Effect::VolumeGone("vol-2".into())]);
        assert!(c.volumes.is_empty());
    }

    #[test]
    fn snapshot_and_modification_progress() {
        let s = Snapshot {
            id: "snap-1".into(),
            volume_id: "vol-1".into(),
            volume_size: 1,
            description: String::new(),
            start_ms: 0,
            completed_ms: 100,
            encrypted: false,
            kms_key_id: None,
            tags: vec![],
        };
        assert_eq!((s.status(50), s.progress(50)), ("pending", 50));
        assert_eq!((s.status(100), s.progress(100)), ("completed", 100));
        let m = Modification {
            volume_id: "vol-1".into(),
            original: volume("vol-1").shape(),
            target: volume("vol-1").shape(),
            start_ms: 0,
            optimizing_ms: 10,
            completed_ms: 20,
            applied: false,
        };
        assert_eq!(m.state(5), "modifying");
        assert_eq!(m.state(15), "optimizing");
        assert_eq!(m.state(20), "completed");
    }
}
