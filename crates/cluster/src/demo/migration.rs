//! `csi-cluster demo migration`: the migration design's upgrade and downgrade walkthrough
//! (docs/design/migration.md) on a throw-away one-node cluster, each step with its time, what it
//! proves, which path (in-tree or CSI) served each operation (from the components' counters) and
//! the data read back.

pub mod paths;

/// Moved to `demo::observe` (the lifecycle demo uses it too); kept here for its users.
pub use super::observe;
pub mod walkthrough;

use std::path::PathBuf;
use std::time::Duration;

use self::paths::Op;
use self::walkthrough::StepRecord;
use super::narrator::Narrator;
use crate::config::Migration;
use crate::{Error, RunningCluster, UpConfig};

/// How long any one step may take (realistic timing: EC2 calls of seconds each).
const PATIENCE: Duration = Duration::from_secs(180);

/// The line the demo ends with when every step went as the migration design says.
pub const DONE_LINE: &str = "csi-cluster demo migration: done";

/// `csi-cluster demo migration` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct MigrationFlags {
    /// How long EC2 state changes take: fast or realistic (AWS's medians).
    #[arg(long, default_value = "fast", value_name = "fast|realistic")]
    pub timing: ec2_sim::Timing,

    /// The cluster's data dir. Default: a new directory under /var/tmp, removed at the end.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// Runs the walkthrough; Ctrl-C or SIGTERM stops it and its cluster cleanly.
pub async fn run(flags: MigrationFlags) -> Result<(), Error> {
    crate::require_real_timing(flags.timing)?;
    crate::require_root("demo migration")?;
    let (data_dir, ephemeral) = super::data_dir(flags.data_dir.as_deref())?;
    let mut config = UpConfig::new(1, &data_dir);
    config.timing = flags.timing;
    config.zones = 1;
    config.port = Some(0);
    // The migration design's upgrade starts from a cluster that migrated nothing.
    config.migration = Migration {
        controller: false,
        node: false,
    };
    let shutdown = component_runtime::shutdown_on_signals();
    let mut n = Narrator::new();
    println!(
        "csi-cluster demo migration: the migration design's upgrade and downgrade (docs/design/migration.md) on one node, {} (EC2 timing {:?})",
        data_dir.display(),
        config.timing
    );
    n.step(
        "start a one-node cluster with CSIMigrationAWS off on the controller side and on the node",
    );
    let started = RunningCluster::start(config).await;
    let cluster = match started {
        Ok(c) => c,
        Err(e) => return Err(remove_data_dir(e, &data_dir, ephemeral)),
    };
    let outcome = tokio::select! {
        r = async {
            cluster.wait_ready().await?;
            let node = cluster.node_names().first().cloned().unwrap_or_else(|| "node-0".into());
            n.show(format!("{node} Ready; kubectl --kubeconfig {} get pv,pvc,pods,volumeattachments,csinodes", cluster.kubeconfig().display()));
            walkthrough::upgrade_and_downgrade(&cluster, &node, "demo", &mut n, PATIENCE).await
        } => Some(r),
        () = shutdown.cancelled() => None,
    };
    n.step("stop the cluster");
    let stopped = cluster.stop().await;
    let steps = match outcome {
        None => Err(Error::Interrupted(
            "the cluster was stopped and cleaned".into(),
        )),
        Some(r) => r,
    };
    let steps = match (steps, stopped) {
        (Err(e), _) | (Ok(_), Err(e)) => return Err(remove_data_dir(e, &data_dir, ephemeral)),
        (Ok(s), Ok(())) => s,
    };
    n.proves("no mount, loop device, socket or task left below the data dir");
    if ephemeral {
        std::fs::remove_dir_all(&data_dir)
            .map_err(|e| Error::io("removing the demo's data dir", &data_dir, e))?;
    }
    println!();
    print_table(&steps);
    println!();
    println!(
        "{DONE_LINE}, {} steps in {:.1} s; every operation served by exactly one path, the data intact.",
        n.steps(),
        n.elapsed_secs()
    );
    Ok(())
}

/// One line per step: who served each operation, how the volume was mounted, the data check.
fn print_table(steps: &[StepRecord]) {
    println!(
        "{:<44} {:<9} {:<9} {:<9} {:<9} {:<9} {:<9} data",
        "step", "provision", "attach", "mount", "unmount", "detach", "delete"
    );
    for s in steps {
        let cell = |op| match s.path(op) {
            paths::Path::Neither => "-".to_string(),
            p => p.to_string(),
        };
        println!(
            "{:<44} {:<9} {:<9} {:<9} {:<9} {:<9} {:<9} {}",
            s.title,
            cell(Op::Provision),
            cell(Op::Attach),
            cell(Op::Mount),
            cell(Op::Unmount),
            cell(Op::Detach),
            cell(Op::Delete),
            if s.data_checked {
                "read back"
            } else {
                "not mounted"
            }
        );
    }
}

/// A failed demo still removes its own temporary data dir when nothing is mounted there.
fn remove_data_dir(e: Error, data_dir: &std::path::Path, ephemeral: bool) -> Error {
    if ephemeral && crate::teardown::mounts_below(data_dir).is_empty() {
        let _ = std::fs::remove_dir_all(data_dir);
    }
    e
}
