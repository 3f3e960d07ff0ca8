//! `csi-cluster up --driver NAME=COMMAND` running this workspace's hostpath binary as an
//! external driver (child processes: a controller plugin and one node plugin per node), with
//! `--attach-required` and `--driver-node-deployment`: a claim on the driver's StorageClass and
//! a pod become Ready through the external node plugin with an attached VolumeAttachment, a
//! file written through the mount lands in that plugin's state dir, a SIGKILLed node plugin is
//! started again by the supervisor, the claim's deletion removes the volume, and after SIGTERM
//! no plugin process, mount or socket is left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{
    Cluster, PATIENCE, can_run, claim_and_pod, mounts_below, sockets_below, volume_attachments,
    volume_path,
};

const DRIVER: &str = "hostpath.example.com";

/// The hostpath binary this workspace built: next to the test executable's directory
/// (`target/debug/deps/..`), or under `$CARGO_TARGET_DIR/debug`.
fn hostpath_binary() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf))
        .map(|dir| dir.join("hostpath-csi-driver"));
    let in_target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| PathBuf::from(d).join("debug/hostpath-csi-driver"));
    [beside, in_target]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
}

/// Processes of the external plugins (their command lines name the binary and the data dir):
/// (pid, command line).
fn plugin_processes(data_dir: &Path) -> Vec<(u32, String)> {
    processes_naming(data_dir)
        .into_iter()
        .filter(|(_, c)| c.contains("hostpath-csi-driver"))
        .collect()
}

