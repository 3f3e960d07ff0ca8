//! What is attached where: confirmed attachments, uncertain ones (a VolumeAttachment exists but
//! is not attached: an attach that failed or timed out, or one found after a restart), whether
//! the node still mounts the volume (`status.volumesInUse`), and whether it is reported in
//! `node.status.volumesAttached`. Detaching needs nothing but the unique volume name and the node
//! ([`DetachHow::from_unique_name`]), so a state rebuilt from node status after a restart can
//! detach everything it finds.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;
use volume_plugins::names::{AWS_EBS_PLUGIN_NAME, CSI_PLUGIN_NAME};

use super::VolumeNode;

/// How to detach a volume, from its unique name alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetachHow {
    Csi { driver: String, handle: String },
    AwsEbs { volume_id: String },
}

impl DetachHow {
    /// Parses `kubernetes.io/csi/<driver>^<handle>` or `kubernetes.io/aws-ebs/<volumeID>`.
    pub fn from_unique_name(name: &str) -> Option<Self> {
        if let Some(rest) = name
            .strip_prefix(CSI_PLUGIN_NAME)
            .and_then(|r| r.strip_prefix('/'))
        {
            let (driver, handle) = rest.split_once('^')?;
            if driver.is_empty() || handle.is_empty() {
                return None;
            }
            return Some(Self::Csi {
                driver: driver.into(),
                handle: handle.into(),
            });
        }
        let volume_id = name
            .strip_prefix(AWS_EBS_PLUGIN_NAME)
            .and_then(|r| r.strip_prefix('/'))
            .filter(|r| !r.is_empty())?;
        Some(Self::AwsEbs {
            volume_id: volume_id.into(),
        })
    }

    /// The `volume_plugin` metric label.
    pub fn plugin_label(&self) -> String {
        match self {
            Self::Csi { driver, .. } => format!("kubernetes.io/csi:{driver}"),
            Self::AwsEbs { .. } => AWS_EBS_PLUGIN_NAME.to_string(),
        }
    }
}

/// One volume on one node.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub how: DetachHow,
    /// `node.status.volumesAttached[].devicePath` ("" for CSI).
    pub device_path: String,
    /// Attached for sure; false: uncertain (detached when no longer wanted, attached again
    /// when wanted).
    pub confirmed: bool,
    /// The node reports the volume in `status.volumesInUse` (its last known word; a new
    /// attachment counts as mounted until the node says otherwise, as in Kubernetes).
    pub mounted: bool,
    /// Listed in `node.status.volumesAttached` (cleared, and written, before a detach starts).
    pub report: bool,
    /// When the volume was first seen no longer desired while mounted (for
    /// `--max-wait-for-unmount`).
    pub detach_requested: Option<Instant>,
    /// The EC2 instance of the node (in-tree EBS), kept so a deleted node can still be detached.
    pub instance_id: Option<String>,
    /// Whether the volume may be on several nodes (from the spec when it was attached).
    pub multi_attach: bool,
    /// An in-tree volume attached through its CSI driver (the `migrated` metric label).
    pub migrated: bool,
}

impl Attachment {
    pub fn new(how: DetachHow, device_path: String, confirmed: bool) -> Self {
        Self {
            how,
            device_path,
            confirmed,
            mounted: true,
            report: confirmed,
            detach_requested: None,
            instance_id: None,
            multi_attach: false,
            migrated: false,
        }
    }
}

/// The actual state: (volume, node) → attachment.
#[derive(Debug, Default)]
pub struct ActualStateOfWorld {
    pub attachments: BTreeMap<VolumeNode, Attachment>,
}

impl ActualStateOfWorld {
    pub fn get(&self, volume: &str, node: &str) -> Option<&Attachment> {
        self.attachments
            .get(&(volume.to_string(), node.to_string()))
    }

    pub fn get_mut(&mut self, volume: &str, node: &str) -> Option<&mut Attachment> {
        self.attachments
            .get_mut(&(volume.to_string(), node.to_string()))
    }

    /// Records a successful attach (new, or an uncertain one confirmed).
    pub fn mark_attached(&mut self, volume: &str, node: &str, mut attachment: Attachment) {
        attachment.confirmed = true;
        attachment.report = true;
        attachment.detach_requested = None;
        self.attachments
            .insert((volume.to_string(), node.to_string()), attachment);
    }

