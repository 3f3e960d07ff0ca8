//! `csictl`: a CSI command-line client for any driver on a unix socket (every Identity,
//! Controller and Node call; responses as text or protobuf's canonical JSON), and `csictl demo`
//! (with the `demo` feature, on by default: the EBS driver on its embedded EC2 in this process,
//! one volume walked through its life). See docs/ebs-driver.md, "csictl".

#[cfg(feature = "demo")]
pub mod demo;
pub mod json;

use std::collections::HashMap;
use std::path::PathBuf;

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use tonic::transport::Channel;

/// The publish context key that carries the device path (`stage --device-path`,
/// `node-publish --device-path`): the EBS driver's key, which other block drivers share.
pub const DEVICE_PATH_KEY: &str = "devicePath";

/// The topology key `create --zone` asks for: the EBS driver's zone key.
pub const TOPOLOGY_ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";

/// What can fail in csictl.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint could not be dialled.
    #[error(transparent)]
    Endpoint(csi_spec::Error),

    /// A CSI call failed: its status code and message.
    #[error("{code}: {message}")]
    Rpc { code: String, message: String },

    /// A flag is not valid, or this build cannot do what it asks.
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },

    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Something that should not happen (a message missing from csi.proto), or a check of
    /// `csictl demo` that failed.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    #[cfg_attr(not(feature = "demo"), allow(dead_code))]
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Why `csictl demo` fails in a build without the `demo` feature.
pub const NO_DEMO: &str = "this csictl has no demo (built without the demo feature, which links the EBS driver and its embedded EC2)";

/// How responses are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Rust's debug rendering of the response, for people.
    Text,
    /// Protobuf's canonical JSON mapping (camelCase names), for scripts.
    Json,
}

/// A CSI client for any driver socket.
#[derive(Debug, clap::Parser)]
#[command(
    name = "csictl",
    version,
    about = "A CSI client for any driver on a unix socket"
)]
pub struct Cli {
    /// The driver's CSI endpoint: unix:///path/to/csi.sock or a plain path.
    #[arg(
        long,
        short = 'e',
        env = "CSI_ENDPOINT",
        default_value = "unix:///var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock",
        global = true
    )]
    pub endpoint: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "text", global = true)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

/// Volume capability flags shared by several commands.
#[derive(Debug, Clone, clap::Args)]
pub struct CapabilityArgs {
    /// Raw block access instead of a filesystem.
    #[arg(long)]
    pub block: bool,
    /// Filesystem type for mount access (empty: the driver's default).
    #[arg(long, default_value = "")]
    pub fs_type: String,
    /// Mount flags (repeat the flag for several).
    #[arg(long = "mount-flag")]
    pub mount_flags: Vec<String>,
    /// Access mode.
    #[arg(long, default_value = "single-node-writer", value_parser = parse_mode)]
    pub mode: Mode,
}

fn parse_mode(s: &str) -> std::result::Result<Mode, String> {
    let upper = s.replace('-', "_").to_ascii_uppercase();
    Mode::from_str_name(&upper).ok_or_else(|| {
        format!("'{s}' is not an access mode (e.g. single-node-writer, single-node-reader-only)")
    })
}

fn parse_kv(s: &str) -> std::result::Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("'{s}' is not key=value"))
}

/// Sizes like 1Gi, 500Mi, 10G or plain bytes.
pub fn parse_size(s: &str) -> std::result::Result<i64, String> {
    let (num, mult) = [
        ("Ki", 1i64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("K", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ]
    .iter()
    .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, *m)))
    .unwrap_or((s, 1));
    num.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n >= 0)
        .ok_or_else(|| format!("'{s}' is not a size (e.g. 1Gi, 500Mi, 1073741824)"))
}

