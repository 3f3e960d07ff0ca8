//! `--embedded-ec2 DIR`: ec2-sim in this process (loop-device backing when possible), and this
//! machine registered in it as an instance, so `--mode all` is a complete driver on a laptop.

use std::path::{Path, PathBuf};

use ebs_cloud_aws::AwsCloud;
use ec2_sim::{Backing, SimConfig, Simulator, Timing};

use crate::{Error, Result};

/// The running simulator and what the driver needs from it.
#[derive(Debug)]
pub struct Embedded {
    pub sim: Simulator,
    pub region: String,
    /// Where the sim puts attachment links (the node's device root).
    pub device_dir: PathBuf,
    /// The key pair the simulator accepts (and the driver signs with): random, kept in
    /// `DIR/credentials` (0600, AWS shared-credentials format) across restarts.
    pub credentials: ec2_sim::Credentials,
}

/// Whether loop devices can be had (root and /dev/loop-control).
pub fn loop_devices_available() -> bool {
    Path::new("/dev/loop-control").exists() && rustix::process::geteuid().is_root()
}

/// Starts the simulator on 127.0.0.1 with its state in `dir`.
pub async fn start(dir: &Path, timing: Timing) -> Result<Embedded> {
    let backing = if loop_devices_available() {
        Backing::Loop
    } else {
        tracing::warn!(
            "not root or no /dev/loop-control: the embedded EC2 attaches volumes as files only, so the node service cannot stage them"
        );
        Backing::File
    };
    let (credentials, file, new) = ec2_sim::Credentials::load_or_generate(dir)
        .map_err(|e| Error::Internal(format!("embedded ec2-sim credentials: {e}")))?;
    if new {
        tracing::info!(file = %file.display(), "embedded EC2: generated a key pair (AWS shared-credentials format; use AWS_SHARED_CREDENTIALS_FILE)");
    }
    let config = SimConfig {
        state_dir: dir.to_path_buf(),
        credentials: credentials.clone(),
        timing,
        backing,
        ..SimConfig::default()
    };
    let region = config.region.clone();
    let device_dir = config.device_dir();
    let sim = Simulator::start(config, ([127, 0, 0, 1], 0).into())
        .await
        .map_err(|e| Error::Internal(format!("embedded ec2-sim in {}: {e}", dir.display())))?;
    tracing::info!(endpoint = %sim.endpoint(), dir = %dir.display(), "embedded EC2 started");
    Ok(Embedded {
        sim,
        region,
        device_dir,
        credentials,
    })
}

/// This machine's instance in the simulator: the ID saved in `DIR/instance-id` if the sim still
/// knows it, else a new one from RunInstances (with a client token from the host name, so a
/// crash between the call and the save cannot make two).
pub async fn register_instance(cloud: &AwsCloud, dir: &Path) -> Result<ebs_cloud::Instance> {
    use ebs_cloud::Cloud;
    let file = dir.join("instance-id");
    if let Ok(saved) = std::fs::read_to_string(&file) {
        let id = saved.trim();
        match cloud.get_instance(id).await {
            Ok(i) if i.state != "terminated" && i.state != "shutting-down" => return Ok(i),
            Ok(_) | Err(ebs_cloud::CloudError::NotFound { .. }) => {
                tracing::warn!(instance_id = id, "saved instance is gone; registering anew");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let mut instance = cloud
        .run_instance(
            &ebs_cloud::client_token(&format!("embedded-node/{host}")),
            None,
        )
        .await?;
    if instance.state == "terminated" || instance.state == "shutting-down" {
        // Someone terminated the instance the token names: a new token makes a new one.
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        instance = cloud
            .run_instance(
                &ebs_cloud::client_token(&format!("embedded-node/{host}/{nonce}")),
                None,
            )
            .await?;
    }
    std::fs::write(&file, format!("{}\n", instance.instance_id))
        .map_err(|e| Error::io("writing", &file, e))?;
    tracing::info!(instance_id = %instance.instance_id, zone = %instance.zone, "registered this machine in the embedded EC2");
    Ok(instance)
}
