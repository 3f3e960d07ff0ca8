//! The attachment history: every change of an attachment's state as clients could see it,
//! kept in memory (bounded), so a test can prove after the fact that no volume was ever held
//! by two instances at once (or when it was).
//!
//! Changes are found by comparing the cloud with what was seen last, after every action and
//! every time-driven tick, rather than at each place that edits attachments: AttachVolume,
//! DetachVolume, RunInstances' launch mappings, TerminateInstances and the transitions all
//! land in the record without each having to remember to.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Serialize;

use crate::model::{AttachState, Cloud};

/// How many changes the record keeps; older ones are dropped (and counted) beyond it. A
/// change is about 100 bytes, so this is a few MB at most.
pub const HISTORY_CAPACITY: usize = 50_000;

/// An attachment's state in the record: EC2's three plus `detached` (the attachment is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachmentState {
    Attaching,
    Attached,
    Detaching,
    Detached,
}

impl AttachmentState {
    /// Whether the instance holds the volume in this state: from the AttachVolume that made
    /// the attachment until its detach finished, as AWS counts a volume `in-use`.
    pub fn holds(self) -> bool {
        self != AttachmentState::Detached
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AttachmentState::Attaching => "attaching",
            AttachmentState::Attached => "attached",
            AttachmentState::Detaching => "detaching",
            AttachmentState::Detached => "detached",
        }
    }
}

impl From<AttachState> for AttachmentState {
    fn from(s: AttachState) -> Self {
        match s {
            AttachState::Attaching => AttachmentState::Attaching,
            AttachState::Attached => AttachmentState::Attached,
            AttachState::Detaching => AttachmentState::Detaching,
        }
    }
}

/// One change of one attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentEvent {
    /// Position in the record, from 0 at the simulator's start (gaps: dropped changes).
    pub seq: u64,
    /// Milliseconds since the Unix epoch when the simulator saw the change.
    pub at_ms: u64,
    pub volume_id: String,
    pub instance_id: String,
    pub state: AttachmentState,
    /// The volume is io1/io2 Multi-Attach, so several holders are allowed.
    pub multi_attach: bool,
    /// `detached` only: the detach finished while the volume's device was still mounted or
    /// held on the host (an instance still using it). A stack that unmounts before it
    /// detaches never does this; with `detach_waits_for_unmount` the simulator holds such a
    /// detach back instead (unless forced).
    pub device_in_use: bool,
}

/// A moment a volume was held by more than one instance: right after event `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MultiHolder {
    pub seq: u64,
    pub at_ms: u64,
    pub volume_id: String,
    /// The holders then, sorted.
    pub instances: Vec<String>,
    pub multi_attach: bool,
}

/// An AttachVolume refused with `VolumeInUse` because other instances held the volume: a
/// caller asked for a second attachment (a retry for the instance that already holds it is
/// not one of these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusedAttach {
    pub at_ms: u64,
    pub volume_id: String,
    /// The instance the call asked for.
    pub instance_id: String,
    /// The instances holding the volume then.
    pub held_by: Vec<String>,
}

/// A copy of the record.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentHistory {
    /// Oldest first.
    pub events: Vec<AttachmentEvent>,
    /// Changes dropped from the front because the record was full; a non-zero count means
    /// [`AttachmentHistory::multi_holders`] may miss holders that started before the record.
    pub dropped: u64,
    /// Second attachments asked for and refused, oldest first (bounded like `events`).
    pub refused: Vec<RefusedAttach>,
}

impl AttachmentHistory {
    /// Every moment a volume was held (attaching, attached or detaching) by more than one
    /// instance, in order; one entry per change that left it so.
    pub fn multi_holders(&self) -> Vec<MultiHolder> {
        let mut holders: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        let mut found = Vec::new();
        for e in &self.events {
            let set = holders.entry(e.volume_id.as_str()).or_default();
            if e.state.holds() {
                set.insert(e.instance_id.as_str());
            } else {
                set.remove(e.instance_id.as_str());
            }
            if set.len() > 1 {
                found.push(MultiHolder {
                    seq: e.seq,
                    at_ms: e.at_ms,
                    volume_id: e.volume_id.clone(),
                    instances: set.iter().map(|s| s.to_string()).collect(),
                    multi_attach: e.multi_attach,
                });
            }
        }
        found
    }