impl CapabilityArgs {
    pub fn capability(&self) -> VolumeCapability {
        if self.block {
            VolumeCapability::block(self.mode)
        } else {
            VolumeCapability::mount(self.fs_type.clone(), self.mount_flags.clone(), self.mode)
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// GetPluginInfo.
    Info,
    /// GetPluginCapabilities.
    PluginCaps,
    /// Probe.
    Probe,
    /// ControllerGetCapabilities.
    ControllerCaps,
    /// CreateVolume.
    Create {
        name: String,
        /// Capacity (required_bytes), e.g. 1Gi.
        #[arg(long, value_parser = parse_size, default_value = "1Gi")]
        size: i64,
        /// Largest acceptable capacity (limit_bytes); 0 = none.
        #[arg(long, value_parser = parse_size, default_value = "0")]
        limit: i64,
        /// StorageClass-style parameter key=value (repeatable).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// Preferred zone (accessibility requirement).
        #[arg(long)]
        zone: Option<String>,
        /// Create from this snapshot.
        #[arg(long)]
        snapshot: Option<String>,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// DeleteVolume.
    Delete { volume_id: String },
    /// ValidateVolumeCapabilities.
    Validate {
        volume_id: String,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// ControllerExpandVolume.
    Expand {
        volume_id: String,
        #[arg(long, value_parser = parse_size)]
        size: i64,
    },
    /// ControllerPublishVolume (attach).
    Publish {
        volume_id: String,
        node_id: String,
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// ControllerUnpublishVolume (detach).
    Unpublish { volume_id: String, node_id: String },
    /// NodeStageVolume.
    Stage {
        volume_id: String,
        staging_path: PathBuf,
        /// The publish context's devicePath (from `publish`).
        #[arg(long)]
        device_path: String,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// NodeUnstageVolume.
    Unstage {
        volume_id: String,
        staging_path: PathBuf,
    },
    /// NodePublishVolume.
    NodePublish {
        volume_id: String,
        staging_path: PathBuf,
        target_path: PathBuf,
        #[arg(long)]
        device_path: Option<String>,
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// NodeUnpublishVolume.
    NodeUnpublish {
        volume_id: String,
        target_path: PathBuf,
    },
    /// NodeGetInfo.
    NodeInfo,
    /// NodeGetCapabilities.
    NodeCaps,
    /// NodeGetVolumeStats.
    Stats { volume_id: String, path: PathBuf },
    /// CreateSnapshot.
    Snapshot { name: String, volume_id: String },
    /// DeleteSnapshot.
    DeleteSnapshot { snapshot_id: String },
    /// ListSnapshots.
    ListSnapshots {
        #[arg(long)]
        volume_id: Option<String>,
        #[arg(long)]
        snapshot_id: Option<String>,
        #[arg(long, default_value_t = 0)]
        max_entries: i32,
        #[arg(long)]
        starting_token: Option<String>,
    },
    /// Starts the EBS driver on an embedded EC2 in this process and walks one volume through
    /// its whole life (needs root and loop devices; builds with the `demo` feature only).
    Demo(DemoArgs),
}

/// `csictl demo` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Work directory (default: a new temp dir, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Filesystem to format the volume with.
    #[arg(long, default_value = "ext4")]
    pub fs_type: String,
    /// The embedded EC2's timing: instant, fast or realistic (AWS-like seconds).
    #[arg(long, default_value = "fast")]
    pub timing: String,
}

/// The three CSI clients on one channel.
#[derive(Debug, Clone)]
pub struct Clients {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

impl Clients {
    pub async fn connect(endpoint: &str) -> Result<Self> {
        let channel = csi_spec::connect_unix(endpoint)
            .await
            .map_err(Error::Endpoint)?;
        Ok(Self {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
        })
    }
}

/// A failed RPC, as the CLI reports it.
fn rpc(e: tonic::Status) -> Error {
    Error::Rpc {
        code: e.code().description().to_string(),
        message: e.message().to_string(),
    }
}

fn print<M: prost::Message + std::fmt::Debug>(output: Output, name: &str, m: &M) -> Result<()> {
    match output {
        Output::Json => println!("{}", json::to_json(&format!("csi.v1.{name}"), m)?),
        Output::Text => println!("{m:#?}"),
    }
    Ok(())
}

/// Runs one command.
pub async fn run(cli: Cli) -> Result<()> {
    if let Command::Demo(args) = cli.command {
        #[cfg(feature = "demo")]
        return demo::run(args).await;
        #[cfg(not(feature = "demo"))]
        {
            let _ = args;
            return Err(Error::invalid("demo", NO_DEMO));
        }
    }
    let mut c = Clients::connect(&cli.endpoint).await?;
    let o = cli.output;
    let path = |p: &PathBuf| p.display().to_string();
    match cli.command {
        Command::Demo(_) => Ok(()),
        Command::Info => {
            let r = c
                .identity
                .get_plugin_info(GetPluginInfoRequest {})
                .await
                .map_err(rpc)?;
            print(o, "GetPluginInfoResponse", r.get_ref())
        }
        Command::PluginCaps => {
            let r = c
                .identity
                .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
                .await
                .map_err(rpc)?;
            print(o, "GetPluginCapabilitiesResponse", r.get_ref())
        }
        Command::Probe => {
            let r = c.identity.probe(ProbeRequest {}).await.map_err(rpc)?;
            print(o, "ProbeResponse", r.get_ref())
        }
        Command::ControllerCaps => {
            let r = c
                .controller
                .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                .await
                .map_err(rpc)?;
            print(o, "ControllerGetCapabilitiesResponse", r.get_ref())
        }
        Command::Create {
            name,
            size,
            limit,
            params,
            zone,
            snapshot,
            cap,
        } => {
            let r = c
                .controller
                .create_volume(CreateVolumeRequest {
                    name,
                    capacity_range: Some(CapacityRange {
                        required_bytes: size,
                        limit_bytes: limit,
                    }),
                    volume_capabilities: vec![cap.capability()],
                    parameters: params.into_iter().collect(),
                    volume_content_source: snapshot.map(|s| VolumeContentSource {
                        r#type: Some(volume_content_source::Type::Snapshot(
                            volume_content_source::SnapshotSource { snapshot_id: s },
                        )),
                    }),
                    accessibility_requirements: zone.map(|z| TopologyRequirement {
                        requisite: vec![],
                        preferred: vec![Topology::from_segments([(TOPOLOGY_ZONE_KEY, z)])],
                    }),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "CreateVolumeResponse", r.get_ref())
        }
        Command::Delete { volume_id } => {
            let r = c
                .controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id,
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "DeleteVolumeResponse", r.get_ref())
        }
        Command::Validate { volume_id, cap } => {
            let r = c
                .controller
                .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                    volume_id,
                    volume_capabilities: vec![cap.capability()],
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "ValidateVolumeCapabilitiesResponse", r.get_ref())
        }
        Command::Expand { volume_id, size } => {
            let r = c
                .controller
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id,
                    capacity_range: Some(CapacityRange {
                        required_bytes: size,
                        limit_bytes: 0,
                    }),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "ControllerExpandVolumeResponse", r.get_ref())
        }
        Command::Publish {
            volume_id,
            node_id,
            readonly,
            cap,
        } => {
            let r = c
                .controller
                .controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id,
                    node_id,
                    volume_capability: Some(cap.capability()),
                    readonly,
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "ControllerPublishVolumeResponse", r.get_ref())
        }
        Command::Unpublish { volume_id, node_id } => {
            let r = c
                .controller
                .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id,
                    node_id,
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "ControllerUnpublishVolumeResponse", r.get_ref())
        }
        Command::Stage {
            volume_id,
            staging_path,
            device_path,
            cap,
        } => {
            let r = c
                .node
                .node_stage_volume(NodeStageVolumeRequest {
                    volume_id,
                    publish_context: HashMap::from([(DEVICE_PATH_KEY.to_string(), device_path)]),
                    staging_target_path: path(&staging_path),
                    volume_capability: Some(cap.capability()),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "NodeStageVolumeResponse", r.get_ref())
        }
        Command::Unstage {
            volume_id,
            staging_path,
        } => {
            let r = c
                .node
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id,
                    staging_target_path: path(&staging_path),
                })
                .await
                .map_err(rpc)?;
            print(o, "NodeUnstageVolumeResponse", r.get_ref())
        }
        Command::NodePublish {
            volume_id,
            staging_path,
            target_path,
            device_path,
            readonly,
            cap,
        } => {
            let r = c
                .node
                .node_publish_volume(NodePublishVolumeRequest {
                    volume_id,
                    publish_context: device_path
                        .map(|d| HashMap::from([(DEVICE_PATH_KEY.to_string(), d)]))
                        .unwrap_or_default(),
                    staging_target_path: path(&staging_path),
                    target_path: path(&target_path),
                    volume_capability: Some(cap.capability()),
                    readonly,
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "NodePublishVolumeResponse", r.get_ref())
        }
        Command::NodeUnpublish {
            volume_id,
            target_path,
        } => {
            let r = c
                .node
                .node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id,
                    target_path: path(&target_path),
                })
                .await
                .map_err(rpc)?;
            print(o, "NodeUnpublishVolumeResponse", r.get_ref())
        }
        Command::NodeInfo => {
            let r = c
                .node
                .node_get_info(NodeGetInfoRequest {})
                .await
                .map_err(rpc)?;
            print(o, "NodeGetInfoResponse", r.get_ref())
        }
        Command::NodeCaps => {
            let r = c
                .node
                .node_get_capabilities(NodeGetCapabilitiesRequest {})
                .await
                .map_err(rpc)?;
            print(o, "NodeGetCapabilitiesResponse", r.get_ref())
        }
        Command::Stats { volume_id, path: p } => {
            let r = c
                .node
                .node_get_volume_stats(NodeGetVolumeStatsRequest {
                    volume_id,
                    volume_path: path(&p),
                    staging_target_path: String::new(),
                })
                .await
                .map_err(rpc)?;
            print(o, "NodeGetVolumeStatsResponse", r.get_ref())
        }
        Command::Snapshot { name, volume_id } => {
            let r = c
                .controller
                .create_snapshot(CreateSnapshotRequest {
                    name,
                    source_volume_id: volume_id,
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "CreateSnapshotResponse", r.get_ref())
        }
        Command::DeleteSnapshot { snapshot_id } => {
            let r = c
                .controller
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id,
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "DeleteSnapshotResponse", r.get_ref())
        }
        Command::ListSnapshots {
            volume_id,
            snapshot_id,
            max_entries,
            starting_token,
        } => {
            let r = c
                .controller
                .list_snapshots(ListSnapshotsRequest {
                    max_entries,
                    starting_token: starting_token.unwrap_or_default(),
                    source_volume_id: volume_id.unwrap_or_default(),
                    snapshot_id: snapshot_id.unwrap_or_default(),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
            print(o, "ListSnapshotsResponse", r.get_ref())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_modes_parse() {
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("500Mi"), Ok(500 << 20));
        assert_eq!(parse_size("10G"), Ok(10_000_000_000));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("x").is_err());
        assert!(parse_size("-1").is_err());
        assert_eq!(parse_mode("single-node-writer"), Ok(Mode::SingleNodeWriter));
        assert!(parse_mode("nope").is_err());
    }

    /// csictl's keys are the EBS driver's (it does not link the driver without `demo`).
    #[cfg(feature = "demo")]
    #[test]
    fn keys_are_the_ebs_drivers() {
        assert_eq!(DEVICE_PATH_KEY, ebs_driver::node::DEVICE_PATH_KEY);
        assert_eq!(TOPOLOGY_ZONE_KEY, ebs_driver::node::TOPOLOGY_ZONE_KEY);
    }
}
