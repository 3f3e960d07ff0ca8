//! `csi-cluster demo migration`: seed 003's upgrade and downgrade walkthrough.

use crate::Error;

/// `csi-cluster demo migration` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct MigrationFlags {}

/// Runs the walkthrough.
pub async fn run(_flags: MigrationFlags) -> Result<(), Error> {
    Err(Error::Config(
        "csi-cluster demo migration is being built".into(),
    ))
}
