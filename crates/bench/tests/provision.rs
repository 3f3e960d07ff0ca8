//! `csi-bench provision` end to end at tiny scale: 5 PVCs on hostpath with the real csi-provisioner
//! and hostpath-csi-driver debug binaries from the target dir (`scripts/test` builds every
//! binary before the tests; `cargo build -p provisioner -p hostpath-driver` by hand). Checks
//! that the report is complete and sane; no timing assertions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

mod common;

use common::debug_dir;
use csi_bench::provision::{Binaries, LoadConfig, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_pvcs_on_hostpath_are_bound_and_deleted() {
    let binaries = Binaries::in_dir(&debug_dir());
    let missing = binaries.missing(Scenario::Hostpath);
    if !missing.is_empty() {
        test_support::skip_or_fail(&format!(
            "debug binaries missing: {missing:?} (cargo build -p provisioner -p hostpath-driver)"
        ));
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let config = LoadConfig {
        binaries,
        scenarios: vec![Scenario::Hostpath],
        pvcs: Some(5),
        parallelism: 3,
        worker_threads: 4,
        timeout: Duration::from_secs(120),
        settle: Duration::from_millis(500),
        temp_parent: Some(parent.path().to_path_buf()),
        ..LoadConfig::default()
    };
    let report = csi_bench::provision::run(config).await.unwrap();
    assert_eq!(report.runs, 1);
    assert_eq!(report.scenarios.len(), 1);
    let r = &report.scenarios[0];
    assert_eq!((r.scenario, r.run, r.pvcs), (Scenario::Hostpath, 1, 5));

    // Every claim Bound, each with a latency; one PV and one driver volume per claim.
    assert_eq!(r.bound.count, 5, "{r:#?}");
    assert_eq!(r.latencies_s.len(), 5);
    assert!(
        r.latencies_s.iter().all(|&l| l > 0.0),
        "{:?}",
        r.latencies_s
    );
    assert!(r.bound.p50_s <= r.bound.p99_s && r.bound.p99_s <= r.bound.max_s);
    assert!(r.all_bound_s.unwrap() >= r.first_bound_s.unwrap());
    assert_eq!(r.volumes_at_bound, 5);
    assert_eq!(r.driver_volumes_at_bound, Some(5));

    // Writes by both controllers, none by anybody else; our own are the 5 creates.
    let bind = &r.writes_bind;
    assert_eq!(
        bind.provisioner.by_request.get("create persistentvolumes"),
        Some(&5),
        "{bind:#?}"
    );
    assert!(
        bind.pv_controller.to_resource("persistentvolumeclaims") >= 5,
        "{bind:#?}"
    );
    assert!(
        bind.pv_controller.to_resource("persistentvolumes") >= 5,
        "{bind:#?}"
    );
    assert_eq!(bind.other.total, 0, "{:?}", bind.other_agents);
    assert_eq!(
        bind.own.by_request.get("create persistentvolumeclaims"),
        Some(&5)
    );

    // Both processes sampled.
    for (who, p) in [("provisioner", &r.provisioner), ("driver", &r.driver)] {
        let at_bound = p
            .at_bound
            .unwrap_or_else(|| panic!("{who}: no memory at Bound"));
        let at_end = p
            .at_end
            .unwrap_or_else(|| panic!("{who}: no memory at the end"));
        assert!(
            at_bound.rss_bytes > 0 && at_bound.hwm_bytes >= at_bound.rss_bytes,
            "{who}"
        );
        assert!(
            at_end.hwm_bytes >= at_bound.hwm_bytes,
            "{who}: VmHWM never falls"
        );
        assert!(p.cpu_total_s.unwrap() > 0.0, "{who}");
        assert!(p.cpu_bind_s.is_some() && p.cpu_delete_s.is_some(), "{who}");
    }
    assert!(
        r.provisioner
            .args
            .contains(&"--feature-gates=Topology=true".to_string())
    );
    assert!(
        r.provisioner
            .args
            .contains(&"--leader-election=false".to_string())
    );

    // Deletes: every PV gone (DeleteVolume through the provisioner), nothing left in the driver.
    assert_eq!(r.delete.count, 5, "every claim's PV gone");
    assert!(r.all_volumes_gone_s.is_some() && r.all_claims_gone_s.is_some());
    assert_eq!(r.driver_volumes_at_end, Some(0));
    let del = &r.writes_delete;
    // At least one delete per PV (a 409 on the resourceVersion precondition is retried).
    let pv_deletes = del.provisioner.by_request.get("delete persistentvolumes");
    assert!(pv_deletes.is_some_and(|&n| n >= 5), "{del:#?}");
    assert_eq!(del.other.total, 0, "{:?}", del.other_agents);
    assert!(
        r.ec2_calls_bind.is_empty(),
        "no EC2 in the hostpath scenario"
    );

    // The table shows it.
    let table = report.table();
    for needle in [
        "all Bound",
        "writes / PVC: provisioner",
        "provisioner VmHWM at end",
        "create persistentvolumes",
    ] {
        assert!(table.contains(needle), "{needle} in\n{table}");
    }
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["scenarios"][0]["scenario"], "hostpath");

    // The temp dir went with the run.
    let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A driver that exits during start-up fails the run with its status and log; the run's temp
/// dir is removed and its API server and PV controller are stopped with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_exits_fails_the_run_and_leaves_nothing() {
    let bins = tempfile::tempdir().unwrap();
    common::script(
        bins.path(),
        "hostpath-csi-driver",
        "echo no storage here >&2; exit 7",
    );
    common::script(bins.path(), "csi-provisioner", "exit 1");
    let parent = tempfile::tempdir().unwrap();
    let config = LoadConfig {
        binaries: Binaries::in_dir(bins.path()),
        scenarios: vec![Scenario::Hostpath],
        pvcs: Some(1),
        timeout: Duration::from_secs(30),
        temp_parent: Some(parent.path().to_path_buf()),
        ..LoadConfig::default()
    };
    let err = csi_bench::provision::run(config)
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("hostpath-csi-driver exited"), "{err}");
    assert!(err.contains("exit status: 7"), "{err}");
    assert!(err.contains("no storage here"), "the driver's log: {err}");
    let entries: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
    assert!(
        entries.is_empty(),
        "the run's temp dir is removed: {entries:?}"
    );
}
