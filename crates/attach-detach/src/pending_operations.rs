//! Which attach and detach operations run and which wait out a backoff (kube-controller-manager's
//! nested pending operations): never two at once on the same volume (on the same volume and
//! node for a multi-attachable one), and exponential backoff per volume and node after a
//! failure.

use std::collections::HashMap;
use std::time::Duration;

use component_runtime::workqueue::{Backoff, Failures};

use crate::cache::VolumeNode;

/// Running operations and backoffs.
#[derive(Debug)]
pub(crate) struct OperationTable {
    /// volume → nodes with a running operation (`None`: the operation holds the whole volume).
    running: HashMap<String, Vec<Option<String>>>,
    /// The (volume, node) pairs whose last operation failed.
    failures: Failures<VolumeNode>,
}

impl OperationTable {
    /// A failed operation waits `backoff.start`, doubling per failure in a row up to
    /// `backoff.max`.
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self {
            running: HashMap::new(),
            failures: Failures::new(backoff),
        }
    }

    /// Whether an operation on `volume` at `node` would overlap a running one.
    pub(crate) fn busy(&self, volume: &str, node: &str, per_node: bool) -> bool {
        self.running.get(volume).is_some_and(|nodes| {
            !per_node || nodes.iter().any(|n| n.as_deref().is_none_or(|n| n == node))
        })
    }

    /// Whether a failed operation on (volume, node) is still waiting out its backoff.
    pub(crate) fn in_backoff(&self, volume: &str, node: &str) -> bool {
        self.failures
            .backing_off(&(volume.to_string(), node.to_string()), &())
    }

    pub(crate) fn start(&mut self, volume: &str, node: &str, per_node: bool) {
        self.running
            .entry(volume.to_string())
            .or_default()
            .push(per_node.then(|| node.to_string()));
    }

    pub(crate) fn finish(&mut self, volume: &str, node: &str, per_node: bool) {
        let key = per_node.then(|| node.to_string());
        if let Some(nodes) = self.running.get_mut(volume) {
            if let Some(i) = nodes.iter().position(|n| *n == key) {
                nodes.swap_remove(i);
            }
            if nodes.is_empty() {
                self.running.remove(volume);
            }
        }
    }

    pub(crate) fn succeeded(&mut self, volume: &str, node: &str) {
        self.failures
            .succeeded(&(volume.to_string(), node.to_string()));
    }

    /// Records a failure; returns the delay before the next try.
    pub(crate) fn failed(&mut self, volume: &str, node: &str) -> Duration {
        self.failures
            .failed(&(volume.to_string(), node.to_string()), ())
    }

    /// Forgets backoffs of (volume, node) pairs for which `keep` is false.
    pub(crate) fn retain_backoff(&mut self, keep: impl Fn(&VolumeNode) -> bool) {
        self.failures.retain(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_operation_per_volume_or_per_volume_and_node() {
        let mut t = OperationTable::new(Backoff {
            start: Duration::from_millis(500),
            max: Duration::from_secs(122),
        });
        t.start("rwo", "n1", false);
        assert!(t.busy("rwo", "n1", false) && t.busy("rwo", "n2", false));
        assert!(
            t.busy("rwo", "n2", true),
            "a whole-volume operation blocks per-node ones"
        );
        t.finish("rwo", "n1", false);
        assert!(!t.busy("rwo", "n1", false));
        t.start("rwx", "n1", true);
        assert!(t.busy("rwx", "n1", true));
        assert!(
            !t.busy("rwx", "n2", true),
            "other nodes of a multi-attach volume run"
        );
        assert!(
            t.busy("rwx", "n2", false),
            "a whole-volume operation waits for all"
        );
        t.finish("rwx", "n1", true);
        assert!(!t.busy("rwx", "n1", true));
    }

    #[test]
    fn backoff_doubles_up_to_the_max_and_resets_on_success() {
        let max = Duration::from_secs(122);
        let mut t = OperationTable::new(Backoff {
            start: Duration::from_millis(500),
            max,
        });
        let delays: Vec<Duration> = (0..10).map(|_| t.failed("v", "n")).collect();
        assert_eq!(delays[0], Duration::from_millis(500));
        assert_eq!(delays[1], Duration::from_secs(1));
        assert_eq!(delays[2], Duration::from_secs(2));
        assert_eq!(delays[9], max);
        assert!(t.in_backoff("v", "n"));
        assert!(!t.in_backoff("v", "other"));
        t.succeeded("v", "n");
        assert!(!t.in_backoff("v", "n"));
    }
}
