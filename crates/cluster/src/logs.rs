//! One log file per component under `<data-dir>/logs/`, told apart by the tracing target (the
//! crate a line comes from): `attach_detach` → `adc.log`, `node_agent` → `node-agent.log`
//! (all nodes; lines carry the node in their fields), and so on. Everything else (csi-cluster
//! itself, the shared sidecar and volume-plugins crates, warnings of the libraries below) goes
//! to `cluster.log`. Files are appended to across restarts.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::Error;

/// A component's log file and the tracing targets (crates) that go into it.
pub(crate) struct Component {
    pub(crate) file: &'static str,
    pub(crate) what: &'static str,
    targets: &'static [&'static str],
}

pub(crate) const COMPONENTS: &[Component] = &[
    Component {
        file: "apiserver.log",
        what: "apiserver-lite",
        targets: &["apiserver"],
    },
    Component {
        file: "ec2-sim.log",
        what: "ec2-sim",
        targets: &["ec2_sim"],
    },
    Component {
        file: "pv-controller.log",
        what: "PV controller",
        targets: &["pv_controller"],
    },
    Component {
        file: "ephemeral-volume.log",
        what: "ephemeral volume controller",
        targets: &["ephemeral_volume"],
    },
    Component {
        file: "adc.log",
        what: "attach/detach controller",
        targets: &["attach_detach"],
    },
    Component {
        file: "attacher.log",
        what: "csi-attacher",
        targets: &["attacher"],
    },
    Component {
        file: "provisioner.log",
        what: "csi-provisioner (EBS and the per-node hostpath ones)",
        targets: &["provisioner"],
    },
    Component {
        file: "ebs-driver.log",
        what: "EBS driver (controller and node services) and its EC2 client",
        targets: &["ebs_driver", "ebs_cloud", "ebs_cloud_aws"],
    },
    Component {
        file: "hostpath-driver.log",
        what: "hostpath driver",
        targets: &["hostpath_driver"],
    },
    Component {
        file: "node-agent.log",
        what: "node agents",
        targets: &["node_agent"],
    },
    Component {
        file: "registrar.log",
        what: "node driver registrars",
        targets: &["registrar"],
    },
    Component {
        file: "scheduler.log",
        what: "scheduler",
        targets: &["scheduler"],
    },
    Component {
        file: "statefulset.log",
        what: "StatefulSet controller",
        targets: &["statefulset"],
    },
];

/// Everything no component claims.
pub(crate) const CLUSTER_LOG: &str = "cluster.log";

/// Installs the per-component subscriber writing under `dir` (created). Our crates log at the
/// level `verbosity` gives, libraries (kube, hyper, tonic, aws-*) warnings only. If the
/// process already has a subscriber (a test that runs `up` in-process), that one stays.
pub fn init(dir: &Path, verbosity: u8) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    let ours = LevelFilter::from_level(telemetry::level_for_verbosity(verbosity));
    let mut layers = Vec::new();
    let mut rest = Targets::new().with_default(LevelFilter::WARN);
    for c in COMPONENTS {
        let mut targets = Targets::new();
        for t in c.targets {
            targets = targets.with_target(*t, ours);
            rest = rest.with_target(*t, LevelFilter::OFF);
        }
        layers.push(file_layer(&dir.join(c.file))?.with_filter(targets).boxed());
    }
    for t in telemetry::OUR_TARGETS {
        if !COMPONENTS.iter().any(|c| c.targets.contains(t)) {
            rest = rest.with_target(*t, ours);
        }
    }
    layers.push(
        file_layer(&dir.join(CLUSTER_LOG))?
            .with_filter(rest)
            .boxed(),
    );
    let _ = tracing_subscriber::registry().with(layers).try_init();
    Ok(())
}

type BoxedLayer = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

fn file_layer(path: &Path) -> Result<BoxedLayer, Error> {
    let file = open_append(path)?;
    Ok(tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(Mutex::new(file))
        .boxed())
}

fn open_append(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io("opening the log file", path, e))
}
