//! csi-bench: the benchmarks of csi-rs's components under load (docs/csi-bench.md).
//!
//! Each scenario module drives one component against an embedded API server, with the
//! component (or the Go one it replaces) as a child process, and reports times, API writes by
//! party, memory and CPU:
//!
//! - [`attacher`]: N PVs + VolumeAttachments against any CSI attacher and a driver socket;
//! - [`adc`]: N pods with a CSI volume each through the attach/detach controller, in the three
//!   attach modes;
//! - [`node`]: the node side (CSI driver, registrar, node agent per node), pod volume to Ready;
//! - [`provision`]: N claims through `csi-provisioner` and a driver, to Bound and back.
//!
//! - [`stack`] (feature `stack`, on by default): the whole stack in this process, as
//!   `csi-cluster` runs it, pods through the scheduler, provisioning, attach and mount.
//!
//! [`harness`] is what they measure with; it imports none of them.

pub mod adc;
pub mod attacher;
pub mod harness;
pub mod node;
pub mod provision;
#[cfg(feature = "stack")]
pub mod stack;

/// Errors of a run (but [`stack`]'s, which are its cluster's: `cluster::Error`). Each says which scenario, step, object or process failed; a process that
/// exited or a phase that timed out carries the end of the processes' logs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("embedded API server: {0}")]
    ApiServer(#[from] apiserver::Error),
    #[error("built-in csi-mock: {0}")]
    Mock(#[from] csi_mock::Error),
    #[error("ec2-sim: {0}")]
    Ec2Sim(#[from] ec2_sim::Error),
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: {source}")]
    Kube {
        op: String,
        #[source]
        source: kube::Error,
    },
    #[error("building the benchmark's API client: {0}")]
    Client(#[source] component_runtime::Error),
    #[error("{op}: {reason}")]
    Csi { op: String, reason: String },
    #[error("EC2 {action}: {reason}")]
    Ec2 { action: String, reason: String },
    #[error("reading /proc: {0}")]
    Proc(String),
    #[error("watching {resource}: {reason}")]
    Watch {
        resource: &'static str,
        reason: String,
    },
    #[error("building {kind} {name}: {reason}")]
    Object {
        kind: &'static str,
        name: String,
        reason: String,
    },
    /// A process under test exited while the run needed it.
    #[error("{who} exited ({status}) during {phase}{logs}")]
    Exited {
        who: String,
        phase: String,
        status: String,
        logs: String,
    },
    /// A phase did not finish by its deadline.
    #[error("{phase} did not finish in time ({progress}){logs}")]
    Timeout {
        phase: String,
        progress: String,
        logs: String,
    },
    #[error("{0}")]
    Other(String),
}

/// "; the end of the logs:\n…", or nothing when there are none.
fn logs_suffix(logs: String) -> String {
    if logs.trim().is_empty() {
        String::new()
    } else {
        format!("; the end of the logs:\n{logs}")
    }
}

impl Error {
    /// `who` exited with `status` during `phase`; `logs` are the ends of the processes' logs.
    pub fn exited(who: &str, phase: &str, status: String, logs: String) -> Self {
        Error::Exited {
            who: who.to_owned(),
            phase: phase.to_owned(),
            status,
            logs: logs_suffix(logs),
        }
    }

    /// `phase` (name it with its scenario) did not finish in time; `progress` says how far it
    /// got.
    pub fn timeout(phase: impl Into<String>, progress: String, logs: String) -> Self {
        Error::Timeout {
            phase: phase.into(),
            progress,
            logs: logs_suffix(logs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_errors_show_logs_only_when_there_are_some() {
        let e = Error::exited(
            "the attacher (x)",
            "attach",
            "exit status: 4".into(),
            "".into(),
        );
        assert_eq!(
            e.to_string(),
            "the attacher (x) exited (exit status: 4) during attach"
        );
        let e = Error::timeout(
            "hostpath: bind",
            "3 of 5 Bound".into(),
            "--- a ---\nboom".into(),
        );
        assert_eq!(
            e.to_string(),
            "hostpath: bind did not finish in time (3 of 5 Bound); the end of the logs:\n--- a ---\nboom"
        );
    }
}
