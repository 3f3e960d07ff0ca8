//! The goal of a scenario, seen through one watch on Nodes: how many of the run's volumes are in
//! their node's `status.volumesAttached`, and when the first and the last got there. The
//! instants are taken when the watch event arrives, so they do not depend on when the run looks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The unique volume names expected on each node.
pub(crate) type Expected = BTreeMap<String, BTreeSet<String>>;

/// What the watch has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Attached {
    /// The initial list is in: the numbers are real.
    pub(crate) synced: bool,
    /// Expected volumes listed in their node's `volumesAttached`.
    pub(crate) listed: usize,
    /// Other entries (a volume on the wrong node, or one the run did not make).
    pub(crate) unexpected: usize,
    pub(crate) first_at: Option<Instant>,
    /// When `listed` first reached the number expected.
    pub(crate) all_at: Option<Instant>,
}

/// (expected entries, other entries) of one Node's `status.volumesAttached`.
pub(crate) fn count_listed(node: &Node, expected: Option<&BTreeSet<String>>) -> (usize, usize) {
    let entries = node
        .status
        .as_ref()
        .and_then(|s| s.volumes_attached.as_deref())
        .unwrap_or_default();
    let listed = entries
        .iter()
        .filter(|v| expected.is_some_and(|e| e.contains(&v.name)))
        .count();
    (listed, entries.len() - listed)
}

/// The background watch; stops when dropped.
pub(crate) struct AttachedTracker {
    rx: watch::Receiver<Attached>,
    task: JoinHandle<()>,
}

impl Drop for AttachedTracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AttachedTracker {
    pub(crate) fn spawn(api: Api<Node>, label_selector: &str, expected: Expected) -> Self {
        let total: usize = expected.values().map(BTreeSet::len).sum();
        let (tx, rx) = watch::channel(Attached::default());
        let config = watcher::Config::default().labels(label_selector);
        let task = tokio::spawn(async move {
            // The reflector keeps the Nodes; every event recounts them (10 nodes: cheap, and
            // a re-list after a watch error needs no special case).
            let (store, writer) = reflector::store::<Node>();
            let mut events =
                reflector(writer, watcher::watcher(api, config).default_backoff()).boxed();
            let mut now = Attached::default();
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Init | Event::InitApply(_)) => continue,
                    Ok(Event::InitDone) => now.synced = true,
                    Ok(Event::Apply(_) | Event::Delete(_)) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "node watch failed; retrying");
                        continue;
                    }
                }
                let (mut listed, mut unexpected) = (0, 0);
                for node in store.state() {
                    let name = node.metadata.name.as_deref().unwrap_or_default();
                    let (l, u) = count_listed(&node, expected.get(name));
                    listed += l;
                    unexpected += u;
                }
                now.listed = listed;
                now.unexpected = unexpected;
                if listed > 0 && now.first_at.is_none() {
                    now.first_at = Some(Instant::now());
                }
                if total > 0 && listed >= total && now.all_at.is_none() {
                    now.all_at = Some(Instant::now());
                }
                tx.send_replace(now);
            }
        });
        Self { rx, task }
    }

    pub(crate) fn now(&self) -> Attached {
        *self.rx.borrow()
    }

    /// Resolves when `done` holds (never, if the watch task ends: the caller's deadline
    /// decides).
    pub(crate) async fn until(&self, done: impl Fn(&Attached) -> bool) {
        let mut rx = self.rx.clone();
        if rx.wait_for(|a| done(a)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(volumes: &[&str]) -> Node {
        let attached: Vec<_> = volumes
            .iter()
            .map(|v| json!({"name": v, "devicePath": ""}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "node-0"},
            "status": {"volumesAttached": attached},
        }))
        .unwrap()
    }

    #[test]
    fn counts_expected_and_other_entries() {
        let expected: BTreeSet<String> = ["kubernetes.io/csi/d^a", "kubernetes.io/csi/d^b"]
            .map(String::from)
            .into();
        assert_eq!(count_listed(&node(&[]), Some(&expected)), (0, 0));
        assert_eq!(
            count_listed(
                &node(&["kubernetes.io/csi/d^a", "kubernetes.io/csi/d^zz"]),
                Some(&expected)
            ),
            (1, 1)
        );
        assert_eq!(
            count_listed(&node(&["kubernetes.io/csi/d^a"]), None),
            (0, 1),
            "a node the run has no volume for"
        );
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(count_listed(&bare, Some(&expected)), (0, 0));
    }
}
