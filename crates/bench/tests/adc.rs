//! `csi_bench::adc::run` end to end. The failure paths run small shell scripts in the ADC's place
//! (they exit, or never watch, as a broken controller would); the small load runs the real
//! `attach-detach-controller` and `csi-attacher`, found through ATTACH_DETACH_CONTROLLER_BIN and
//! CSI_ATTACHER_BIN or beside this test in the target dir.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

use common::{assert_gone, binary, script};
use csi_bench::Error;
use csi_bench::adc::{LoadConfig, Named as _, Scenario};
fn small(adc: PathBuf, scenarios: Vec<Scenario>) -> LoadConfig {
    LoadConfig {
        adc_bin: adc,
        scenarios,
        pods: 20,
        nodes: 2,
        timeout: Duration::from_secs(120),
        settle: Duration::from_secs(1),
        ..LoadConfig::default()
    }
}

#[tokio::test]
async fn an_adc_that_exits_fails_the_run_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let args_file = dir.path().join("args");
    let bin = script(
        dir.path(),
        "adc",
        &format!(
            "echo \"$@\" > {}\necho 'no kubeconfig, giving up' >&2\nexit 3",
            args_file.display()
        ),
    );
    let err = csi_bench::adc::run(LoadConfig {
        adc_args: vec!["--kube-api-qps=-1".into()],
        ..small(bin, vec![Scenario::ThroughAdc])
    })
    .await
    .unwrap_err();
    match &err {
        Error::Exited {
            who,
            phase,
            status,
            logs,
        } => {
            assert!(who.starts_with("the attach/detach controller ("), "{who}");
            assert_eq!(*phase, "through-adc: start-up");
            assert!(status.contains('3'), "{status}");
            assert!(logs.contains("giving up"), "{logs}");
        }
        other => panic!("expected Exited, got {other}"),
    }
    let args = std::fs::read_to_string(&args_file).unwrap();
    let args: Vec<&str> = args.split_whitespace().collect();
    assert!(args.contains(&"--skip-attach=through-adc"), "{args:?}");
    assert!(args.contains(&"--reconciler-sync-period=100ms"), "{args:?}");
    assert!(
        args.iter()
            .any(|a| a.starts_with("--http-endpoint=127.0.0.1:")),
        "{args:?}"
    );
    assert_eq!(args.last(), Some(&"--kube-api-qps=-1"), "extra args last");
    let kubeconfig = args
        .iter()
        .find_map(|a| a.strip_prefix("--kubeconfig="))
        .unwrap();
    assert!(
        !Path::new(kubeconfig).exists(),
        "the scenario's temp dir is removed on error"
    );
}

#[tokio::test]
async fn an_adc_that_never_watches_times_out_at_start_up_and_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let bin = script(
        dir.path(),
        "adc",
        &format!("echo $$ > {}\nexec sleep 600", pid_file.display()),
    );
    let err = csi_bench::adc::run(LoadConfig {
        timeout: Duration::from_secs(3),
        ..small(bin, vec![Scenario::BypassAdc])
    })
    .await
    .unwrap_err();
    match &err {
        Error::Timeout {
            phase, progress, ..
        } => {
            assert_eq!(*phase, "bypass-adc: start-up");
            assert!(
                progress.contains(
                    "no watch yet: attach/detach controller on pods, nodes, persistentvolumeclaims"
                ),
                "{progress}"
            );
        }
        other => panic!("expected Timeout, got {other}"),
    }
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Killed and reaped (or a zombie for a moment) within the grace period of the stop.
    assert_gone(pid, "the ADC stand-in").await;
}

/// The three scenarios with the real controller and attacher, 20 pods on 2 nodes.
#[tokio::test]
async fn small_load_with_the_real_controller_and_attacher() {
    let Some(adc) = binary("ATTACH_DETACH_CONTROLLER_BIN", "attach-detach-controller") else {
        test_support::skip_or_fail(
            "no attach-detach-controller built in this target dir and ATTACH_DETACH_CONTROLLER_BIN \
             unset (`cargo build -p attach-detach --bin attach-detach-controller`)",
        );
        return;
    };
    let Some(attacher) = binary("CSI_ATTACHER_BIN", "csi-attacher") else {
        test_support::skip_or_fail(
            "no csi-attacher built in this target dir and CSI_ATTACHER_BIN unset \
             (`cargo build -p attacher`)",
        );
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    let report = csi_bench::adc::run(LoadConfig {
        attacher_bin: Some(attacher),
        attacher_args: vec!["--kube-api-qps=-1".into()],
        log_dir: Some(logs.path().to_owned()),
        ..small(adc, Scenario::ALL.to_vec())
    })
    .await
    .unwrap();
    println!("{}", report.table());
    let pods = 20;
    let [required, through, bypass] = &report.scenarios[..] else {
        panic!("three scenarios: {report:?}");
    };
    for s in &report.scenarios {
        assert_eq!(s.own_writes, s.own_writes_seen, "{}", s.scenario);
        assert!(s.adc.peak_rss_bytes.unwrap() > 0, "{}", s.scenario);
        assert!(
            !s.adc.user_agents.contains(csi_bench::adc::USER_AGENT),
            "{}",
            s.scenario
        );
        assert_eq!(s.unexpected_listed, 0, "{}", s.scenario);
    }

    // attach-required: one VolumeAttachment per volume, named as Kubernetes names it,
    // fulfilled by the attacher through the mock.
    assert!(required.all_listed_seconds.is_some());
    assert_eq!(required.volumes_listed, pods);
    assert_eq!(required.volume_attachments, pods);
    assert_eq!(required.volume_attachments_attached, pods);
    assert_eq!(required.volume_attachments_named_right, pods);
    assert_eq!(
        required
            .adc
            .writes
            .by_request
            .get("create volumeattachments"),
        Some(&(pods as u64)),
        "{:?}",
        required.adc.writes
    );
    assert!(required.adc.writes.to_resource("nodes") >= 1);
    let attacher = required.attacher.as_ref().unwrap();
    assert!(
        attacher.writes.to_resource("volumeattachments") >= 2 * pods as u64,
        "{:?}",
        attacher.writes
    );
    assert!(
        attacher
            .user_agents
            .iter()
            .all(|a| a.starts_with("csi-attacher/"))
    );
    assert!(required.csi_publish_calls.unwrap() >= pods as u64);
    assert!(logs.path().join("attach-required-attacher.log").exists());

    // through-adc: listed without any VolumeAttachment or attacher.
    assert!(through.all_listed_seconds.is_some());
    assert_eq!(through.volumes_listed, pods);
    assert_eq!(through.volume_attachments, 0);
    assert_eq!(through.adc.writes.to_resource("volumeattachments"), 0);
    assert!(through.adc.writes.to_resource("nodes") >= 1);
    assert!(through.attacher.is_none());

    // bypass-adc: the ADC leaves the volumes alone.
    assert_eq!(bypass.all_listed_seconds, None);
    assert_eq!(bypass.volumes_listed, 0);
    assert_eq!(bypass.volume_attachments, 0);
    assert_eq!(
        bypass.adc.writes.to_resource("volumeattachments") + bypass.adc.writes.to_resource("nodes"),
        0,
        "{:?}",
        bypass.adc.writes
    );
    assert!(report.through_adc_speedup.is_some());
}
