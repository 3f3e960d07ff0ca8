//! The EBS scenarios' cloud: ec2-sim in-process (fast timing), one EC2 instance per node
//! (RunInstances as a raw query-protocol request: csi-bench does not link aws-sdk), and the
//! `ebs-csi-driver` binary in controller mode against it, which creates the volumes
//! (CreateVolume over its CSI socket) and, when the nodes attach, attaches them for
//! csi-attacher to real loop devices.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_spec::v1::ControllerGetCapabilitiesRequest;
use csi_spec::v1::controller_client::ControllerClient;
use ec2_sim::{Backing, DeviceLayout, SimConfig, Simulator, Timing};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::Error;
use crate::harness::child::Child;

pub const DRIVER: &str = "ebs.csi.aws.com";
pub const ZONE: &str = "us-east-1a";
const REGION: &str = "us-east-1";
/// The key pair the sim accepts, the controller and [`ec2_call`] sign with.
const KEY_ID: &str = "csi-bench";
const SECRET: &str = "csi-bench";
/// How long the controller may take to create its socket.
const CONTROLLER_START: Duration = Duration::from_secs(60);

fn sim_credentials() -> ec2_sim::Credentials {
    ec2_sim::Credentials::single(KEY_ID, SECRET)
}
/// The EBS driver's zone topology key.
pub const ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";

pub struct Ebs {
    controller: Option<Child>,
    sim: Option<Simulator>,
    socket: PathBuf,
    instances: Vec<String>,
    attach_limit: Option<usize>,
    controller_args: Vec<String>,
}

impl Ebs {
    /// ec2-sim with `nodes` running instances, and the controller (`bin`) logging to `log`.
    /// With `attach_limit` the volumes attach to real loop devices (root only), at most that
    /// many per instance, which the controller is told; without, nothing attaches.
    pub async fn start(
        root: &Path,
        log: &Path,
        bin: &Path,
        nodes: usize,
        attach_limit: Option<usize>,
    ) -> Result<Ebs, Error> {
        let mut sim_config = SimConfig {
            state_dir: root.join("ec2"),
            timing: Timing::Fast,
            credentials: sim_credentials(),
            ..SimConfig::default()
        };
        if let Some(limit) = attach_limit {
            sim_config = SimConfig {
                device_dir: Some(root.join("dev")),
                backing: Backing::Loop,
                device_layout: DeviceLayout::PerInstance,
                max_attachments_per_instance: limit + 1,
                ..sim_config
            };
        }
        let sim = Simulator::start(sim_config, ([127, 0, 0, 1], 0).into()).await?;
        let mut ebs = Ebs {
            controller: None,
            socket: root.join("ebs-controller.sock"),
            sim: Some(sim),
            instances: Vec::new(),
            attach_limit,
            controller_args: Vec::new(),
        };
        let addr = ebs.sim()?.local_addr();
        for i in 0..nodes {
            let id = run_instance(addr, &format!("node-{i}")).await?;
            ebs.instances.push(id);
        }
        for id in ebs.instances.clone() {
            wait_running(addr, &id).await?;
        }
        let mut args = vec![
            "--mode=controller".to_string(),
            format!("--endpoint={}", ebs.controller_endpoint()),
            format!("--ec2-endpoint={}", ebs.sim()?.endpoint()),
            format!("--region={REGION}"),
        ];
        args.extend(attach_limit.map(|l| format!("--volume-attach-limit={l}")));
        let envs = [
            ("AWS_ACCESS_KEY_ID", KEY_ID.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.to_string()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_string()),
        ];
        let controller = ebs.controller.insert(Child::spawn(
            "ebs-csi-driver (controller)",
            bin,
            &args,
            &envs,
            log,
        )?);
        controller
            .wait_for_socket(&ebs.socket, CONTROLLER_START)
            .await?;
        ebs.controller_args = args;
        Ok(ebs)
    }

    fn sim(&self) -> Result<&Simulator, Error> {
        self.sim
            .as_ref()
            .ok_or_else(|| Error::Other("ec2-sim is not running".into()))
    }

    pub fn controller_endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn instance(&self, i: usize) -> Result<&str, Error> {
        self.instances
            .get(i)
            .map(String::as_str)
            .ok_or_else(|| Error::Other(format!("no EC2 instance for node {i}")))
    }

    pub fn dev_root(&self, instance: &str) -> PathBuf {
        match &self.sim {
            Some(s) => s.node_dev_root(instance),
            None => PathBuf::from("/nonexistent"),
        }
    }

    /// The most volumes one instance attaches (when they attach at all).
    pub fn attach_limit(&self) -> Option<usize> {
        self.attach_limit
    }

    /// The controller's command line after the binary.
    pub fn controller_args(&self) -> &[String] {
        &self.controller_args
    }

    pub fn controller(&self) -> Option<&Child> {
        self.controller.as_ref()
    }

