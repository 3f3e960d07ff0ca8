//! Which attach and detach operations run and which wait out a backoff (kube-controller-manager's
//! nested pending operations): never two at once on the same volume (on the same volume and
//! node for a multi-attachable one), and exponential backoff per volume and node after a
//! failure.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::cache::VolumeNode;

/// Running operations and backoffs.
#[derive(Debug, Default)]
pub(crate) struct OperationTable {
    /// volume → nodes with a running operation (`None`: the operation holds the whole volume).
    running: HashMap<String, Vec<Option<String>>>,
    /// (volume, node) → (failures in a row, no retry before).
    backoff: HashMap<VolumeNode, (u32, Instant)>,
}

impl OperationTable {
    /// Whether an operation on `volume` at `node` would overlap a running one.
    pub(crate) fn busy(&self, volume: &str, node: &str, per_node: bool) -> bool {
        self.running.get(volume).is_some_and(|nodes| {
            !per_node || nodes.iter().any(|n| n.as_deref().is_none_or(|n| n == node))
        })
    }

    /// Whether a failed operation on (volume, node) is still waiting out its backoff.
    pub(crate) fn in_backoff(&self, volume: &str, node: &str, now: Instant) -> bool {
        self.backoff
            .get(&(volume.to_string(), node.to_string()))
            .is_some_and(|(_, until)| now < *until)
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
        self.backoff.remove(&(volume.to_string(), node.to_string()));
    }

    /// Records a failure; returns the delay before the next try.
    pub(crate) fn failed(
        &mut self,
        volume: &str,
        node: &str,
        initial: Duration,
        max: Duration,
    ) -> Duration {
        let entry = self
            .backoff
            .entry((volume.to_string(), node.to_string()))
            .or_insert((0, Instant::now()));
        let delay = component_runtime::workqueue::Backoff {
            start: initial,
            max,
        }
        .delay(entry.0.saturating_add(1));
        entry.0 = entry.0.saturating_add(1);
        entry.1 = Instant::now() + delay;
        delay
    }

    /// Forgets backoffs of (volume, node) pairs for which `keep` is false.
    pub(crate) fn retain_backoff(&mut self, keep: impl Fn(&VolumeNode) -> bool) {
        self.backoff.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_operation_per_volume_or_per_volume_and_node() {
        let mut t = OperationTable::default();
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
        let mut t = OperationTable::default();
        let (initial, max) = (Duration::from_millis(500), Duration::from_secs(122));
        let delays: Vec<Duration> = (0..10).map(|_| t.failed("v", "n", initial, max)).collect();
        assert_eq!(delays[0], Duration::from_millis(500));
        assert_eq!(delays[1], Duration::from_secs(1));
        assert_eq!(delays[2], Duration::from_secs(2));
        assert_eq!(delays[9], max);
        assert!(t.in_backoff("v", "n", Instant::now()));
        assert!(!t.in_backoff("v", "other", Instant::now()));
        t.succeeded("v", "n");
        assert!(!t.in_backoff("v", "n", Instant::now()));
    }
}
