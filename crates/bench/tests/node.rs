//! `csi-bench node` end to end at tiny scale: 2 nodes, 6 pods (and 20 background pods on other
//! nodes), hostpath-bypass and hostpath-attach-required, with the real csi-node-agent,
//! csi-node-driver-registrar and hostpath-csi-driver debug binaries from the target dir
//! (`scripts/test` builds every binary before the tests; `cargo build -p node-agent -p
//! registrar -p hostpath-driver` by hand).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

mod common;

use common::debug_dir;
use csi_bench::node::{Binaries, LoadConfig, Scenario};
use test_support::mounts_below;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_run_of_two_hostpath_scenarios() {
    const CAP_SYS_ADMIN: u32 = 21;
    if !test_support::has_capability(CAP_SYS_ADMIN) {
        test_support::skip_or_fail("the benchmark's agents bind-mount volumes: run as root");
        return;
    }
    let binaries = Binaries::in_dir(&debug_dir());
    let missing = binaries.missing(Scenario::HostpathBypass);
    if !missing.is_empty() {
        test_support::skip_or_fail(&format!(
            "debug binaries missing: {missing:?} (cargo build -p node-agent -p registrar -p hostpath-driver)"
        ));
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let config = LoadConfig {
        binaries,
        nodes: 2,
        pods: 6,
        parallelism: 4,
        // Other nodes' pods, claims and PVs: created, left alone, deleted.
        background: 20,
        timeout: Duration::from_secs(120),
        temp_parent: Some(parent.path().to_path_buf()),
        ..LoadConfig::default()
    };
    let mut reports = Vec::new();
    for scenario in [Scenario::HostpathBypass, Scenario::HostpathAttachRequired] {
        let r = csi_bench::node::run_scenario(&config, scenario)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", scenario.name()));
        assert_eq!(r.scenario, scenario);
        assert_eq!(r.background, 20);
        assert!(r.background_created_s > 0.0 && r.background_deleted_s > 0.0);
        assert_eq!(r.ready.count, 6, "{}: every pod Ready", scenario.name());
        assert_eq!(r.latencies_s.len(), 6);
        assert!(
            r.latencies_s.iter().all(|&l| l > 0.0),
            "{:?}",
            r.latencies_s
        );
        assert!(r.ready.p50_s <= r.ready.p99_s && r.ready.p99_s <= r.ready.max_s);
        assert!(r.all_ready_s.unwrap() >= r.ready.p50_s);
        assert_eq!(r.delete.count, 6, "every pod gone");
        assert!(r.all_unmounted_s.is_some(), "everything unmounted");
        assert_eq!(r.agents.len(), 2);
        assert!(r.agent_rss_max_bytes > 0 && r.agent_hwm_max_bytes >= r.agent_rss_max_bytes);
        assert!(r.agents.iter().all(|a| a.rss_idle_bytes > 0));
        assert!(
            r.mounts_when_ready >= 6,
            "a publish mount per pod: {}",
            r.mounts_when_ready
        );
        assert_eq!(r.mounts_left_at_end, 0);
        let left = mounts_below(parent.path());
        assert!(left.is_empty(), "left mounted: {left:?}");
        let entries: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
        assert!(
            entries.is_empty(),
            "the scenario's temp dir is removed: {entries:?}"
        );
        reports.push(r);
    }
    let table = csi_bench::node::report::table(&reports);
    assert!(
        table.contains("hostpath-bypass vs hostpath-attach-required"),
        "{table}"
    );
}