/// Live processes whose command line names `data_dir` (zombies excluded: they have exited).
fn processes_naming(data_dir: &Path) -> Vec<(u32, String)> {
    let data_dir = data_dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        let zombie = std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        });
        if cmdline.contains(&data_dir) && !zombie {
            found.push((pid, cmdline));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_with_driver_runs_the_hostpath_binary_through_the_whole_lifecycle() {
    if !can_run() {
        return;
    }
    let Some(bin) = hostpath_binary() else {
        test_support::skip_or_fail(
            "the hostpath-csi-driver binary is not built next to the tests: run `cargo build -p hostpath-driver` first",
        );
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let command = format!(
        "{} --endpoint {{endpoint}} --node-id {{node}} --state-dir {{state-dir}} --drivername {DRIVER} --enable-attach",
        bin.display()
    );
    let driver_flag = format!("{DRIVER}={command}");
    let mut cluster = Cluster::start_with(
        work.path(),
        2,
        1,
        &[
            "--driver",
            &driver_flag,
            "--attach-required",
            "--driver-node-deployment",
        ],
    );
    cluster.wait_ready().await;
    let data_dir = cluster.data_dir.canonicalize().unwrap();
    // A controller plugin and one node plugin per node (each a shell and the driver).
    let procs = plugin_processes(&data_dir);
    for plugin in ["controller", "node-0", "node-1"] {
        let dir = data_dir.join("drivers").join(DRIVER).join(plugin);
        assert!(
            procs
                .iter()
                .any(|(_, c)| c.contains(&format!("--state-dir {}", dir.display()))),
            "no {plugin} plugin among {procs:?}"
        );
    }
    let csidriver = cluster.get_json(&["get", "csidriver", DRIVER]);
    assert_eq!(csidriver["spec"]["attachRequired"], true, "{csidriver}");
    let class = cluster.get_json(&["get", "storageclass", DRIVER]);
    assert_eq!(class["provisioner"], DRIVER, "{class}");

    cluster.kubectl(
        &["apply", "-f", "-"],
        Some(&claim_and_pod("ext-claim", DRIVER, "ext-pod", "node-1")),
    );
    cluster.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/ext-pod",
            "--timeout=120s",
        ],
        None,
    );
    let vas = cluster.get_json(&["get", "volumeattachments"]);
    let va = &vas["items"][0];
    assert_eq!(va["spec"]["attacher"], DRIVER, "{vas}");
    assert_eq!(va["spec"]["nodeName"], "node-1", "{vas}");
    assert_eq!(va["status"]["attached"], true, "{vas}");
    let pv = cluster.get_json(&["get", "pvc", "ext-claim"])["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    let handle = cluster.get_json(&["get", "pv", &pv])["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(handle.starts_with("node-1_"), "{handle}");

    // Through the pod's mount into node-1's external plugin's state dir, and back.
    let path = volume_path(&cluster, "ext-pod");
    std::fs::write(path.join("hello.txt"), b"external driver").unwrap();
    assert_eq!(
        std::fs::read(path.join("hello.txt")).unwrap(),
        b"external driver"
    );
    let stored = data_dir
        .join("drivers")
        .join(DRIVER)
        .join("node-1/volumes")
        .join(&handle)
        .join("hello.txt");
    assert_eq!(std::fs::read(&stored).unwrap(), b"external driver");

    // SIGKILL node-1's driver (not its shell): the supervisor starts the plugin again.
    let node1_dir = data_dir.join("drivers").join(DRIVER).join("node-1");
    let is_node1_driver = |c: &str| {
        c.starts_with(&bin.display().to_string())
            && c.contains(&format!("--state-dir {}", node1_dir.display()))
    };
    let (old, _) = plugin_processes(&data_dir)
        .into_iter()
        .find(|(_, c)| is_node1_driver(c))
        .expect("node-1's driver process");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(old as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    test_support::eventually("node-1's plugin started again", PATIENCE, || async {
        plugin_processes(&data_dir)
            .into_iter()
            .find(|(pid, c)| *pid != old && is_node1_driver(c))
    })
    .await;
    let log = std::fs::read_to_string(data_dir.join(format!("logs/{DRIVER}-node-1.log"))).unwrap();
    assert_eq!(log.matches("--- csi-cluster").count(), 2, "{log}");

    cluster.kubectl(&["delete", "pod", "ext-pod", "--timeout=120s"], None);
    test_support::eventually("the VolumeAttachment gone", PATIENCE, || async {
        volume_attachments(&cluster).is_empty().then_some(())
    })
    .await;
    cluster.kubectl(&["delete", "pvc", "ext-claim", "--timeout=120s"], None);
    test_support::eventually("the PV and the volume deleted", PATIENCE, || async {
        let pvs = cluster.get_json(&["get", "pv"]);
        (pvs["items"].as_array()?.is_empty() && !stored.exists()).then_some(())
    })
    .await;

    let exit = cluster.terminate().await;
    if !exit.success() {
        cluster.print_output();
    }
    assert!(exit.success(), "csi-cluster up ended with {exit}");
    // A SIGKILLed process takes a moment to be gone after kill(2) returned.
    test_support::eventually(
        "no plugin process left",
        std::time::Duration::from_secs(5),
        || async { plugin_processes(&data_dir).is_empty().then_some(()) },
    )
    .await;
    assert_eq!(
        mounts_below(&data_dir),
        Vec::<PathBuf>::new(),
        "mounts left"
    );
    assert_eq!(
        sockets_below(&data_dir),
        Vec::<PathBuf>::new(),
        "sockets left"
    );
}

#[tokio::test]
async fn a_bad_driver_flag_is_refused_naming_it() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
        .args([
            "up",
            "--data-dir",
            "/nonexistent/csi-cluster",
            "--driver",
            "foo",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--driver foo: want NAME=COMMAND"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
        .args([
            "up",
            "--data-dir",
            "/nonexistent/x",
            "--driver",
            "a.com=/bin/d {nodeid}",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown placeholder {nodeid}"), "{err}");
}

/// Takes down whatever a failed `up` left below the data dir, also when an assertion failed.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        test_support::unmount_all_below(&self.0);
        for (dev, _) in common::loop_devices_below(&self.0) {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(dev)
                .status();
        }
    }
}

/// `csi-cluster up ARGS` on `data_dir` run to its end (killed after PATIENCE): (success,
/// output).
fn up_to_the_end(data_dir: &Path, args: &[&str]) -> (bool, String) {
    let out = data_dir.with_extension("out");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
        .args([
            "up",
            "--timing",
            "fast",
            "--port",
            "0",
            "--nodes",
            "1",
            "--data-dir",
        ])
        .arg(data_dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(out.with_extension("err")).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("csi-cluster up {args:?} still runs after {PATIENCE:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&out).unwrap()
        + &std::fs::read_to_string(out.with_extension("err")).unwrap();
    (status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_with_another_name_or_one_that_exits_fails_up_and_leaves_nothing() {
    if !can_run() {
        return;
    }
    let Some(bin) = hostpath_binary() else {
        test_support::skip_or_fail(
            "the hostpath-csi-driver binary is not built next to the tests: run `cargo build -p hostpath-driver` first",
        );
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let _cleanup = Cleanup(data_dir.clone());
    // No --drivername: the plugin calls itself hostpath.csi.k8s.io, the built-in driver. Its
    // shell ignores SIGTERM and waits for a `sleep` that ignores it too, so only the SIGKILL
    // after the grace period ends them: the failed `up` must wait for that before it exits.
    let unnamed = format!(
        "other.example.com=trap '' TERM; {} --endpoint {{endpoint}} --node-id {{node}} --state-dir {{state-dir}} & sleep 300; echo done",
        bin.display()
    );
    let (ok, out) = up_to_the_end(&data_dir, &["--driver", &unnamed]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("--driver other.example.com: ")
            && out.contains("reports the driver name \"hostpath.csi.k8s.io\""),
        "{out}"
    );
    let data_dir = data_dir.canonicalize().unwrap();
    // A SIGKILLed process takes a moment to be gone after kill(2) returned.
    test_support::eventually(
        "no plugin process left",
        std::time::Duration::from_secs(5),
        || async { processes_naming(&data_dir).is_empty().then_some(()) },
    )
    .await;
    assert_eq!(mounts_below(&data_dir), Vec::<PathBuf>::new());
    assert_eq!(sockets_below(&data_dir), Vec::<PathBuf>::new());

    let (ok, out) = up_to_the_end(
        &data_dir,
        &["--driver", "crash.example.com=echo no luck; exit 3"],
    );
    assert!(!ok, "{out}");
    assert!(out.contains("exited right after it started"), "{out}");
    let log =
        std::fs::read_to_string(data_dir.join("logs/crash.example.com-controller.log")).unwrap();
    assert!(log.contains("no luck"), "{log}");
    assert_eq!(sockets_below(&data_dir), Vec::<PathBuf>::new());
}
