//! `csictl demo`: starts the driver (`--mode all --embedded-ec2` in a temp dir, in this
//! process) and walks one volume through its life over the real CSI socket, printing each step
//! with its time. Everything is cleaned up also when a step fails.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use tokio::sync::oneshot;

use ebs_driver::{DriverConfig, EmbeddedTiming, Mode as DriverMode};

use crate::{Clients, DEVICE_PATH_KEY, DemoArgs, Error, Result, rpc};

const FILE_NAME: &str = "hello.txt";

struct Steps {
    started: Instant,
    n: usize,
}

impl Steps {
    async fn run<T, F>(&mut self, what: &str, f: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        self.n += 1;
        let at = self.started.elapsed();
        print!("[{:>7.3}s] {:>2}. {what:<54}", at.as_secs_f64(), self.n);
        let _ = std::io::stdout().flush();
        let t = Instant::now();
        let r = f.await;
        match &r {
            Ok(_) => println!(" ok   {:>8.1} ms", t.elapsed().as_secs_f64() * 1000.0),
            Err(e) => println!(
                " FAILED after {:.1} ms: {e}",
                t.elapsed().as_secs_f64() * 1000.0
            ),
        }
        r
    }
}

/// What the demo made, for the clean-up.
#[derive(Default)]
struct Made {
    volume_id: Option<String>,
    node_id: String,
    staging: PathBuf,
    target: PathBuf,
}

pub async fn run(args: DemoArgs) -> Result<()> {
    let timing: EmbeddedTiming =
        args.timing
            .parse()
            .map_err(|e: <EmbeddedTiming as std::str::FromStr>::Err| {
                Error::invalid("timing", e.to_string())
            })?;
    let temp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("csictl-demo-")
                .tempdir()
                .map_err(|e| Error::io("creating a temp dir in", std::env::temp_dir(), e))?;
            temp.path().to_path_buf()
        }
    };
    if !ebs_driver::loop_devices_available() {
        return Err(Error::invalid(
            "demo",
            "needs root and /dev/loop-control: the embedded EC2 attaches volumes as loop devices and the node service formats and mounts them (try: sudo csictl demo)",
        ));
    }
    let endpoint = format!("unix://{}", dir.join("csi.sock").display());
    let config = DriverConfig {
        endpoint: endpoint.clone(),
        mode: DriverMode::All,
        embedded_ec2: Some(dir.join("ec2")),
        embedded_timing: timing,
        node: ebs_driver::NodeConfig {
            device_wait: Duration::from_secs(30),
            ..ebs_driver::NodeConfig::default()
        },
        ..DriverConfig::default()
    };
    println!(
        "csictl demo: ebs-csi-driver --mode all --embedded-ec2 {} (timing {})",
        dir.join("ec2").display(),
        args.timing
    );
    println!("             CSI endpoint {endpoint}");
    let (stop, stopped) = oneshot::channel::<()>();
    let driver = tokio::spawn(ebs_driver::run(config, async move {
        let _ = stopped.await;
    }));
    let mut steps = Steps {
        started: Instant::now(),
        n: 0,
    };
    let mut made = Made {
        staging: dir.join("staging"),
        target: dir.join("target"),
        ..Made::default()
    };
    let result = walk(&mut steps, &endpoint, &args.fs_type, &mut made).await;
    if result.is_err() {
        println!("cleaning up after the failure");
    }
    let cleanup = clean_up(&mut steps, &endpoint, &made).await;
    let _ = stop.send(());
    match driver.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => println!("driver: {e}"),
        Err(e) => println!("driver task: {e}"),
    }
    // Anything the driver could not take down (it may have failed): unmount it here.
    for p in [&made.target, &made.staging] {
        force_unmount(p);
    }
    println!("[{:>7.3}s] done", steps.started.elapsed().as_secs_f64());
    result.and(cleanup)
}

