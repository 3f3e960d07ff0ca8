//! Watch caches several provisioners in one process can share, as client-go's shared informer
//! factory lets the controllers of one binary share theirs.
//!
//! A csi-provisioner run with `--node-deployment` on every node watches every claim and
//! volume of the cluster, like the Go sidecar (it cannot know which claims will pick its node).
//! `csi-cluster` runs one per node in one process: ten copies of every PV and PVC were ~95 MiB
//! at 1,000 pods (docs/benchmarks.md). With [`Informers`], one watch per kind fills one
//! `component_runtime::ObjectCache`, and each provisioner subscribes to its changes. A
//! provisioner run alone starts its own `Informers` and is their only subscriber: one code path
//! either way.

use component_runtime::ObjectCache;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// The five caches a provisioner reads, shared.
#[derive(Clone, Debug)]
pub struct Informers {
    pub(crate) pvcs: ObjectCache<PersistentVolumeClaim>,
    pub(crate) pvs: ObjectCache<PersistentVolume>,
    pub(crate) classes: ObjectCache<StorageClass>,
    pub(crate) csinodes: ObjectCache<CSINode>,
    pub(crate) nodes: ObjectCache<Node>,
}

impl Informers {
    /// Waits until every cache has its first list in; `Err` names a watch that stopped first.
    /// No deadline: the provisioner keeps waiting (and retrying its watches) until it is shut
    /// down, as the Go sidecar does.
    pub async fn wait_until_ready(&self) -> Result<(), String> {
        for cache in [
            self.pvcs.readiness(),
            self.pvs.readiness(),
            self.classes.readiness(),
            self.csinodes.readiness(),
            self.nodes.readiness(),
        ] {
            let kind = cache.kind().to_string();
            if !cache.wait().await {
                return Err(format!("the shared watch of {kind} stopped"));
            }
        }
        Ok(())
    }

    /// The claims' cache.
    pub fn claims(&self) -> &ObjectCache<PersistentVolumeClaim> {
        &self.pvcs
    }

    /// Starts the watches with `client` (whose identity must be allowed to list and watch what
    /// a csi-provisioner does) on `runtime`, until `stop`.
    pub fn spawn(
        client: &Client,
        runtime: &tokio::runtime::Handle,
        stop: &CancellationToken,
    ) -> Self {
        fn cache<K>(
            client: &Client,
            runtime: &tokio::runtime::Handle,
            stop: &CancellationToken,
        ) -> ObjectCache<K>
        where
            K: component_runtime::CachedKind,
        {
            ObjectCache::spawn_on(
                runtime,
                Api::all(client.clone()),
                watcher::Config::default(),
                stop.clone(),
            )
        }
        Self {
            pvcs: cache(client, runtime, stop),
            pvs: cache(client, runtime, stop),
            classes: cache(client, runtime, stop),
            csinodes: cache(client, runtime, stop),
            nodes: cache(client, runtime, stop),
        }
    }
}
