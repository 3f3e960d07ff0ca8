//! `plugin_manager_total_plugins`, the kubelet's plugin manager gauge: one series per socket
//! and state, `desired_state_of_world` (sockets found in the registry directory) and
//! `actual_state_of_world` (sockets whose plugin is registered).

use std::collections::BTreeSet;
use std::path::PathBuf;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub(crate) const DESIRED: &str = "desired_state_of_world";
pub(crate) const ACTUAL: &str = "actual_state_of_world";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    socket_path: String,
    state: String,
}

#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    total_plugins: Family<Labels, Gauge>,
}

impl Metrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let total_plugins = Family::<Labels, Gauge>::default();
        registry.register(
            "plugin_manager_total_plugins",
            "Number of plugins in Plugin Manager",
            total_plugins.clone(),
        );
        Self { total_plugins }
    }

    /// Sets the series of `state` to exactly `sockets` (1 each); series of sockets that left
    /// the state are removed.
    pub(crate) fn set<'a>(
        &self,
        state: &str,
        before: &BTreeSet<PathBuf>,
        sockets: impl Iterator<Item = &'a PathBuf>,
    ) -> BTreeSet<PathBuf> {
        let now: BTreeSet<PathBuf> = sockets.cloned().collect();
        let labels = |path: &PathBuf| Labels {
            socket_path: path.display().to_string(),
            state: state.to_owned(),
        };
        for gone in before.difference(&now) {
            self.total_plugins.remove(&labels(gone));
        }
        for path in &now {
            self.total_plugins.get_or_create(&labels(path)).set(1);
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_follow_the_sockets() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let a = PathBuf::from("/r/a.sock");
        let b = PathBuf::from("/r/b.sock");
        let seen = metrics.set(DESIRED, &BTreeSet::new(), [&a, &b].into_iter());
        let seen = metrics.set(DESIRED, &seen, [&b].into_iter());
        assert_eq!(seen, BTreeSet::from([b.clone()]));
        metrics.set(ACTUAL, &BTreeSet::new(), [&b].into_iter());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"plugin_manager_total_plugins{socket_path="/r/b.sock",state="desired_state_of_world"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"plugin_manager_total_plugins{socket_path="/r/b.sock",state="actual_state_of_world"} 1"#),
            "{text}"
        );
        assert!(!text.contains("/r/a.sock"), "{text}");
    }
}
