//! `csi_bench::attacher::run` end to end. The failure paths run with small shell scripts in the
//! attacher's place (they exit, or hang, as a broken attacher would); the full load needs a real
//! attacher and runs when CSI_ATTACHER_BIN names one.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::{assert_gone, binary, script};
use csi_bench::Error;
use csi_bench::attacher::LoadConfig;
use csi_mock::{Method, MockConfig};
fn small(bin: PathBuf) -> LoadConfig {
    LoadConfig {
        attacher_bin: bin,
        count: 20,
        nodes: 3,
        timeout: Duration::from_secs(120),
        ..LoadConfig::default()
    }
}

/// The value of `--name=VALUE` in a line of arguments.
fn flag_value(args: &str, name: &str) -> Option<String> {
    args.split_whitespace()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
        .map(str::to_owned)
}

#[tokio::test]
async fn an_attacher_that_exits_fails_the_run_with_its_log_and_everything_is_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let args_file = dir.path().join("args");
    let bin = script(
        dir.path(),
        "exits",
        &format!(
            "echo \"$@\" > {}\necho 'cannot reach the driver, giving up' >&2\nexit 3",
            args_file.display()
        ),
    );
    // An external driver socket: the name comes from GetPluginInfo.
    let mock = csi_mock::start(
        dir.path(),
        MockConfig {
            name: "external.mock.csi".into(),
            ..MockConfig::default()
        },
    )
    .await
    .unwrap();
    let err = csi_bench::attacher::run(LoadConfig {
        csi_address: Some(mock.endpoint()),
        attacher_args: vec!["--timeout=15s".into()],
        ..small(bin)
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
            assert!(who.starts_with("the attacher ("), "{who}");
            assert_eq!(*phase, "the attach phase");
            assert!(status.contains('3'), "{status}");
            assert!(logs.contains("giving up"), "{logs}");
        }
        other => panic!("expected Exited, got {other}"),
    }
    let args = std::fs::read_to_string(&args_file).unwrap();
    assert_eq!(
        flag_value(&args, "csi-address").as_deref(),
        Some(mock.endpoint().as_str())
    );
    assert!(args.contains("--v=2"), "{args}");
    assert!(
        args.trim_end().ends_with("--timeout=15s"),
        "extra args last: {args}"
    );
    let kubeconfig = flag_value(&args, "kubeconfig").unwrap();
    assert!(
        !Path::new(&kubeconfig).exists(),
        "the run's temp dir ({kubeconfig}) is removed on error"
    );
    assert!(
        mock.socket_path().exists(),
        "an external driver is left alone"
    );
    assert_eq!(mock.calls_of(Method::GetPluginInfo).len(), 1);
    mock.shutdown().await;
}

#[tokio::test]
async fn a_hanging_attacher_times_out_and_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let bin = script(
        dir.path(),
        "hangs",
        &format!("echo $$ > {}\nexec sleep 600", pid_file.display()),
    );
    let started = Instant::now();
    let err = csi_bench::attacher::run(LoadConfig {
        timeout: Duration::from_secs(3),
        driver_name: Some("named.mock.csi".into()),
        ..small(bin)
    })
    .await
    .unwrap_err();
    match &err {
        Error::Timeout {
            phase, progress, ..
        } => {
            assert_eq!(*phase, "the attach phase");
            assert!(
                progress.contains("20 volumeattachments exist, 0 done"),
                "{progress}"
            );
        }
        other => panic!("expected Timeout, got {other}"),
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_gone(pid, "the hanging attacher").await;
}

#[tokio::test]
async fn an_unreachable_driver_socket_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}/absent.sock", dir.path().display());
    let err = csi_bench::attacher::run(LoadConfig {
        csi_address: Some(endpoint.clone()),
        ..small(PathBuf::from("/bin/true"))
    })
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::Csi { op, .. } if *op == format!("CSI driver at {endpoint}")),
        "{err}"
    );
}

#[tokio::test]
async fn zero_count_is_refused() {
    let err = csi_bench::attacher::run(LoadConfig {
        count: 0,
        ..small(PathBuf::from("/bin/true"))
    })
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

/// The real thing, with the attacher named by CSI_ATTACHER_BIN (scripts/test sets it) or the
/// csi-attacher built beside this test: a run against a csi-mock this test owns, so it can check what the driver saw.
#[tokio::test]
async fn full_load_with_a_real_attacher() {
    let Some(bin) = binary("CSI_ATTACHER_BIN", "csi-attacher") else {
        test_support::skip_or_fail(
            "no csi-attacher built in this target dir and CSI_ATTACHER_BIN unset \
             (`cargo build -p attacher` or set CSI_ATTACHER_BIN to any attacher binary)",
        );
        return;
    };
    assert!(
        bin.exists(),
        "CSI_ATTACHER_BIN={} does not exist",
        bin.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let mock = csi_mock::start(dir.path(), MockConfig::default())
        .await
        .unwrap();
    let report = csi_bench::attacher::run(LoadConfig {
        csi_address: Some(mock.endpoint()),
        attacher_log: Some(dir.path().join("attacher.log")),
        ..small(bin)
    })
    .await
    .unwrap();
    println!("{}", report.table());

    assert_eq!(report.driver, "mock.csi.rs");
    assert!(!report.builtin_mock);
    assert!(report.attach.seconds > 0.0);
    assert!(report.va_writes_per_attach >= 2.0, "{report:?}");
    assert!(report.pv_writes_per_attach >= 1.0, "{report:?}");
    assert!(report.writes_per_detach >= 1.0, "{report:?}");
    assert!(report.writes_per_pv_delete >= 1.0, "{report:?}");
    assert_eq!(report.own_writes, report.own_writes_seen);
    assert!(report.peak_rss_bytes.unwrap() > 0);
    assert!(
        !report
            .attacher_user_agents
            .contains(csi_bench::attacher::USER_AGENT)
    );

    let publishes = mock.calls_of(Method::ControllerPublishVolume);
    assert!(publishes.len() >= 20);
    assert!(
        publishes
            .iter()
            .all(|c| c.node_id.starts_with("load-node-id-")),
        "node IDs come from CSINode"
    );
    assert!(mock.published().is_empty(), "everything was unpublished");
    assert!(dir.path().join("attacher.log").exists());
    mock.shutdown().await;
}
