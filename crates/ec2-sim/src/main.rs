//! `ec2-sim`: serve the simulated EC2 endpoint until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use ec2_sim::{
    Backing, Credentials, DEFAULT_MAX_ATTACHMENTS, DeviceLayout, Faults, SimConfig, Timing,
};

/// The environment variables of one access key (the secret is never a flag, so it stays out
/// of `ps`).
const ENV_ACCESS_KEY_ID: &str = "EC2_SIM_ACCESS_KEY_ID";
const ENV_SECRET_ACCESS_KEY: &str = "EC2_SIM_SECRET_ACCESS_KEY";

/// An EC2-compatible endpoint for the EBS subset (volumes, attachments, snapshots,
/// modifications, instances), strict like AWS, backed by sparse files or loop devices.
///
/// Every EC2 request must be signed (AWS Signature Version 4) with an accepted key: those of
/// --credentials-file, and the pair in EC2_SIM_ACCESS_KEY_ID / EC2_SIM_SECRET_ACCESS_KEY. With
/// neither, the pair in STATE_DIR/credentials is used, generated at random (mode 0600, AWS
/// shared-credentials format: point AWS_SHARED_CREDENTIALS_FILE at it) when missing.
#[derive(Debug, Parser)]
#[command(name = "ec2-sim", version)]
struct Args {
    /// Address to serve on; port 0 picks a free port (printed in the log).
    #[arg(long, default_value = "127.0.0.1:8787", env = "EC2_SIM_LISTEN")]
    listen: SocketAddr,
    /// Directory for state.json, volume images and snapshot images (created if missing).
    #[arg(long, env = "EC2_SIM_STATE_DIR")]
    state_dir: PathBuf,
    /// `file`: sparse images only; `loop`: attachments are real loop devices (needs root).
    #[arg(long, default_value = "file", value_parser = parse_backing)]
    backing: Backing,
    /// How long state changes take: instant, fast (tens of ms) or realistic (AWS medians).
    #[arg(long, default_value = "fast", value_parser = parse_timing)]
    timing: Timing,
    /// Region name.
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Availability zones, comma separated (default: REGION + a, b, c).
    #[arg(long, value_delimiter = ',')]
    zones: Vec<String>,
    /// Fault injection as JSON, or @FILE to read it from a file (see docs/ec2-sim.md).
    #[arg(long)]
    fault: Option<String>,
    /// Where attachment symlinks go (default: STATE_DIR/dev).
    #[arg(long)]
    device_dir: Option<PathBuf>,
    /// Put each instance's links in DEVICE_DIR/<instance-id>/ (xvdba, disk/by-id/...), so
    /// every instance is a node with its own --dev-root and device names never collide
    /// across instances; without it all instances share DEVICE_DIR.
    #[arg(long)]
    per_instance_device_dirs: bool,
    /// Volumes attachable to one instance.
    #[arg(long, default_value_t = DEFAULT_MAX_ATTACHMENTS)]
    max_attachments: usize,
    /// Extra KMS keys that exist (IDs, ARNs or aliases); alias/aws/ebs always exists.
    #[arg(long = "kms-key")]
    kms_keys: Vec<String>,
    /// Accepted access keys: an AWS shared-credentials file (every profile's
    /// aws_access_key_id / aws_secret_access_key). See also EC2_SIM_ACCESS_KEY_ID and
    /// EC2_SIM_SECRET_ACCESS_KEY (environment only); with neither, STATE_DIR/credentials.
    #[arg(long, env = "EC2_SIM_CREDENTIALS_FILE")]
    credentials_file: Option<PathBuf>,
}

/// The accepted keys: the file's and the environment's pair, else STATE_DIR/credentials
/// (generated when missing).
fn credentials(
    file: Option<&std::path::Path>,
    env_pair: (Option<String>, Option<String>),
    state_dir: &std::path::Path,
) -> anyhow::Result<Credentials> {
    let mut creds = Credentials::empty();
    if let Some(path) = file {
        creds = Credentials::from_file(path).context("--credentials-file")?;
        tracing::info!(file = %path.display(), keys = ?creds, "accepting the keys of the credentials file");
    }
    match env_pair {
        (Some(id), Some(secret)) if !id.is_empty() && !secret.is_empty() => {
            tracing::info!(access_key_id = %id, "accepting the key of {ENV_ACCESS_KEY_ID}");
            creds.insert(id, secret);
        }
        (None, None) => {}
        _ => anyhow::bail!(
            "{ENV_ACCESS_KEY_ID} and {ENV_SECRET_ACCESS_KEY} must be set together, both non-empty"
        ),
    }
    if creds.is_empty() {
        let (generated, path, new) =
            Credentials::load_or_generate(state_dir).context("credentials in the state dir")?;
        let id = generated.first().map(|(id, _)| id).unwrap_or("");
        if new {
            tracing::info!(file = %path.display(), access_key_id = id, "no credentials given: generated a key pair (AWS shared-credentials format; use AWS_SHARED_CREDENTIALS_FILE)");
        } else {
            tracing::info!(file = %path.display(), access_key_id = id, "no credentials given: using the key pair saved in the state dir");
        }
        creds = generated;
    }
    Ok(creds)
}

fn parse_backing(s: &str) -> Result<Backing, String> {
    s.parse().map_err(|e: ec2_sim::Error| e.to_string())
}

fn parse_timing(s: &str) -> Result<Timing, String> {
    s.parse().map_err(|e: ec2_sim::Error| e.to_string())
}

fn config(args: Args) -> anyhow::Result<SimConfig> {
    let faults = match args.fault.as_deref() {
        None => Faults::default(),
        Some(spec) => {
            let text = match spec.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path)
                    .with_context(|| format!("--fault: cannot read {path}"))?,
                None => spec.to_string(),
            };
            Faults::from_json(&text).context("--fault")?
        }
    };
    let zones = if args.zones.is_empty() {
        ["a", "b", "c"]
            .iter()
            .map(|s| format!("{}{s}", args.region))
            .collect()
    } else {
        args.zones
    };
    let mut kms_keys = SimConfig::default().kms_keys;
    kms_keys.extend(args.kms_keys);
    let credentials = credentials(
        args.credentials_file.as_deref(),
        (
            std::env::var(ENV_ACCESS_KEY_ID).ok(),
            std::env::var(ENV_SECRET_ACCESS_KEY).ok(),
        ),
        &args.state_dir,
    )?;
    Ok(SimConfig {
        state_dir: args.state_dir,
        region: args.region,
        zones,
        timing: args.timing,
        backing: args.backing,
        device_dir: args.device_dir,
        device_layout: if args.per_instance_device_dirs {
            DeviceLayout::PerInstance
        } else {
            DeviceLayout::Shared
        },
        faults,
        max_attachments_per_instance: args.max_attachments,
        kms_keys,
        credentials,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Info unless RUST_LOG says otherwise; on stderr.
    telemetry::init_logging(0);
    // Handlers installed now, so a signal that arrives while the simulator starts is not lost.
    let shutdown = telemetry::shutdown_on_signals();
    let listen = args.listen;
    let config = config(args)?;
    ec2_sim::run(config, listen, shutdown.cancelled_owned()).await?;
    Ok(())
}
