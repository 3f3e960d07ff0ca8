//! The EBS side of the provisioning tests: ec2-sim, the EBS driver's controller service with
//! its own EC2 client, an EC2 client for the PV controller's in-tree provisioner, and what
//! "EC2" holds, read from ec2-sim's state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ebs_cloud::CloudMetrics;
use ebs_cloud_aws::AwsCloud;
use ec2_sim::{Backing, SimConfig, Simulator, Timing};
use kube::Client;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::provisioning::{
    CLUSTER_NAME, CancelOnDrop, Objects, Provisioner, Task, init_tracing, provisioner_options,
    pv_controller_options, start_provisioner, start_pv_controller,
};
use super::{DriverTask, aws_config, start_driver_tagging};

/// One EBS volume as ec2-sim stores it (`STATE/state.json`, written atomically after every
/// change): what exists in "EC2", whoever created it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SimVolume {
    pub id: String,
    pub size_gib: u64,
    pub zone: String,
    pub volume_type: String,
    pub iops: Option<u32>,
    pub encrypted: bool,
    pub kms_key_id: Option<String>,
    pub tags: Vec<(String, String)>,
    /// Set once DeleteVolume was called (the volume is `deleting`, then gone).
    pub deleted_ms: Option<u64>,
}

impl SimVolume {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn tag_map(&self) -> BTreeMap<String, String> {
        self.tags.iter().cloned().collect()
    }
}

#[derive(Deserialize)]
struct SimState {
    #[serde(default)]
    volumes: BTreeMap<String, SimVolume>,
}

/// The volumes in ec2-sim's state that DeleteVolume was not called for.
pub fn live_volumes(state_dir: &Path) -> Vec<SimVolume> {
    let bytes = match std::fs::read(state_dir.join("state.json")) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("reading ec2-sim's state: {e}"),
    };
    let state: SimState = serde_json::from_slice(&bytes).unwrap();
    state
        .volumes
        .into_values()
        .filter(|v| v.deleted_ms.is_none())
        .collect()
}

/// ec2-sim, the EBS driver's controller service on a unix socket (its own EC2 client), an
/// EC2 client for the PV controller's in-tree provisioner, and apiserver-lite.
pub struct EbsWorld {
    _stop: CancelOnDrop,
    _driver: DriverTask,
    pub server: apiserver::RunningApiServer,
    pub kube: Client,
    pub sim: Simulator,
    pub endpoint: String,
    pub state_dir: PathBuf,
    /// The PV controller's EC2 client and its call counts (only the in-tree plugin uses it).
    pub in_tree_cloud: Arc<AwsCloud>,
    pub in_tree_ec2: CloudMetrics,
    pub dir: tempfile::TempDir,
}

impl EbsWorld {
    pub async fn start() -> Self {
        init_tracing();
        apiserver::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("ec2");
        let sim = Simulator::start(
            SimConfig {
                state_dir: state_dir.clone(),
                timing: Timing::Fast,
                backing: Backing::File,
                ..SimConfig::default()
            },
            ([127, 0, 0, 1], 0).into(),
        )
        .await
        .unwrap();
        let aws = aws_config(&sim.endpoint());
        let in_tree_ec2 = CloudMetrics::new();
        let in_tree_cloud = Arc::new(
            AwsCloud::new(aws.clone(), in_tree_ec2.clone())
                .await
                .unwrap(),
        );
        let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
        // Tagged as the in-tree plugin tags (kcm's default --cluster-name), so the two paths'
        // volumes compare equal.
        let driver = start_driver_tagging(&endpoint, aws, Some(CLUSTER_NAME)).await;
        let server = apiserver::ApiServer::start(apiserver::Config {
            listen: ([127, 0, 0, 1], 0).into(),
            ..apiserver::Config::default()
        })
        .await
        .unwrap();
        let kube = server.client();
        Self {
            _stop: CancelOnDrop(CancellationToken::new()),
            _driver: driver,
            server,
            kube,
            sim,
            endpoint,
            state_dir,
            in_tree_cloud,
            in_tree_ec2,
            dir,
        }
    }

    pub fn volumes(&self) -> Vec<SimVolume> {
        live_volumes(&self.state_dir)
    }

    /// The live EC2 volumes named (tag `CSIVolumeName`) `name`.
    pub fn volumes_named(&self, name: &str) -> Vec<SimVolume> {
        self.volumes()
            .into_iter()
            .filter(|v| v.tag("CSIVolumeName") == Some(name))
            .collect()
    }

    /// EC2 CreateVolume calls ec2-sim answered (from anyone).
    pub fn ec2_creates(&self) -> u64 {
        self.sim
            .call_counts()
            .get("CreateVolume")
            .copied()
            .unwrap_or(0)
    }

    pub async fn provisioner(&self) -> Provisioner {
        start_provisioner(self.kube.clone(), &self.endpoint, provisioner_options()).await
    }

    /// The PV controller with `feature_gates` and, when `in_tree_cloud`, EC2 for the in-tree
    /// aws-ebs plugin.
    pub async fn pv_controller(
        &self,
        feature_gates: &str,
        in_tree_cloud: bool,
    ) -> Task<pv_controller::Error> {
        let cloud: Option<Arc<dyn ebs_cloud::Cloud>> = if in_tree_cloud {
            Some(self.in_tree_cloud.clone())
        } else {
            None
        };
        start_pv_controller(&self.server, pv_controller_options(feature_gates), cloud).await
    }

    pub fn objects(&self) -> Objects {
        Objects {
            kube: self.kube.clone(),
        }
    }
}
