//! `csi-cluster demo`: volumes through the whole lifecycle on a throw-away cluster, each step
//! printed with its time and what it proves; `demo migration`: the upgrade and
//! downgrade walkthrough of the migration design (docs/design/migration.md).

mod lifecycle;
pub mod migration;
pub mod narrator;
pub mod observe;

use std::path::{Path, PathBuf};

use crate::Error;

/// `csi-cluster demo` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoFlags {
    #[command(subcommand)]
    pub which: Option<Which>,

    /// How many nodes (at least 3 shows the volume on three different nodes).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub nodes: usize,

    /// How long EC2 state changes take: fast or realistic (AWS's medians).
    #[arg(long, default_value = "fast", value_name = "fast|realistic")]
    pub timing: ec2_sim::Timing,

    /// The cluster's data dir. Default: a new directory under /var/tmp, removed at the end.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// Which demo (default: the volume lifecycle).
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Which {
    /// The migration design's upgrade (in-tree → controller migrated → node drained → node
    /// migrated) and downgrade, the data checked at each step, which path served each operation
    /// printed.
    Migration(migration::MigrationFlags),
}

/// Runs the demo; Ctrl-C or SIGTERM stops it and its cluster cleanly.
pub async fn run(flags: DemoFlags) -> Result<(), Error> {
    if !(1..=100).contains(&flags.nodes) {
        return Err(Error::Config(format!(
            "--nodes must be between 1 and 100, got {}",
            flags.nodes
        )));
    }
    match flags.which {
        // It checks its own flags and names itself when not root.
        Some(Which::Migration(m)) => migration::run(m).await,
        None => {
            crate::require_real_timing(flags.timing)?;
            crate::require_root("demo")?;
            lifecycle::run(flags, component_runtime::shutdown_on_signals()).await
        }
    }
}

/// The data dir to use: the given one (kept), or a new one under /var/tmp (removed at the
/// end: the `bool`).
pub(crate) fn data_dir(given: Option<&Path>) -> Result<(PathBuf, bool), Error> {
    if let Some(dir) = given {
        return Ok((dir.to_path_buf(), false));
    }
    let base = Path::new("/var/tmp");
    let dir = tempfile::Builder::new()
        .prefix("csi-cluster-demo-")
        .tempdir_in(base)
        .map_err(|e| Error::io("creating a data dir in", base, e))?;
    Ok((dir.keep(), true))
}