    /// EC2 calls ec2-sim answered so far, by action.
    pub fn ec2_calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.sim
            .as_ref()
            .map(Simulator::call_counts)
            .unwrap_or_default()
    }

    pub async fn controller_capabilities(&self) -> Result<Vec<i32>, Error> {
        let endpoint = self.controller_endpoint();
        let channel = csi_spec::connect_unix(&endpoint)
            .await
            .map_err(|e| Error::Csi {
                op: format!("dialling the EBS controller at {endpoint}"),
                reason: e.to_string(),
            })?;
        let caps = ControllerClient::new(channel)
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .map_err(|e| Error::Csi {
                op: "ControllerGetCapabilities of the EBS controller".into(),
                reason: e.to_string(),
            })?
            .into_inner()
            .capabilities
            .iter()
            .filter_map(|c| c.rpc_type().map(|t| t as i32))
            .collect();
        Ok(caps)
    }

    pub fn check_alive(&mut self) -> Result<(), Error> {
        match self.controller.as_mut() {
            Some(c) => c.check_alive(),
            None => Ok(()),
        }
    }

    /// Stops the controller, then ec2-sim (which releases its loop devices).
    pub async fn shutdown(mut self) {
        if let Some(c) = self.controller.take() {
            c.stop().await;
        }
        if let Some(sim) = self.sim.take()
            && let Err(e) = sim.shutdown().await
        {
            tracing::warn!(error = %e, "ec2-sim shutdown");
        }
    }
}

/// One EC2 query-protocol request (form POST); returns the body of a 200 answer.
async fn ec2_call(
    addr: std::net::SocketAddr,
    action: &str,
    params: &[(&str, &str)],
) -> Result<String, Error> {
    let err = |reason: String| Error::Ec2 {
        action: action.to_string(),
        reason,
    };
    let mut form = format!("Action={action}&Version=2016-11-15");
    for (k, v) in params {
        form.push('&');
        form.push_str(&encode(k));
        form.push('=');
        form.push_str(&encode(v));
    }
    let [(date_name, date), (auth_name, auth)] = ec2_sim::sign_post(
        &addr.to_string(),
        form.as_bytes(),
        REGION,
        KEY_ID,
        SECRET,
        std::time::SystemTime::now(),
    );
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\n{date_name}: {date}\r\n{auth_name}: {auth}\r\nContent-Type: application/x-www-form-urlencoded; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| err(format!("connecting to {addr}: {e}")))?;
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| err(format!("sending: {e}")))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| err(format!("reading: {e}")))?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status_ok = text
        .lines()
        .next()
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("200"));
    if !status_ok {
        return Err(err(format!("answered {text}")));
    }
    Ok(text)
}

/// Percent-encoding for form values (RFC 3986 unreserved characters kept).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The text of the first `<tag>...</tag>` in `xml`.
fn first_tag<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{tag}>"))? + start;
    Some(&xml[start..end])
}

async fn run_instance(addr: std::net::SocketAddr, name: &str) -> Result<String, Error> {
    let body = ec2_call(
        addr,
        "RunInstances",
        &[
            ("ImageId", "ami-csi-bench-node"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("InstanceType", "m5.large"),
            ("Placement.AvailabilityZone", ZONE),
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", "Name"),
            ("TagSpecification.1.Tag.1.Value", name),
        ],
    )
    .await?;
    first_tag(&body, "instanceId")
        .map(str::to_string)
        .ok_or_else(|| Error::Ec2 {
            action: "RunInstances".into(),
            reason: format!("no instanceId in {body}"),
        })
}

async fn wait_running(addr: std::net::SocketAddr, id: &str) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = ec2_call(addr, "DescribeInstances", &[("InstanceId.1", id)]).await?;
        let state = body
            .find("<instanceState>")
            .and_then(|at| first_tag(&body[at..], "name"));
        if state == Some("running") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Ec2 {
                action: "DescribeInstances".into(),
                reason: format!("{id} is not running after 60 s ({state:?})"),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn form_values_are_encoded() {
        assert_eq!(encode("a b/c=d"), "a%20b%2Fc%3Dd");
        assert_eq!(encode("us-east-1a"), "us-east-1a");
    }

    #[test]
    fn tags_are_found() {
        let xml =
            "<r><instancesSet><item><instanceId>i-0abc</instanceId></item></instancesSet></r>";
        assert_eq!(first_tag(xml, "instanceId"), Some("i-0abc"));
        assert_eq!(first_tag(xml, "nope"), None);
    }

    #[tokio::test]
    async fn run_instances_against_ec2_sim() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Simulator::start(
            SimConfig {
                state_dir: dir.path().join("ec2"),
                timing: Timing::Fast,
                credentials: sim_credentials(),
                ..SimConfig::default()
            },
            ([127, 0, 0, 1], 0).into(),
        )
        .await
        .unwrap();
        let id = run_instance(sim.local_addr(), "n0").await.unwrap();
        assert!(id.starts_with("i-"), "{id}");
        wait_running(sim.local_addr(), &id).await.unwrap();
        sim.shutdown().await.unwrap();
    }
}
