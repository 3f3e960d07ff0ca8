//! What a reconcile pass does to the world outside the controller, behind one trait, as
//! kube-controller-manager hands its reconciler an operation executor, a node status updater
//! and an event recorder: the controller's [`Live`] starts tokio tasks and writes to the API
//! server; the reconciler's tests pass a fake that records what it was asked (and can refuse a
//! status write), so the decisions that keep a mounted volume attached are tested without an
//! API server.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use tokio::task::JoinSet;

use crate::Error;
use crate::cache::{Attachment, PodRef, VolumeToAttach};
use crate::context::Ctx;
use crate::operations::{spawn_success_events, start_attach, start_detach};
use crate::statusupdater::{NodeStatusUpdater, Reported};

/// The pass's side of every write: operations started, node status patched, Events recorded.
pub(crate) trait Effects {
    /// Starts attaching (the pass registered the operation under the state lock).
    fn start_attach(&mut self, volume: VolumeToAttach, node: String, pods: Vec<PodRef>);

    /// Starts detaching (the pass registered the operation and wrote the node's status
    /// without the volume); `verify_safe`: read the node from the API server first and refuse
    /// if it lists the volume in `status.volumesInUse`.
    fn start_detach(
        &mut self,
        volume: String,
        node: String,
        attachment: Attachment,
        verify_safe: bool,
    );

    /// Sets `node.status.volumesAttached` to `reported`; the node as written.
    fn patch_status(
        &self,
        node: &str,
        reported: &Reported,
    ) -> impl Future<Output = Result<Node, Error>> + Send;

    /// A Warning on a pod.
    fn pod_warning(
        &self,
        pod: &PodRef,
        reason: &str,
        message: &str,
    ) -> impl Future<Output = ()> + Send;

    /// A Warning on a node.
    fn node_warning(
        &self,
        node: &str,
        uid: Option<String>,
        reason: &str,
        message: &str,
    ) -> impl Future<Output = ()> + Send;

    /// `SuccessfulAttachVolume` Events for no-op attaches, written off the path to attached.
    fn success_events(&mut self, events: Vec<(Vec<PodRef>, String)>);
}

/// The controller's effects: tasks on `tasks`, writes through `ctx`'s client.
pub(crate) struct Live<'a> {
    pub ctx: &'a Arc<Ctx>,
    pub tasks: &'a mut JoinSet<()>,
}

impl Effects for Live<'_> {
    fn start_attach(&mut self, volume: VolumeToAttach, node: String, pods: Vec<PodRef>) {
        start_attach(self.ctx, self.tasks, volume, node, pods);
    }

    fn start_detach(
        &mut self,
        volume: String,
        node: String,
        attachment: Attachment,
        verify_safe: bool,
    ) {
        start_detach(self.ctx, self.tasks, volume, node, attachment, verify_safe);
    }

    async fn patch_status(&self, node: &str, reported: &Reported) -> Result<Node, Error> {
        NodeStatusUpdater::patch(self.ctx, node, reported).await
    }

    async fn pod_warning(&self, pod: &PodRef, reason: &str, message: &str) {
        self.ctx.events.pod_event(pod, true, reason, message).await;
    }

    async fn node_warning(&self, node: &str, uid: Option<String>, reason: &str, message: &str) {
        self.ctx
            .events
            .node_warning(node, uid, reason, message)
            .await;
    }

    fn success_events(&mut self, events: Vec<(Vec<PodRef>, String)>) {
        spawn_success_events(self.ctx, self.tasks, events);
    }
}