    /// Records an attach that may have left something behind (a VolumeAttachment).
    pub fn mark_uncertain(&mut self, volume: &str, node: &str, attachment: Attachment) {
        self.attachments
            .entry((volume.to_string(), node.to_string()))
            .or_insert(Attachment {
                confirmed: false,
                report: false,
                ..attachment
            });
    }

    pub fn remove(&mut self, volume: &str, node: &str) -> Option<Attachment> {
        self.attachments
            .remove(&(volume.to_string(), node.to_string()))
    }

    /// Nodes other than `node` that have `volume` (confirmed or not). A range of the map
    /// (keys sort by volume first), not a scan: the reconciler asks this for every desired
    /// volume on every pass.
    pub fn other_nodes(&self, volume: &str, node: &str) -> Vec<String> {
        self.attachments
            .range((volume.to_string(), String::new())..)
            .take_while(|((v, _), _)| v == volume)
            .filter(|((_, n), _)| n != node)
            .map(|((_, n), _)| n.clone())
            .collect()
    }

    /// What `node.status.volumesAttached` should say: (name, devicePath), sorted by name.
    pub fn reported(&self, node: &str) -> Vec<(String, String)> {
        self.attachments
            .iter()
            .filter(|((_, n), a)| n == node && a.confirmed && a.report)
            .map(|((v, _), a)| (v.clone(), a.device_path.clone()))
            .collect()
    }

    /// Every node with an attachment.
    pub fn nodes(&self) -> BTreeSet<String> {
        self.attachments.keys().map(|(_, n)| n.clone()).collect()
    }

    /// Sets `mounted` of `node`'s attachments from its `status.volumesInUse`.
    pub fn set_mounted_by_node(&mut self, node: &str, in_use: &BTreeSet<String>) {
        for ((v, n), a) in self.attachments.iter_mut() {
            if n == node {
                a.mounted = in_use.contains(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_say_how_to_detach() {
        assert_eq!(
            DetachHow::from_unique_name("kubernetes.io/csi/ebs.csi.aws.com^vol-1"),
            Some(DetachHow::Csi {
                driver: "ebs.csi.aws.com".into(),
                handle: "vol-1".into()
            })
        );
        assert_eq!(
            DetachHow::from_unique_name("kubernetes.io/aws-ebs/aws://us-east-1a/vol-1"),
            Some(DetachHow::AwsEbs {
                volume_id: "aws://us-east-1a/vol-1".into()
            })
        );
        for bad in [
            "kubernetes.io/csi/no-caret",
            "kubernetes.io/csi/^h",
            "kubernetes.io/aws-ebs/",
            "kubernetes.io/gce-pd/disk",
            "",
        ] {
            assert_eq!(DetachHow::from_unique_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn reported_lists_confirmed_attachments_not_being_detached() {
        let how = |h: &str| DetachHow::Csi {
            driver: "d".into(),
            handle: h.into(),
        };
        let mut asw = ActualStateOfWorld::default();
        asw.mark_attached("v-b", "n1", Attachment::new(how("b"), String::new(), true));
        asw.mark_attached(
            "v-a",
            "n1",
            Attachment::new(how("a"), "/dev/xvdba".into(), true),
        );
        asw.mark_uncertain("v-c", "n1", Attachment::new(how("c"), String::new(), false));
        asw.mark_attached("v-a", "n2", Attachment::new(how("a"), String::new(), true));
        assert_eq!(
            asw.reported("n1"),
            vec![
                ("v-a".to_string(), "/dev/xvdba".to_string()),
                ("v-b".to_string(), String::new())
            ]
        );
        if let Some(a) = asw.get_mut("v-b", "n1") {
            a.report = false;
        }
        assert_eq!(asw.reported("n1").len(), 1);
        assert_eq!(asw.other_nodes("v-a", "n1"), vec!["n2".to_string()]);
        assert_eq!(
            asw.other_nodes("v-a", "n0"),
            vec!["n1".to_string(), "n2".to_string()]
        );
        assert!(
            asw.other_nodes("v-", "n0").is_empty(),
            "a prefix is another volume"
        );
        assert!(asw.other_nodes("v-z", "n0").is_empty());
        let in_use = BTreeSet::from(["v-a".to_string()]);
        asw.set_mounted_by_node("n1", &in_use);
        assert!(asw.get("v-a", "n1").is_some_and(|a| a.mounted));
        assert!(asw.get("v-b", "n1").is_some_and(|a| !a.mounted));
        assert!(
            asw.get("v-a", "n2").is_some_and(|a| a.mounted),
            "other nodes untouched"
        );
    }
}