async fn connect(endpoint: &str) -> Result<Clients> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Clients::connect(endpoint).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn capability(fs_type: &str) -> VolumeCapability {
    VolumeCapability::mount(fs_type, vec![], Mode::SingleNodeWriter)
}

async fn walk(steps: &mut Steps, endpoint: &str, fs_type: &str, made: &mut Made) -> Result<()> {
    let mut c = steps
        .run("start the driver and connect", connect(endpoint))
        .await?;
    let probe = c.identity.clone();
    steps
        .run("Probe", async move {
            let mut probe = probe;
            let r = probe
                .probe(ProbeRequest {})
                .await
                .map_err(rpc)?
                .into_inner();
            if r.ready == Some(false) {
                return Err(Error::Internal("the driver is not ready".into()));
            }
            Ok(())
        })
        .await?;
    let mut node = c.node.clone();
    let info = steps
        .run("NodeGetInfo", async {
            Ok(node
                .node_get_info(NodeGetInfoRequest {})
                .await
                .map_err(rpc)?
                .into_inner())
        })
        .await?;
    made.node_id = info.node_id.clone();
    println!("             node {} ", info.node_id);
    let mut ctl = c.controller.clone();
    let vol = steps
        .run("CreateVolume csictl-demo-volume (1 GiB gp3)", async {
            let r = ctl
                .create_volume(CreateVolumeRequest {
                    name: "csictl-demo-volume".into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: 1 << 30,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![capability(fs_type)],
                    parameters: HashMap::from([("type".to_string(), "gp3".to_string())]),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?
                .into_inner();
            r.volume
                .ok_or_else(|| Error::Internal("CreateVolume returned no volume".into()))
        })
        .await?;
    made.volume_id = Some(vol.volume_id.clone());
    println!("             volume {}", vol.volume_id);
    let device = publish(
        steps,
        &mut c,
        &vol.volume_id,
        &made.node_id,
        fs_type,
        "ControllerPublishVolume (attach)",
    )
    .await?;
    stage_and_publish(steps, &mut c, &vol.volume_id, &device, fs_type, made).await?;
    let file = made.target.join(FILE_NAME);
    let content = format!(
        "written by csictl demo through {} at {:?}\n",
        vol.volume_id,
        std::time::SystemTime::now()
    );
    steps
        .run("write a file into the published volume", async {
            let mut f =
                std::fs::File::create(&file).map_err(|e| Error::io("creating", &file, e))?;
            f.write_all(content.as_bytes())
                .and_then(|_| f.sync_all())
                .map_err(|e| Error::io("writing", &file, e))
        })
        .await?;
    unpublish_and_unstage(steps, &mut c, &vol.volume_id, made).await?;
    let mut ctl = c.controller.clone();
    steps
        .run("ControllerUnpublishVolume (detach)", async {
            ctl.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: made.node_id.clone(),
                ..Default::default()
            })
            .await
            .map_err(rpc)?;
            Ok(())
        })
        .await?;
    let device = publish(
        steps,
        &mut c,
        &vol.volume_id,
        &made.node_id,
        fs_type,
        "ControllerPublishVolume (re-attach)",
    )
    .await?;
    stage_and_publish(steps, &mut c, &vol.volume_id, &device, fs_type, made).await?;
    steps
        .run("the file is still there", async {
            let read =
                std::fs::read_to_string(&file).map_err(|e| Error::io("reading", &file, e))?;
            if read == content {
                Ok(())
            } else {
                Err(Error::Internal(format!(
                    "the file holds {read:?}, not {content:?}"
                )))
            }
        })
        .await?;
    Ok(())
}

