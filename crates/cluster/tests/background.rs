//! `csi-cluster up --background` (the real binary): it returns once the cluster is ready,
//! printing the summary and the ready line; the cluster keeps running detached (its own
//! session, output in DATA_DIR/logs/up.out), `csi-cluster status` works against it, a second
//! `up --background` on the same data dir fails with the running cluster's pid in the printed
//! output tail, and `csi-cluster down` stops it leaving no process, mount, loop device or socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{can_run, loop_devices_below, mounts_below, sockets_below};

/// Kills the backgrounded cluster (from its pid file) and cleans below the data dir if the
/// test ends before `down` did.
struct Guard {
    data_dir: PathBuf,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(pid) = pid(&self.data_dir)
            && alive(pid)
        {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        test_support::unmount_all_below(&self.data_dir);
        for (dev, _) in loop_devices_below(&self.data_dir) {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

fn pid(data_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(data_dir.join("csi-cluster.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

fn cli(args: &[&str], data_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_background_returns_when_ready_and_down_stops_it() {
    if !can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let _guard = Guard {
        data_dir: data_dir.clone(),
    };
    let up = ["up", "--background", "--nodes", "1", "--port", "0"];
    let out = cli(&up, &data_dir);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains(cluster::READY_LINE), "{said}");
    assert!(said.contains("  API server  https://127.0.0.1:"), "{said}");
    assert!(
        said.contains("csi-cluster runs in the background"),
        "{said}"
    );
    assert!(said.contains("csi-cluster down --data-dir"), "{said}");

    // The `up --background` process has ended; the cluster runs on, in its own session.
    let pid = pid(&data_dir).expect("pid file");
    assert!(alive(pid), "the cluster process {pid} is gone");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // Fields after the name: state, ppid, pgrp, session.
    assert_eq!(fields[3], pid.to_string(), "not a session leader: {stat}");
    let up_out = std::fs::read_to_string(data_dir.join("logs/up.out")).unwrap();
    assert!(up_out.contains(cluster::READY_LINE), "{up_out}");

    let status = cli(&["status"], &data_dir);
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains("node-0"), "{}", text(&status));

    // A second one on the same data dir: its process ends at once, and the reason is shown.
    let again = cli(&up, &data_dir);
    let said = text(&again);
    assert!(!again.status.success(), "{said}");
    assert!(said.contains(&format!("pid {pid}")), "{said}");
    assert!(said.contains("ended"), "{said}");
    assert!(alive(pid), "the first cluster must keep running");

    let down = cli(&["down", "--timeout", "120"], &data_dir);
    assert!(down.status.success(), "{}", text(&down));
    assert!(!alive(pid), "pid {pid} still runs after down");
    let up_out = std::fs::read_to_string(data_dir.join("logs/up.out")).unwrap();
    assert!(up_out.contains("stopped in"), "{up_out}");
    assert!(
        mounts_below(&data_dir).is_empty(),
        "{:?}",
        mounts_below(&data_dir)
    );
    assert!(loop_devices_below(&data_dir).is_empty());
    assert!(
        sockets_below(&data_dir).is_empty(),
        "{:?}",
        sockets_below(&data_dir)
    );
    assert!(!data_dir.join("csi-cluster.pid").exists());
}
