//! ec2-sim: an EC2-compatible endpoint for the EBS subset of the API.
//!
//! Strict like AWS (client tokens, attachment rules, parameter limits), timed like AWS when
//! asked, with fault injection, and backed by sparse files and (as root) loop devices so that
//! attached volumes can really be formatted and mounted. See `docs/ec2-sim.md`.

mod actions;
mod auth;
mod backing;
mod config;
mod engine;
mod history;
mod ids;
mod limits;
mod links;
mod metrics;
mod model;
mod query;
mod render;
mod server;
mod store;
mod xml;

use std::path::PathBuf;

pub use auth::{
    CREDENTIALS_FILE, Credentials, DEFAULT_ACCESS_KEY_ID, DEFAULT_SECRET_ACCESS_KEY,
    MAX_CLOCK_SKEW, sign_post, sign_request,
};
pub use config::{
    Backing, DEFAULT_KMS_ALIAS, DEFAULT_MAX_ATTACHMENTS, DeviceLayout, Faults, SimConfig, Throttle,
    Timing, instance_device_dir,
};
pub use history::{
    AttachmentEvent, AttachmentHistory, AttachmentState, HISTORY_CAPACITY, MultiHolder,
};
pub use server::{Simulator, run};

/// The EC2 actions the simulator implements.
pub fn supported_actions() -> &'static [&'static str] {
    engine::ACTIONS
}

/// The by-id symlink name of a volume under `device_dir/disk/by-id/` (with
/// [`DeviceLayout::PerInstance`], under `instance_device_dir(device_dir, instance)/disk/by-id/`).
pub fn by_id_link_name(volume_id: &str) -> String {
    backing::by_id_name(volume_id)
}

/// Errors starting, running or stopping the simulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state file {}: {source}", path.display())]
    State {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("loop device: {0}")]
    Loop(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("server: {0}")]
    Server(String),
}
