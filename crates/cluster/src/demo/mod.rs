//! `csi-cluster demo`: volumes through the whole lifecycle on a throw-away cluster, each step
//! printed with its time and what it proves; `demo migration`: seed 003's upgrade and
//! downgrade walkthrough.

pub mod migration;

use crate::Error;

/// `csi-cluster demo` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoFlags {
    #[command(subcommand)]
    pub which: Option<Which>,
}

/// Which demo (default: the volume lifecycle).
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Which {
    /// Seed 003's upgrade (in-tree → controller migrated → node drained → node migrated) and
    /// downgrade, the data checked at each step, which path served each operation printed.
    Migration(migration::MigrationFlags),
}

/// Runs the demo.
pub async fn run(flags: DemoFlags) -> Result<(), Error> {
    match flags.which {
        Some(Which::Migration(m)) => migration::run(m).await,
        None => Err(Error::Config("csi-cluster demo is being built".into())),
    }
}
