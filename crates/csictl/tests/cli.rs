//! The `csictl` binary against a real driver: the EBS driver (`--mode all` on its embedded EC2)
//! served in this process on a unix socket; csictl runs as a child process, as a person or a
//! script would run it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ebs_driver::{DriverConfig, EmbeddedTiming, Mode};

/// The driver on `DIR/csi.sock` with its EC2 in `DIR/ec2`; stops when dropped.
struct Driver {
    endpoint: String,
    node_id: String,
    task: test_support::ComponentTask<ebs_driver::Error>,
}

impl Driver {
    async fn start(dir: &Path) -> Driver {
        let endpoint = format!("unix://{}", dir.join("csi.sock").display());
        let socket = csi_spec::UnixSocket::bind(&endpoint).unwrap();
        let config = DriverConfig {
            endpoint: endpoint.clone(),
            mode: Mode::All,
            embedded_ec2: Some(dir.join("ec2")),
            embedded_timing: EmbeddedTiming::Fast,
            ..DriverConfig::default()
        };
        let task = test_support::ComponentTask::spawn(|stop| {
            ebs_driver::serve(socket, config, stop.cancelled_owned())
        });
        // The driver registers this machine in its EC2 and saves the instance ID before it
        // serves; Identity answering means both are done.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(!task.is_finished(), "the driver stopped while starting");
            if let Ok(ch) = csi_spec::connect_unix(&endpoint).await {
                let mut id = csi_spec::v1::identity_client::IdentityClient::new(ch);
                if id
                    .probe(csi_spec::v1::ProbeRequest {})
                    .await
                    .is_ok_and(|r| r.get_ref().ready != Some(false))
                {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the driver did not serve");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let node_id = std::fs::read_to_string(dir.join("ec2").join("instance-id"))
            .unwrap()
            .trim()
            .to_string();
        Driver {
            endpoint,
            node_id,
            task,
        }
    }
}

fn csictl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_csictl"))
        .args(args)
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap()
}

// Multi-threaded: the csictl processes are waited for on this thread while the driver serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csictl_prints_canonical_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::start(dir.path()).await;
    let run = |args: &[&str]| {
        let out = csictl(&[&["-e", &d.endpoint, "-o", "json"], args].concat());
        assert!(
            out.status.success(),
            "csictl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let plugin = run(&["info"]);
    assert_eq!(plugin["name"], "ebs.csi.aws.com");
    let info = run(&["node-info"]);
    assert_eq!(info["nodeId"], d.node_id.as_str());
    // int64 is a string in the canonical mapping.
    assert_eq!(info["maxVolumesPerNode"], "25");
    let created = run(&["create", "pvc-cli", "--size", "2Gi", "--param", "type=gp3"]);
    assert_eq!(created["volume"]["capacityBytes"], (2i64 << 30).to_string());
    let vol = created["volume"]["volumeId"].as_str().unwrap().to_string();
    let published = run(&["publish", &vol, &d.node_id]);
    assert!(
        published["publishContext"][csictl::DEVICE_PATH_KEY]
            .as_str()
            .unwrap()
            .starts_with("/dev/xvd"),
        "{published}"
    );
    let caps = run(&["controller-caps"]);
    assert_eq!(
        caps["capabilities"][0]["rpc"]["type"],
        "CREATE_DELETE_VOLUME"
    );
    run(&["unpublish", &vol, &d.node_id]);
    assert_eq!(run(&["delete", &vol]), serde_json::json!({}));
    // A failed call exits non-zero with the status code in the message.
    let out = csictl(&[
        "-e",
        &d.endpoint,
        "publish",
        "vol-0123456789abcdef0",
        &d.node_id,
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Some requested entity was not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.task.stop("the EBS driver", Duration::from_secs(30)).await;
    assert!(!dir.path().join("csi.sock").exists());
}

#[test]
fn no_driver_on_the_endpoint_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nothing.sock");
    let out = csictl(&["-e", &format!("unix://{}", sock.display()), "probe"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&sock.display().to_string()), "{err}");
}

/// `demo` is in every build's help; a build without the `demo` feature says why it cannot run.
#[test]
fn demo_is_listed_and_says_when_it_is_not_built_in() {
    let help = csictl(&["--help"]);
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("demo"));
    if cfg!(feature = "demo") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = csictl(&["demo", "--dir", &dir.path().display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(csictl::NO_DEMO), "{err}");
}
