//! `csi-bench node` end to end at tiny scale: 2 nodes, 6 pods (and 20 background pods on other
//! nodes), hostpath-bypass and hostpath-attach-required, with the real csi-node-agent,
//! csi-node-driver-registrar and hostpath-csi-driver debug binaries from the target dir
//! (`scripts/test` builds every binary before the tests; `cargo build -p node-agent -p
//! registrar -p hostpath-driver` by hand).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

mod common;

use common::debug_dir;
use csi_bench::node::{Binaries, LoadConfig, Named as _, Scenario};
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

/// A driver that never creates its socket fails the run, naming the socket and showing its
/// log; the driver is killed and the run's temp dir (the API server's kubeconfig, the nodes'
/// dirs) is removed. Needs no root: nothing gets as far as a mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_its_socket_fails_the_run_and_leaves_nothing() {
    let bins = tempfile::tempdir().unwrap();
    let pid_file = bins.path().join("driver.pid");
    let body = format!(
        "echo $$ > {}; echo listening nowhere >&2; exec sleep 600",
        pid_file.display()
    );
    common::script(bins.path(), "hostpath-csi-driver", &body);
    for never_started in ["csi-node-agent", "csi-node-driver-registrar"] {
        common::script(bins.path(), never_started, "exit 1");
    }
    let parent = tempfile::tempdir().unwrap();
    let config = LoadConfig {
        binaries: Binaries::in_dir(bins.path()),
        nodes: 1,
        pods: 1,
        timeout: Duration::from_millis(800),
        temp_parent: Some(parent.path().to_path_buf()),
        ..LoadConfig::default()
    };
    let err = csi_bench::node::run_scenario(&config, Scenario::HostpathBypass)
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("node-0 hostpath-csi-driver: its socket"),
        "{err}"
    );
    assert!(err.contains("csi.sock does not exist after 800ms"), "{err}");
    assert!(err.contains("listening nowhere"), "the driver's log: {err}");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    common::assert_gone(pid, "the stand-in driver").await;
    let entries: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
    assert!(
        entries.is_empty(),
        "the run's temp dir is removed: {entries:?}"
    );
}