    /// [`AttachmentHistory::multi_holders`] of volumes that are not Multi-Attach: what AWS
    /// never allows and what a correct attach/detach stack never even asks for.
    pub fn double_attachments(&self) -> Vec<MultiHolder> {
        self.multi_holders()
            .into_iter()
            .filter(|m| !m.multi_attach)
            .collect()
    }

    /// The detaches that finished while the device was still mounted or held.
    pub fn detached_while_in_use(&self) -> Vec<&AttachmentEvent> {
        self.events.iter().filter(|e| e.device_in_use).collect()
    }

    /// The changes of one volume, oldest first.
    pub fn of_volume<'a>(
        &'a self,
        volume_id: &'a str,
    ) -> impl Iterator<Item = &'a AttachmentEvent> {
        self.events.iter().filter(move |e| e.volume_id == volume_id)
    }
}

/// The live record inside the engine.
#[derive(Debug, Default)]
pub(crate) struct AttachmentLog {
    /// volume -> instance -> state, as last seen (nested so a lookup needs no key copies).
    seen: BTreeMap<String, BTreeMap<String, AttachState>>,
    events: VecDeque<AttachmentEvent>,
    refused: VecDeque<RefusedAttach>,
    next_seq: u64,
    dropped: u64,
    capacity: usize,
}

impl AttachmentLog {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            ..Self::default()
        }
    }

    /// Records every attachment whose state differs from what was seen last, and every
    /// attachment that is gone (`mounted`: volumes whose device was in use when their detach
    /// came due). Allocates nothing when nothing changed (it runs every tick).
    pub(crate) fn observe(&mut self, cloud: &Cloud, now: u64, mounted: &BTreeSet<String>) {
        let mut changes = Vec::new();
        for v in cloud.volumes.values() {
            for a in &v.attachments {
                let last = self
                    .seen
                    .get(v.id.as_str())
                    .and_then(|m| m.get(a.instance_id.as_str()));
                if last != Some(&a.state) {
                    changes.push((
                        v.id.clone(),
                        a.instance_id.clone(),
                        a.state.into(),
                        v.multi_attach,
                    ));
                }
            }
        }
        let seen: usize = self.seen.values().map(BTreeMap::len).sum();
        let stale = seen + changes.iter().filter(|c| !self.knows(&c.0, &c.1)).count()
            != attachment_count(cloud);
        if stale {
            for (vol, insts) in &self.seen {
                for inst in insts.keys() {
                    if !present(cloud, vol, inst) {
                        // A deleted volume's flag is no longer known; it is released either way.
                        let multi = cloud.volumes.get(vol).is_some_and(|v| v.multi_attach);
                        changes.push((vol.clone(), inst.clone(), AttachmentState::Detached, multi));
                    }
                }
            }
        }
        for (vol, inst, state, multi) in changes {
            let in_use = state == AttachmentState::Detached && mounted.contains(&vol);
            self.push(now, &vol, &inst, state, multi, in_use);
            match state {
                AttachmentState::Detached => {
                    if let Some(m) = self.seen.get_mut(&vol) {
                        m.remove(&inst);
                        if m.is_empty() {
                            self.seen.remove(&vol);
                        }
                    }
                }
                AttachmentState::Attaching => self.remember(vol, inst, AttachState::Attaching),
                AttachmentState::Attached => self.remember(vol, inst, AttachState::Attached),
                AttachmentState::Detaching => self.remember(vol, inst, AttachState::Detaching),
            }
        }
    }

    fn knows(&self, volume_id: &str, instance_id: &str) -> bool {
        self.seen
            .get(volume_id)
            .is_some_and(|m| m.contains_key(instance_id))
    }

    fn remember(&mut self, volume_id: String, instance_id: String, state: AttachState) {
        self.seen
            .entry(volume_id)
            .or_default()
            .insert(instance_id, state);
    }

    fn push(
        &mut self,
        now: u64,
        volume_id: &str,
        instance_id: &str,
        state: AttachmentState,
        multi_attach: bool,
        device_in_use: bool,
    ) {
        if self.events.len() >= self.capacity {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(AttachmentEvent {
            seq: self.next_seq,
            at_ms: now,
            volume_id: volume_id.to_string(),
            instance_id: instance_id.to_string(),
            state,
            multi_attach,
            device_in_use,
        });
        self.next_seq += 1;
    }

    /// Records an AttachVolume refused because `held_by` (other instances) hold the volume.
    pub(crate) fn refused(
        &mut self,
        now: u64,
        volume_id: &str,
        instance_id: &str,
        held_by: Vec<String>,
    ) {
        if self.refused.len() >= self.capacity {
            self.refused.pop_front();
        }
        self.refused.push_back(RefusedAttach {
            at_ms: now,
            volume_id: volume_id.to_string(),
            instance_id: instance_id.to_string(),
            held_by,
        });
    }

    pub(crate) fn snapshot(&self) -> AttachmentHistory {
        AttachmentHistory {
            events: self.events.iter().cloned().collect(),
            dropped: self.dropped,
            refused: self.refused.iter().cloned().collect(),
        }
    }
}