async fn publish(
    steps: &mut Steps,
    c: &mut Clients,
    volume_id: &str,
    node_id: &str,
    fs_type: &str,
    what: &str,
) -> Result<String> {
    let mut ctl = c.controller.clone();
    let device = steps
        .run(what, async {
            let r = ctl
                .controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id: volume_id.to_string(),
                    node_id: node_id.to_string(),
                    volume_capability: Some(capability(fs_type)),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?
                .into_inner();
            r.publish_context
                .get(DEVICE_PATH_KEY)
                .cloned()
                .ok_or_else(|| Error::Internal("no devicePath in the publish context".into()))
        })
        .await?;
    println!("             device {device}");
    Ok(device)
}

async fn stage_and_publish(
    steps: &mut Steps,
    c: &mut Clients,
    volume_id: &str,
    device: &str,
    fs_type: &str,
    made: &Made,
) -> Result<()> {
    let ctx = HashMap::from([(DEVICE_PATH_KEY.to_string(), device.to_string())]);
    std::fs::create_dir_all(&made.staging).map_err(|e| Error::io("creating", &made.staging, e))?;
    let mut node = c.node.clone();
    steps
        .run(
            "NodeStageVolume (blkid, mkfs if blank, fsck, mount)",
            async {
                node.node_stage_volume(NodeStageVolumeRequest {
                    volume_id: volume_id.to_string(),
                    publish_context: ctx.clone(),
                    staging_target_path: made.staging.display().to_string(),
                    volume_capability: Some(capability(fs_type)),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
                Ok(())
            },
        )
        .await?;
    let mut node = c.node.clone();
    steps
        .run("NodePublishVolume (bind mount)", async {
            node.node_publish_volume(NodePublishVolumeRequest {
                volume_id: volume_id.to_string(),
                publish_context: ctx.clone(),
                staging_target_path: made.staging.display().to_string(),
                target_path: made.target.display().to_string(),
                volume_capability: Some(capability(fs_type)),
                ..Default::default()
            })
            .await
            .map_err(rpc)?;
            Ok(())
        })
        .await
}

async fn unpublish_and_unstage(
    steps: &mut Steps,
    c: &mut Clients,
    volume_id: &str,
    made: &Made,
) -> Result<()> {
    let mut node = c.node.clone();
    steps
        .run("NodeUnpublishVolume", async {
            node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume_id.to_string(),
                target_path: made.target.display().to_string(),
            })
            .await
            .map_err(rpc)?;
            Ok(())
        })
        .await?;
    let mut node = c.node.clone();
    steps
        .run("NodeUnstageVolume", async {
            node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume_id.to_string(),
                staging_target_path: made.staging.display().to_string(),
            })
            .await
            .map_err(rpc)?;
            Ok(())
        })
        .await
}

/// Undoes everything, in order, trying every step even when one fails.
async fn clean_up(steps: &mut Steps, endpoint: &str, made: &Made) -> Result<()> {
    let Some(volume_id) = &made.volume_id else {
        return Ok(());
    };
    let mut c = match Clients::connect(endpoint).await {
        Ok(c) => c,
        Err(e) => return Err(e),
    };
    let mut first_error = None;
    let mut keep = |r: Result<()>| {
        if let Err(e) = r {
            first_error.get_or_insert(e);
        }
    };
    keep(unpublish_and_unstage(steps, &mut c, volume_id, made).await);
    let mut ctl = c.controller.clone();
    keep(
        steps
            .run("clean up: ControllerUnpublishVolume", async {
                ctl.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    node_id: made.node_id.clone(),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
                Ok(())
            })
            .await,
    );
    let mut ctl = c.controller.clone();
    keep(
        steps
            .run("clean up: DeleteVolume", async {
                ctl.delete_volume(DeleteVolumeRequest {
                    volume_id: volume_id.clone(),
                    ..Default::default()
                })
                .await
                .map_err(rpc)?;
                Ok(())
            })
            .await,
    );
    first_error.map_or(Ok(()), Err)
}

fn force_unmount(path: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let p = path.display().to_string();
    let mounted = info
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .count();
    for _ in 0..mounted {
        let _ = std::process::Command::new("umount").arg(path).status();
    }
}
