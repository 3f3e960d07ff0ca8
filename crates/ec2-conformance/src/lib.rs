//! Harness for the EC2/EBS conformance suite: the real `aws-sdk-ec2` client pointed at
//! ec2-sim (strict, behaves like AWS) or at `moto_server` (lenient), guards that start and stop
//! those endpoints, polling helpers, and guards for the loop-device / mount tests.
//!
//! The tests under `tests/` drive every action and error code of ec2-sim through the SDK, and
//! run the shared scenarios against both endpoints; `docs/ec2-moto-differences.md` records
//! where moto is looser than AWS.

pub mod block;
pub mod client;
pub mod errors;
pub mod moto;
pub mod sim;
pub mod wait;

use std::path::PathBuf;
use std::time::Duration;

pub use client::{ClientOptions, Retries, client, client_with};
pub use errors::{Ec2Failure, expect_code, failure};
pub use moto::{MotoServer, find_moto_server};
pub use sim::SimServer;

/// The region every endpoint is started in (moto's and ec2-sim's default).
pub const REGION: &str = "us-east-1";

/// Which endpoint a shared scenario runs against, and so what it expects where moto is looser
/// than AWS. ec2-sim is expected to behave like AWS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// ec2-sim: strict, timed, like AWS.
    Aws,
    /// moto_server: accepts what AWS rejects, changes state instantly.
    Moto,
}

impl Flavor {
    pub fn is_aws(self) -> bool {
        self == Flavor::Aws
    }
}

/// Errors of the harness (the tests themselves fail by assertion).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "moto_server not found: looked in $CSI_RS_VENV/bin, on PATH and in \
         $HOME/.cache/csi-rs-venv/bin (run scripts/setup)"
    )]
    MotoNotFound,
    #[error("starting {program}: {source}", program = program.display())]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("moto_server exited early ({status}); its log ends with:\n{log}")]
    MotoExited { status: String, log: String },
    #[error(
        "moto_server at {endpoint} did not answer within {waited:?}; its log ends with:\n{log}"
    )]
    MotoNotReady {
        endpoint: String,
        waited: Duration,
        log: String,
    },
    #[error("ec2-sim: {0}")]
    Sim(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },
    #[error("EC2 {action} failed: {detail}")]
    Ec2 { action: String, detail: String },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
}