fn attachment_count(cloud: &Cloud) -> usize {
    cloud.volumes.values().map(|v| v.attachments.len()).sum()
}

fn present(cloud: &Cloud, volume_id: &str, instance_id: &str) -> bool {
    cloud
        .volumes
        .get(volume_id)
        .is_some_and(|v| v.attachments.iter().any(|a| a.instance_id == instance_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Attachment, Volume};

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn volume(id: &str, multi_attach: bool) -> Volume {
        Volume {
            id: id.into(),
            size_gib: 1,
            snapshot_id: None,
            zone: "us-east-1a".into(),
            volume_type: "io2".into(),
            iops: Some(100),
            throughput: None,
            encrypted: false,
            kms_key_id: None,
            multi_attach,
            tags: vec![],
            create_ms: 0,
            available_ms: 0,
            vanishes: false,
            deleted_ms: None,
            delete_when_detached: None,
            attachments: vec![],
        }
    }

    fn attachment(instance: &str, state: AttachState) -> Attachment {
        Attachment {
            instance_id: instance.into(),
            device: "/dev/xvdba".into(),
            state,
            attach_ms: 0,
            done_ms: 0,
            force: false,
            delete_on_termination: false,
            never_attached: false,
        }
    }

    fn states(h: &AttachmentHistory) -> Vec<(u64, &str, &str, &str)> {
        h.events
            .iter()
            .map(|e| {
                (
                    e.at_ms,
                    e.volume_id.as_str(),
                    e.instance_id.as_str(),
                    e.state.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn records_each_change_once_and_the_end_of_an_attachment() {
        let mut cloud = Cloud::default();
        let mut log = AttachmentLog::new(100);
        cloud.volumes.insert("vol-1".into(), volume("vol-1", false));
        log.observe(&cloud, 1, &none());
        assert!(log.snapshot().events.is_empty());
        let v = cloud.volumes.get_mut("vol-1").unwrap();
        v.attachments
            .push(attachment("i-1", AttachState::Attaching));
        log.observe(&cloud, 2, &none());
        log.observe(&cloud, 3, &none());
        cloud.volumes.get_mut("vol-1").unwrap().attachments[0].state = AttachState::Attached;
        log.observe(&cloud, 4, &none());
        cloud.volumes.get_mut("vol-1").unwrap().attachments[0].state = AttachState::Detaching;
        log.observe(&cloud, 5, &none());
        cloud.volumes.get_mut("vol-1").unwrap().attachments.clear();
        log.observe(&cloud, 6, &none());
        log.observe(&cloud, 7, &none());
        let h = log.snapshot();
        assert_eq!(
            states(&h),
            vec![
                (2, "vol-1", "i-1", "attaching"),
                (4, "vol-1", "i-1", "attached"),
                (5, "vol-1", "i-1", "detaching"),
                (6, "vol-1", "i-1", "detached"),
            ]
        );
        assert_eq!(
            h.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert!(h.multi_holders().is_empty());
    }

    #[test]
    fn a_detach_under_a_mounted_device_is_marked() {
        let mut cloud = Cloud::default();
        let mut log = AttachmentLog::new(100);
        for id in ["vol-1", "vol-2"] {
            let mut v = volume(id, false);
            v.attachments
                .push(attachment("i-1", AttachState::Detaching));
            cloud.volumes.insert(id.into(), v);
        }
        log.observe(&cloud, 1, &none());
        for v in cloud.volumes.values_mut() {
            v.attachments.clear();
        }
        // vol-1's device was still mounted when its detach came due.
        log.observe(&cloud, 2, &["vol-1".to_string()].into());
        let h = log.snapshot();
        let marked: Vec<(&str, &str)> = h
            .detached_while_in_use()
            .iter()
            .map(|e| (e.volume_id.as_str(), e.state.as_str()))
            .collect();
        assert_eq!(marked, vec![("vol-1", "detached")]);
        assert!(
            h.events
                .iter()
                .filter(|e| e.seq < 2)
                .all(|e| !e.device_in_use)
        );
    }

    #[test]
    fn a_deleted_volume_ends_its_attachments() {
        let mut cloud = Cloud::default();
        let mut log = AttachmentLog::new(100);
        let mut v = volume("vol-1", false);
        v.attachments.push(attachment("i-1", AttachState::Attached));
        cloud.volumes.insert("vol-1".into(), v);
        log.observe(&cloud, 1, &none());
        cloud.volumes.clear();
        log.observe(&cloud, 2, &none());
        assert_eq!(
            states(&log.snapshot()),
            vec![
                (1, "vol-1", "i-1", "attached"),
                (2, "vol-1", "i-1", "detached")
            ]
        );
    }

    #[test]
    fn a_move_is_no_double_attachment_but_an_overlap_is() {
        let mut cloud = Cloud::default();
        let mut log = AttachmentLog::new(100);
        cloud.volumes.insert("vol-1".into(), volume("vol-1", false));
        fn atts(c: &mut Cloud) -> &mut Vec<Attachment> {
            &mut c.volumes.get_mut("vol-1").unwrap().attachments
        }
        // i-1 → i-2 with the detach finished first: held by one at a time.
        atts(&mut cloud).push(attachment("i-1", AttachState::Attached));
        log.observe(&cloud, 1, &none());
        atts(&mut cloud)[0].state = AttachState::Detaching;
        log.observe(&cloud, 2, &none());
        atts(&mut cloud).clear();
        log.observe(&cloud, 3, &none());
        atts(&mut cloud).push(attachment("i-2", AttachState::Attaching));
        log.observe(&cloud, 4, &none());
        assert!(log.snapshot().double_attachments().is_empty());
        // i-3 attaching while i-2 still holds it (even in `attaching`): a double attachment.
        atts(&mut cloud).push(attachment("i-3", AttachState::Attaching));
        log.observe(&cloud, 5, &none());
        atts(&mut cloud).retain(|a| a.instance_id != "i-2");
        log.observe(&cloud, 6, &none());
        let found = log.snapshot().double_attachments();
        assert_eq!(
            found,
            vec![MultiHolder {
                seq: 4,
                at_ms: 5,
                volume_id: "vol-1".into(),
                instances: vec!["i-2".into(), "i-3".into()],
                multi_attach: false,
            }]
        );
    }

    #[test]
    fn multi_attach_volumes_are_reported_apart() {
        let mut cloud = Cloud::default();
        let mut log = AttachmentLog::new(100);
        let mut v = volume("vol-m", true);
        v.attachments.push(attachment("i-1", AttachState::Attached));
        v.attachments
            .push(attachment("i-2", AttachState::Attaching));
        cloud.volumes.insert("vol-m".into(), v);
        log.observe(&cloud, 1, &none());
        let h = log.snapshot();
        assert_eq!(h.multi_holders().len(), 1);
        assert!(h.multi_holders()[0].multi_attach);
        assert!(h.double_attachments().is_empty());
        assert_eq!(h.of_volume("vol-m").count(), 2);
    }

    #[test]
    fn the_record_is_bounded_and_counts_what_it_dropped() {
        let mut cloud = Cloud::default();
        let mut log = AttachmentLog::new(3);
        cloud.volumes.insert("vol-1".into(), volume("vol-1", false));
        for t in 0..4u64 {
            let a = &mut cloud.volumes.get_mut("vol-1").unwrap().attachments;
            if a.is_empty() {
                a.push(attachment("i-1", AttachState::Attached));
            } else {
                a.clear();
            }
            log.observe(&cloud, t, &none());
        }
        let h = log.snapshot();
        assert_eq!(h.dropped, 1);
        assert_eq!(
            h.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }
}
