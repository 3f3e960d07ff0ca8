//! `csi-bench stack` as a user runs it: the real binary, two scenarios of 3 pods on 2 nodes,
//! the JSON report checked for shape and sense, nothing left mounted below the data dir.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Two throw-away clusters, one after the other, on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(170);

/// Kills the bench if it is still running and cleans what it left, also when an assertion
/// failed.
struct Bench {
    child: Option<Child>,
    data_dir: PathBuf,
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        test_support::unmount_all_below(&self.data_dir);
        for (dev, _) in test_support::loop_devices_below(&self.data_dir) {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn bench_measures_ebs_and_bypass_and_leaves_nothing_behind() {
    if !test_support::can_run_cluster() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("d");
    let (out, err) = (work.path().join("out"), work.path().join("err"));
    let child = Command::new(env!("CARGO_BIN_EXE_csi-bench"))
        .args(["stack", "--pods", "3", "--nodes", "2", "--timeout", "120"])
        .args(["--scenario", "ebs,hostpath-bypass-adc", "--output", "json"])
        .arg("--data-dir")
        .arg(&data_dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut bench = Bench {
        child: Some(child),
        data_dir: data_dir.clone(),
    };
    let started = Instant::now();
    let status = loop {
        if let Some(s) = bench.child.as_mut().unwrap().try_wait().unwrap() {
            bench.child = None;
            break s;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "bench still running after {PATIENCE:?}; stderr:\n{}",
            read(&err)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let (stdout, stderr) = (read(&out), read(&err));
    assert!(
        status.success(),
        "bench failed ({status}):\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("bench: ebs done"),
        "progress goes to stderr:\n{stderr}"
    );
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}):\n{stdout}"));

    assert_eq!(report["pods"], 3);
    assert_eq!(report["nodes"], 2);
    assert_eq!(report["runs"], 1);
    assert!(
        report["per_node"].as_array().unwrap().is_empty(),
        "per-node memory only with all"
    );
    let scenarios = report["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ebs", "hostpath-bypass-adc"]);
    for s in scenarios {
        let name = s["scenario"].as_str().unwrap();
        assert_eq!(s["measured"], true, "{name}: {s}");
        assert_eq!(s["run"], 1, "{name}");
        let ready = &s["pods"]["ready"];
        assert_eq!(ready["count"], 3, "{name}: every pod measured: {s}");
        let (p50, p99, max) = (
            ready["p50_s"].as_f64().unwrap(),
            ready["p99_s"].as_f64().unwrap(),
            ready["max_s"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{name}: {ready}");
        let wall = s["pods"]["all_ready_s"].as_f64().unwrap();
        assert!(
            wall >= max * 0.99,
            "{name}: the wall time covers the slowest pod: {s}"
        );
        let placed: u64 = s["pods"]["pods_per_node"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(placed, 3, "{name}: every pod on a node: {s}");
        let writes = &s["writes"];
        assert!(
            writes["per_pod"].as_f64().unwrap() > 0.0,
            "{name}: {writes}"
        );
        assert!(
            writes["per_pod_by_component"]["node-agent"]
                .as_f64()
                .unwrap()
                > 0.0,
            "{name}: the node agents write pod status: {writes}"
        );
        let mem = &s["memory"];
        let (idle, peak) = (
            mem["idle_rss_mib"].as_f64().unwrap(),
            mem["peak_mib"].as_f64().unwrap(),
        );
        assert!(idle > 0.0 && peak >= idle, "{name}: {mem}");
        assert!(s["cleanup_s"].as_f64().unwrap() > 0.0, "{name}: {s}");
    }
    assert_eq!(
        scenarios[0]["writes"]["volume_attachments_created"], 3,
        "ebs: one VolumeAttachment per pod"
    );
    assert_eq!(
        scenarios[1]["writes"]["volume_attachments_created"], 0,
        "bypass-adc: no VolumeAttachment"
    );
    assert!(
        scenarios[1]["writes"]["per_pod_by_component"]
            .get("attacher")
            .is_none(),
        "bypass-adc: no attacher write"
    );

    assert!(
        test_support::mounts_below(&data_dir).is_empty(),
        "mounts left: {:?}",
        test_support::mounts_below(&data_dir)
    );
    assert!(
        test_support::loop_devices_below(&data_dir).is_empty(),
        "loop devices left: {:?}",
        test_support::loop_devices_below(&data_dir)
    );
    for i in ["0", "1"] {
        let scenario = data_dir.join(i);
        assert!(
            scenario.join("logs").is_dir(),
            "a given data dir keeps each scenario's logs"
        );
        assert!(
            !scenario.join("0").exists(),
            "the cluster's own dir (volumes, state) is removed"
        );
    }
}

#[test]
fn sigterm_mid_scenario_stops_the_bench_and_leaves_nothing_mounted() {
    if !test_support::can_run_cluster() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("d");
    let err = work.path().join("err");
    let child = Command::new(env!("CARGO_BIN_EXE_csi-bench"))
        .args(["stack", "--pods", "10", "--nodes", "1"])
        .args(["--scenario", "ebs,hostpath-bypass-adc"])
        .arg("--data-dir")
        .arg(&data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut bench = Bench {
        child: Some(child),
        data_dir: data_dir.clone(),
    };
    let started = Instant::now();
    // The first scenario's cluster is up and its pods are being created (and mounted); 10 of
    // them on one node take seconds, so the signal comes before the scenario's end.
    while !read(&err).contains("creating 10 claims and pods") {
        assert!(
            started.elapsed() < PATIENCE,
            "no pods created after {PATIENCE:?}:\n{}",
            read(&err)
        );
        assert!(
            bench.child.as_mut().unwrap().try_wait().unwrap().is_none(),
            "bench ended early:\n{}",
            read(&err)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    test_support::process::sigterm(bench.child.as_ref().unwrap());
    let status = loop {
        if let Some(s) = bench.child.as_mut().unwrap().try_wait().unwrap() {
            bench.child = None;
            break s;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "bench still running after SIGTERM:\n{}",
            read(&err)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = read(&err);
    assert!(!status.success(), "an interrupted bench fails:\n{stderr}");
    assert!(
        stderr.contains("interrupted by SIGINT or SIGTERM"),
        "it says why:\n{stderr}"
    );
    assert!(
        !stderr.contains("hostpath-bypass-adc: starting"),
        "nothing starts after the signal:\n{stderr}"
    );
    assert!(
        test_support::mounts_below(&data_dir).is_empty(),
        "mounts left: {:?}",
        test_support::mounts_below(&data_dir)
    );
    assert!(
        test_support::loop_devices_below(&data_dir).is_empty(),
        "loop devices left: {:?}",
        test_support::loop_devices_below(&data_dir)
    );
}

#[test]
fn bench_refuses_bad_flags_naming_them() {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-bench"))
        .args(["stack", "--scenario", "ebs,nfs"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"nfs\"") && err.contains("hostpath-through-adc"),
        "{err}"
    );
}
