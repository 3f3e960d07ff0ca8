//! One run's world, what every scenario that runs components stands on: its temp dir and log
//! dir, the embedded API server with the admin kubeconfig its children use and the benchmark's
//! own client, and the components the benchmark runs in-process (the ones it does not measure:
//! the attach/detach controller, csi-attacher, the PV controller), each a task under one stop
//! token. The processes under test are [`super::child::Child`]ren the scenario holds, because
//! what it measures of them and the order they stop in are its own.
//!
//! [`World::shutdown`] stops the in-process components (after the scenario stopped its
//! children), then the API server. Dropped (after a shutdown, or instead of one when a run
//! failed or was interrupted) it aborts what still runs and removes the temp dir last.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver::RunningApiServer;
use kube::Client;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::api;
use crate::Error;

/// How long an in-process component may take to stop after its token is cancelled.
const STOP_PATIENCE: Duration = Duration::from_secs(10);

pub struct World {
    /// The benchmark's own client (no rate limit; its writes are left out of the tallies by
    /// its User-Agent).
    pub kube: Client,
    /// The admin kubeconfig, for the children.
    pub kubeconfig: PathBuf,
    root: PathBuf,
    log_dir: PathBuf,
    stop: CancellationToken,
    in_process: Vec<(&'static str, JoinHandle<()>)>,
    server: Option<RunningApiServer>,
    /// Declared last: removed after everything else went.
    dir: Option<tempfile::TempDir>,
}

impl World {
    /// A temp dir `PREFIX-XXXXXX` under `temp_parent`, the log dir (`logs` in it unless
    /// given), the API server, and a client of it sending `user_agent`.
    pub async fn start(
        prefix: &str,
        temp_parent: Option<&Path>,
        log_dir: Option<PathBuf>,
        user_agent: &str,
    ) -> Result<World, Error> {
        let dir = api::run_dir(prefix, temp_parent)?;
        // Canonical: mounts below it are found by the path the kernel reports.
        let root = mount_utils::findmnt::canonical(dir.path());
        let log_dir = log_dir.unwrap_or_else(|| root.join("logs"));
        std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
            op: format!("creating the log dir {}", log_dir.display()),
            source,
        })?;
        let (server, kubeconfig) = api::start(&root).await?;
        let kube = api::client(&server, user_agent)?;
        Ok(World {
            kube,
            kubeconfig,
            root,
            log_dir,
            stop: CancellationToken::new(),
            in_process: Vec::new(),
            server: Some(server),
            dir: Some(dir),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<log dir>/<name>.log`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.log_dir.join(format!("{name}.log"))
    }

    pub fn server(&self) -> Result<&RunningApiServer, Error> {
        self.server
            .as_ref()
            .ok_or_else(|| Error::Other("the API server is not running".into()))
    }

    /// Another client of the API server, for an in-process component sending `user_agent`.
    pub fn client(&self, user_agent: &str) -> Result<Client, Error> {
        api::client(self.server()?, user_agent)
    }

    /// Runs `component` as `name` in this process until the world stops. Its error is logged
    /// and [`Self::check_in_process`] reports its end.
    pub fn run_in_process<F, E>(
        &mut self,
        name: &'static str,
        component: impl FnOnce(CancellationToken) -> F,
    ) where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let run = component(self.stop.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = run.await {
                tracing::error!(error = %e, "{name} failed");
            }
        });
        self.in_process.push((name, task));
    }

    /// An error naming the first in-process component that ended: each runs until the world
    /// stops.
    pub fn check_in_process(&self) -> Result<(), Error> {
        match self.in_process.iter().find(|(_, t)| t.is_finished()) {
            Some((name, _)) => Err(Error::Other(format!(
                "the {name} stopped (its error is in the log above)"
            ))),
            None => Ok(()),
        }
    }

    /// The API server's audit trail so far.
    pub fn audit(&self) -> Vec<apiserver::AuditRecord> {
        self.server.as_ref().map(|s| s.audit()).unwrap_or_default()
    }

    /// How many requests the audit trail holds.
    pub fn audit_len(&self) -> usize {
        self.server.as_ref().map_or(0, |s| s.audit_len())
    }

    /// Stops the in-process components: each gets [`STOP_PATIENCE`], then it is left to the
    /// runtime.
    pub async fn stop_in_process(&mut self) {
        self.stop.cancel();
        for (name, task) in std::mem::take(&mut self.in_process) {
            if tokio::time::timeout(STOP_PATIENCE, task).await.is_err() {
                tracing::warn!("the {name} did not stop within {STOP_PATIENCE:?}");
            }
        }
    }

    /// Stops the in-process components and the API server; the temp dir goes when the world
    /// is dropped.
    pub async fn shutdown(&mut self) {
        self.stop_in_process().await;
        if let Some(s) = self.server.take()
            && let Err(e) = s.shutdown().await
        {
            tracing::warn!(error = %e, "API server shutdown");
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.cancel();
        for (_, task) in &self.in_process {
            task.abort();
        }
        self.server = None;
        self.dir = None;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn runs_components_until_it_stops_and_removes_its_dir() {
        let mut world = World::start("csi-bench-world-", None, None, "csi-bench-test/1")
            .await
            .unwrap();
        let root = world.root().to_path_buf();
        assert!(world.kubeconfig.starts_with(&root));
        assert_eq!(world.log("adc"), root.join("logs").join("adc.log"));
        assert!(root.join("logs").is_dir());

        // One component runs until cancelled and sees its stop; one ends on its own.
        let (tx, rx) = tokio::sync::oneshot::channel();
        world.run_in_process("waiter", |stop| async move {
            stop.cancelled().await;
            let _ = tx.send(());
            Ok::<_, String>(())
        });
        world.check_in_process().unwrap();
        world.run_in_process("quitter", |_| async { Err("gave up".to_string()) });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let err = loop {
            if let Err(e) = world.check_in_process() {
                break e;
            }
            assert!(std::time::Instant::now() < deadline, "the quitter ran on");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(
            err.to_string(),
            "the quitter stopped (its error is in the log above)"
        );

        // Its client reaches the server, under its User-Agent.
        let ns: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(world.client("other/1").unwrap());
        ns.list(&Default::default()).await.unwrap();
        assert!(
            world
                .audit()
                .iter()
                .any(|r| r.user_agent == "other/1" && r.verb == "list")
        );
        assert!(world.audit_len() >= 1);

        world.shutdown().await;
        rx.await.unwrap();
        assert!(world.server().is_err());
        assert!(root.exists(), "the temp dir goes with the world");
        drop(world);
        assert!(!root.exists(), "{} is left", root.display());
    }

    #[tokio::test]
    async fn dropped_it_aborts_its_components_and_removes_its_dir() {
        let log_dir = tempfile::tempdir().unwrap();
        let mut world = World::start(
            "csi-bench-world-",
            None,
            Some(log_dir.path().join("run-1")),
            "csi-bench-test/1",
        )
        .await
        .unwrap();
        assert_eq!(world.log("x"), log_dir.path().join("run-1").join("x.log"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        world.run_in_process("holder", |_| async move {
            let _tx = tx;
            std::future::pending::<Result<(), String>>().await
        });
        let root = world.root().to_path_buf();
        drop(world);
        // The aborted task dropped its sender.
        assert!(rx.await.is_err());
        assert!(!root.exists(), "{} is left", root.display());
        assert!(
            log_dir.path().join("run-1").is_dir(),
            "a given log dir is kept"
        );
    }
}
