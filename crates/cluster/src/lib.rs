//! csi-cluster: the whole CSI storage stack in one process, a local Kubernetes for storage
//! driven with plain kubectl.
//!
//! [`up`] runs every component from its library, each on its own thread and tokio runtime (the
//! supervisor kills and restarts them like processes): apiserver-lite (persistent under the data
//! dir), ec2-sim with loop devices (one EC2 instance and one device
//! directory per node), the PV controller, the attach/detach controller, csi-attacher and
//! csi-provisioner for `ebs.csi.aws.com`, the EBS driver's controller service and, per node, a
//! node agent, the EBS driver in node mode, the hostpath driver (each on its own unix socket,
//! registered through the plugin registration API by the registrar library) and a hostpath
//! provisioner in `--node-deployment` mode. It shuts everything down in order and leaves no
//! mount, loop device, socket or task behind. [`down`] stops a running `up` through its pid
//! file; [`status`] prints what the cluster is doing.
//!
//! Modules: `cli` (the command line), [`config`] (what `up` runs with), `logs` (one log file per component),
//! `control_plane`, `nodes`, [`identity`] (each component's own kubeconfig and API user),
//! `bootstrap_objects` (CSIDrivers, StorageClasses), `external` and
//! `external_process` (`--driver` plugins as child processes), `workloads` (scheduler,
//! StatefulSet controller), `teardown` (mounts, loop devices, sockets), `pidfile`, [`status`].
//! `docs/cluster.md` is the user's guide.

pub mod background;
mod bootstrap_objects;
pub mod chaos;
mod cli;
mod component_names;
pub mod config;
mod control_plane;
pub mod demo;
mod external;
mod external_process;
pub mod identity;
mod informers;
pub mod kube_ops;
mod kubeconfig;
pub mod logs;
mod nodes;
mod pidfile;
pub mod status;
mod supervisor;
mod teardown;
mod up;
mod workloads;

use std::path::PathBuf;

pub use cli::{Command, DownFlags, Flags, StatusFlags, UpFlags};
pub use component_names::{
    ADC, ATTACHER, EBS_CONTROLLER, EPHEMERAL_VOLUME, HOSTPATH_CONTROLLER, PROVISIONER,
    PV_CONTROLLER, SCHEDULER, STATEFULSET, attacher_name, ebs_node_driver, external_controller,
    external_node, external_provisioner, hostpath_driver, hostpath_provisioner, node_agent,
    registrar,
};
pub use config::{Migration, MigrationState, UpConfig};
pub use pidfile::down;
pub use status::status;
pub use up::{READY_LINE, RunningCluster, up};

/// The EBS CSI driver's name.
pub const EBS_DRIVER: &str = "ebs.csi.aws.com";
/// The hostpath CSI driver's name.
pub const HOSTPATH_DRIVER: &str = hostpath_driver::DEFAULT_DRIVER_NAME;
/// The region ec2-sim simulates; nodes are spread over its zones a, b and c.
pub const REGION: &str = "us-east-1";
/// kube-controller-manager's default `--cluster-name`, which the in-tree plugin tags volumes
/// with; the EBS driver gets the same `--k8s-tag-cluster-id`, so both paths tag alike.
pub const CLUSTER_NAME: &str = "kubernetes";

/// What can go wrong. Messages name the path, object or component and say what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Flags that cannot work together or values out of range.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// Loop devices and mounts need root.
    #[error(
        "csi-cluster {command} needs root (loop devices and mounts): run it with sudo; effective uid is {uid}"
    )]
    NotRoot { uid: u32, command: &'static str },

    /// Another `csi-cluster up` runs on the same data dir.
    #[error(
        "another csi-cluster (pid {pid}) runs on {}: stop it first (csi-cluster down --data-dir {})",
        data_dir.display(), data_dir.display()
    )]
    AlreadyRunning { pid: i32, data_dir: PathBuf },

    /// No cluster runs on the data dir (`down`, `status`).
    #[error("no csi-cluster runs on {}: {reason}", data_dir.display())]
    NotRunning { data_dir: PathBuf, reason: String },

    /// A file or directory operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    /// A component could not start.
    #[error("starting {component}: {reason}")]
    Start { component: String, reason: String },

    /// The stop left mounts, loop devices or sockets below the data dir.
    #[error("stopping left behind below {}: {left}", data_dir.display())]
    Leftovers { data_dir: PathBuf, left: String },

    /// SIGINT or SIGTERM ended a run before its end (`demo`, `csi-bench stack`); what it started is
    /// cleaned up.
    #[error("interrupted by SIGINT or SIGTERM: {0}")]
    Interrupted(String),

    /// A demo or test step did not see what it expected (the message says what it saw).
    #[error("check failed: {0}")]
    Check(String),

    /// Something did not happen within its time.
    #[error("{what} did not happen within {waited:?}: {progress}")]
    Timeout {
        what: String,
        waited: std::time::Duration,
        progress: String,
    },
}

/// Loop devices and mounts need root: `Err(NotRoot)` naming `command` otherwise.
pub fn require_root(command: &'static str) -> Result<(), Error> {
    let uid = rustix::process::geteuid();
    if uid.is_root() {
        Ok(())
    } else {
        Err(Error::NotRoot {
            uid: uid.as_raw(),
            command,
        })
    }
}

/// `--timing`: ec2-sim's `instant` hides the states the controllers wait for.
pub fn require_real_timing(timing: ec2_sim::Timing) -> Result<(), Error> {
    if timing == ec2_sim::Timing::Instant {
        return Err(Error::Config(
            "--timing must be fast or realistic (instant hides the states the controllers wait for)".into(),
        ));
    }
    Ok(())
}

impl Error {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }

    pub fn start(component: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Error::Start {
            component: component.into(),
            reason: reason.to_string(),
        }
    }
}

/// At most two glibc malloc arenas, unless MALLOC_ARENA_MAX says otherwise. glibc gives a
/// thread that finds the arenas busy one of its own, up to eight per core, and csi-cluster runs
/// every component of a cluster on a few hundred threads: freed memory then stays spread over
/// sixteen arenas. At 1,000 pods on 10 nodes two arenas took the peak RSS from ~330 to
/// ~300 MiB at no measurable cost in time (docs/benchmarks.md). Call it first in `main`,
/// before any other thread starts (csi-cluster, and `csi-bench stack`, which measures the
/// same process).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn cap_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: mallopt only sets a tunable of glibc's allocator, which it reads under its own
    // locks; the callers run this first in main, before the process starts any other thread.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Elsewhere the allocator is left as it is.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn cap_malloc_arenas() {}
