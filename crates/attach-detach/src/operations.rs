//! Attach and detach operations (kube-controller-manager's operation executor and nested
//! pending operations): one tokio task each, never two at once on the same volume (on the same
//! volume and node for a multi-attachable one), and exponential backoff after a failure
//! (500 ms doubling up to 2m2s by default) per volume and node.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::time::Instant;
use tracing::Instrument;
use volume_plugins::AttachPath;
use volume_plugins::names::volume_attachment_name;

use crate::cache::{Attachment, Backend, DetachHow, PodRef, VolumeToAttach};
use crate::context::{Ctx, State};
use crate::events::{FAILED_ATTACH, SUCCESSFUL_ATTACH, attach_failed, attach_succeeded};
use crate::in_tree::{InTree, instance_of};

/// The driver whose VolumeAttachment an in-tree EBS detach also deletes (the caveat of
/// the migration design, docs/design/migration.md).
const EBS_CSI_DRIVER: &str = "ebs.csi.aws.com";

/// Starts attaching `volume` to `node` for `pods` (the caller checked `busy` and backoff and
/// registered the operation with [`crate::pending_operations::OperationTable::start`] under the same lock).
pub(crate) fn start_attach(
    ctx: &Arc<Ctx>,
    tasks: &mut tokio::task::JoinSet<()>,
    volume: VolumeToAttach,
    node: String,
    pods: Vec<PodRef>,
) {
    let span = tracing::info_span!("attach", volume = %volume.unique_name, node = %node);
    tasks.spawn(attach(ctx.clone(), volume, node, pods).instrument(span));
}

/// Starts detaching (the caller registered the operation, removed the volume from the node's
/// reported list and wrote node status). With `verify_safe` (every detach but a forced one)
/// the node is read from the API server first, and the detach is refused if the node lists the
/// volume in `status.volumesInUse`.
pub(crate) fn start_detach(
    ctx: &Arc<Ctx>,
    tasks: &mut tokio::task::JoinSet<()>,
    volume: String,
    node: String,
    attachment: Attachment,
    verify_safe: bool,
) {
    let span = tracing::info_span!("detach", volume = %volume, node = %node);
    tasks.spawn(detach(ctx.clone(), volume, node, attachment, verify_safe).instrument(span));
}

/// Why a detach did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DetachError {
    /// The node, read from the API server, still lists the volume in `status.volumesInUse`.
    #[error(
        "volume {volume} is still in use by node {node}, according to the node's status.volumesInUse read from the API server; the detach is retried"
    )]
    InUse { volume: String, node: String },

    /// The node could not be read: the detach does not go ahead unchecked.
    #[error("get node {node} to verify that volume {volume} is safe to detach: {source}")]
    GetNode {
        volume: String,
        node: String,
        #[source]
        source: kube::Error,
    },

    /// The plugin's detach failed.
    #[error(transparent)]
    Plugin(#[from] volume_plugins::Error),
}

/// Where the last check before a detach reads the node: the API server, never the watch cache,
/// which may not have seen the kubelet's latest `status.volumesInUse` yet.
pub(crate) trait LiveNodes {
    /// The node as the API server has it now; `None` when it does not exist.
    fn get_node(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Node>, kube::Error>> + Send;
}

impl LiveNodes for kube::Client {
    async fn get_node(&self, name: &str) -> Result<Option<Node>, kube::Error> {
        Api::<Node>::all(self.clone()).get_opt(name).await
    }
}

/// Kubernetes' `verifyVolumeIsSafeToDetach`: the node as the API server has it must not list
/// `volume` in `status.volumesInUse`. A node that is gone has nothing mounted (the check is
/// skipped, as Kubernetes does); a node that cannot be read fails the detach, which is retried
/// with backoff.
pub(crate) async fn verify_safe_to_detach(
    nodes: &impl LiveNodes,
    volume: &str,
    node: &str,
) -> Result<(), DetachError> {
    let live = nodes
        .get_node(node)
        .await
        .map_err(|source| DetachError::GetNode {
            volume: volume.to_string(),
            node: node.to_string(),
            source,
        })?;
    let Some(live) = live else {
        tracing::warn!(
            volume,
            node,
            "node not found on the API server: detaching without the in-use check"
        );
        return Ok(());
    };
    let in_use = live
        .status
        .as_ref()
        .and_then(|s| s.volumes_in_use.as_ref())
        .is_some_and(|v| v.iter().any(|v| v == volume));
    if in_use {
        return Err(DetachError::InUse {
            volume: volume.to_string(),
            node: node.to_string(),
        });
    }
    tracing::debug!(volume, node, "verified the volume is safe to detach");
    Ok(())
}

/// Whether a failed attach may have left something attached (a VolumeAttachment, an EC2
/// attachment in progress): such a volume stays in the actual state as uncertain, and is
/// detached (through the same checks as an attached one) when no longer wanted. Final only:
/// a spec or configuration error, and a create the API server answered with a refusal
/// (4xx). A request that got no answer, or a 5xx (the server may have stored the object
/// before timing out), may have created the VolumeAttachment.
fn may_be_attached(e: &volume_plugins::Error) -> bool {
    match e {
        volume_plugins::Error::Api {
            source: kube::Error::Api(status),
            ..
        } => status.code >= 500,
        volume_plugins::Error::NoCloud { .. } | volume_plugins::Error::InvalidSpec(_) => false,
        _ => true,
    }
}

/// Whether attaching `volume` is the no-op attach of the skip-attach design as written in
/// 2018, docs/design/skip-attach.md (a CSI driver with `attachRequired: false`,
/// `--skip-attach=through-adc`): nothing to call and nothing to wait for.
pub(crate) fn is_no_op(ctx: &Ctx, volume: &VolumeToAttach) -> bool {
    matches!(&volume.backend, Backend::Csi { volume: v, .. }
        if ctx.csi.attach_path(&v.driver) == AttachPath::NoOpThroughAdc)
}

/// The skip-attach design's no-op attach, done in the reconciler pass itself (the caller registered
/// the operation): the volume is attached at once, so the same pass lists it in the node's
/// `volumesAttached`, instead of a task that the next pass (a period later) would report.
/// Returns the `SuccessfulAttachVolume` Events to write, which the caller sends after the node
/// status (they are not on the path to attached).
pub(crate) fn attach_no_op(
    ctx: &Ctx,
    volume: &VolumeToAttach,
    node: &str,
    pods: Vec<PodRef>,
) -> (Vec<PodRef>, String) {
    if let Backend::Csi { volume: v, .. } = &volume.backend {
        let how = DetachHow::Csi {
            driver: v.driver.clone(),
            handle: v.volume_handle.clone(),
        };
        let mut state = ctx.state();
        state
            .ops
            .finish(&volume.unique_name, node, volume.multi_attach);
        mark_attached(
            &mut state,
            volume,
            node,
            Attachment::new(how, String::new(), true),
        );
    }
    ctx.metrics.operation(
        "volume_attach",
        &volume.plugin_label(),
        true,
        volume.migrated(),
        Duration::ZERO,
    );
    (pods, attach_succeeded(&volume.spec_name))
}

/// Writes `SuccessfulAttachVolume` Events in the background.
pub(crate) fn spawn_success_events(
    ctx: &Arc<Ctx>,
    tasks: &mut tokio::task::JoinSet<()>,
    events: Vec<(Vec<PodRef>, String)>,
) {
    for (pods, message) in events {
        let ctx = ctx.clone();
        tasks.spawn(async move {
            for pod in &pods {
                ctx.events
                    .pod_event(pod, false, SUCCESSFUL_ATTACH, &message)
                    .await;
            }
        });
    }
}

fn mark_attached(
    state: &mut State,
    volume: &VolumeToAttach,
    node: &str,
    mut attachment: Attachment,
) {
    attachment.multi_attach = volume.multi_attach;
    attachment.migrated = volume.migrated();
    state.ops.succeeded(&volume.unique_name, node);
    state
        .asw
        .mark_attached(&volume.unique_name, node, attachment);
    tracing::info!(volume = %volume.unique_name, node = %node, "attached");
}

async fn attach(ctx: Arc<Ctx>, volume: VolumeToAttach, node: String, pods: Vec<PodRef>) {
    let started = Instant::now();
    let timeout = ctx.options.attach_timeout;
    let result: Result<Attachment, volume_plugins::Error> = match &volume.backend {
        Backend::Csi { volume: v, .. } => {
            let how = DetachHow::Csi {
                driver: v.driver.clone(),
                handle: v.volume_handle.clone(),
            };
            let va_name = volume_attachment_name(&v.volume_handle, &v.driver, &node);
            let creates = ctx.csi.attach_path(&v.driver).creates_volume_attachment();
            let existing = ctx
                .caches
                .vas
                .get(&va_name)
                .is_some_and(|va| va.metadata.deletion_timestamp.is_none());
            // A VolumeAttachment from before (a restart, an attach that timed out) is waited
            // for, not created again.
            let r = if creates && existing {
                ctx.csi
                    .wait_for_attach(&v.driver, &v.volume_handle, &node, timeout)
                    .await
            } else {
                if creates {
                    ctx.metrics.api_write("create", "volumeattachments");
                }
                ctx.csi.attach(v, &node, timeout).await
            };
            r.map(|a| Attachment::new(how, a.device_path, true))
        }
        Backend::AwsEbs { volume_id } => {
            let how = DetachHow::AwsEbs {
                volume_id: volume_id.clone(),
            };
            let n = ctx.caches.nodes.get(&node);
            ctx.in_tree
                .attach(volume_id, &node, n.as_deref(), timeout)
                .await
                .map(|(device, instance)| {
                    let mut a = Attachment::new(how, device, true);
                    a.instance_id = Some(instance);
                    a
                })
        }
    };
    let ok = result.is_ok();
    ctx.metrics.operation(
        "volume_attach",
        &volume.plugin_label(),
        ok,
        volume.migrated(),
        started.elapsed(),
    );
    let message = {
        let mut state = ctx.state();
        state
            .ops
            .finish(&volume.unique_name, &node, volume.multi_attach);
        match result {
            Ok(attachment) => {
                mark_attached(&mut state, &volume, &node, attachment);
                Ok(attach_succeeded(&volume.spec_name))
            }
            Err(e) => {
                let delay = state.ops.failed(&volume.unique_name, &node);
                if may_be_attached(&e) {
                    let how = match &volume.backend {
                        Backend::Csi { volume: v, .. } => DetachHow::Csi {
                            driver: v.driver.clone(),
                            handle: v.volume_handle.clone(),
                        },
                        Backend::AwsEbs { volume_id } => DetachHow::AwsEbs {
                            volume_id: volume_id.clone(),
                        },
                    };
                    // Counts as mounted until the node says otherwise, like any attachment.
                    let mut a = Attachment::new(how, String::new(), false);
                    a.multi_attach = volume.multi_attach;
                    a.migrated = volume.migrated();
                    state.asw.mark_uncertain(&volume.unique_name, &node, a);
                }
                tracing::warn!(volume = %volume.unique_name, node = %node, error = %e, retry_in = ?delay, "attach failed");
                Err(attach_failed(&volume.spec_name, &e.to_string()))
            }
        }
    };
    for pod in &pods {
        match &message {
            Ok(m) => ctx.events.pod_event(pod, false, SUCCESSFUL_ATTACH, m).await,
            Err(m) => ctx.events.pod_event(pod, true, FAILED_ATTACH, m).await,
        }
    }
}

async fn detach(
    ctx: Arc<Ctx>,
    volume: String,
    node: String,
    attachment: Attachment,
    verify_safe: bool,
) {
    let started = Instant::now();
    let result = detach_checked(&ctx, &volume, &node, &attachment, verify_safe).await;
    let ok = result.is_ok();
    ctx.metrics.operation(
        "volume_detach",
        &attachment.how.plugin_label(),
        ok,
        attachment.migrated,
        started.elapsed(),
    );
    {
        let mut state = ctx.state();
        state.ops.finish(&volume, &node, attachment.multi_attach);
        match result {
            Ok(()) => {
                state.ops.succeeded(&volume, &node);
                state.asw.remove(&volume, &node);
                tracing::info!(volume = %volume, node = %node, "detached");
            }
            Err(e) => {
                let delay = state.ops.failed(&volume, &node);
                // Still attached: the node lists it again (Kubernetes re-adds it to the
                // volumes to report as attached). An uncertain attachment stays uncertain:
                // only a successful detach takes a volume out of the actual state.
                if let Some(a) = state.asw.get_mut(&volume, &node) {
                    a.report = a.confirmed;
                }
                tracing::warn!(volume = %volume, node = %node, error = %e, retry_in = ?delay, "detach failed");
            }
        }
    }
}

/// The in-use check (unless skipped for a forced detach), then the plugin's detach.
async fn detach_checked(
    ctx: &Ctx,
    volume: &str,
    node: &str,
    attachment: &Attachment,
    verify_safe: bool,
) -> Result<(), DetachError> {
    if verify_safe {
        verify_safe_to_detach(&ctx.client, volume, node).await?;
    }
    let timeout = ctx.options.detach_timeout;
    match &attachment.how {
        DetachHow::Csi { driver, handle } => {
            ctx.metrics.api_write("delete", "volumeattachments");
            ctx.csi.detach(driver, handle, node, timeout).await?;
        }
        DetachHow::AwsEbs { volume_id } => {
            detach_in_tree(ctx, volume_id, node, attachment).await?;
        }
    }
    Ok(())
}

/// The in-tree detach through EC2, then the VolumeAttachment the CSI path would have created
/// (the migration design: a plugin that may have been migrated leaves no orphan). Only one that
/// existed before the EC2 detach is an orphan: the CSI attach of the same volume to the same node
/// goes by another unique volume name, so it may start (and create its VolumeAttachment) while the
/// in-tree detach still waits for EC2, and deleting that one detached the new pod's volume.
async fn detach_in_tree(
    ctx: &Ctx,
    volume_id: &str,
    node: &str,
    attachment: &Attachment,
) -> Result<(), volume_plugins::Error> {
    let handle = InTree::volume_id(volume_id)?;
    let orphan = ctx
        .caches
        .vas
        .get(&volume_attachment_name(&handle, EBS_CSI_DRIVER, node))
        .is_some();
    let instance = match &attachment.instance_id {
        Some(i) => i.clone(),
        None => {
            let n = ctx.caches.nodes.get(node).ok_or_else(|| {
                volume_plugins::Error::InvalidSpec(format!(
                    "node {node} is gone and its EC2 instance is not known: cannot detach {volume_id}"
                ))
            })?;
            instance_of(&n)?
        }
    };
    ctx.in_tree
        .detach(volume_id, &instance, ctx.options.detach_timeout)
        .await?;
    if orphan {
        ctx.csi
            .detach(EBS_CSI_DRIVER, &handle, node, ctx.options.detach_timeout)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The API server's answer to the node GET, canned; counts the GETs.
    struct FakeNodes {
        answer: fn() -> Result<Option<Node>, kube::Error>,
        gets: std::sync::atomic::AtomicUsize,
    }

    impl FakeNodes {
        fn new(answer: fn() -> Result<Option<Node>, kube::Error>) -> Self {
            Self {
                answer,
                gets: std::sync::atomic::AtomicUsize::new(0),
            }
        }
    }

    impl LiveNodes for FakeNodes {
        async fn get_node(&self, name: &str) -> Result<Option<Node>, kube::Error> {
            assert_eq!(name, "n1");
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            (self.answer)()
        }
    }

    fn node_using(volumes: &[&str]) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"volumesInUse": volumes}
        }))
        .expect("node")
    }

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Test").with_code(code),
        ))
    }

    const V: &str = "kubernetes.io/csi/d^h";

    #[tokio::test]
    async fn a_volume_the_live_node_lists_in_use_is_not_safe_to_detach() {
        let fake = FakeNodes::new(|| Ok(Some(node_using(&["kubernetes.io/csi/d^other", V]))));
        let e = verify_safe_to_detach(&fake, V, "n1").await;
        assert!(matches!(&e, Err(DetachError::InUse { .. })), "{e:?}");
        let message = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains(V) && message.contains("n1") && message.contains("volumesInUse"),
            "{message}"
        );
        assert_eq!(fake.gets.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_volume_the_live_node_does_not_use_or_a_gone_node_is_safe_to_detach() {
        let others = FakeNodes::new(|| Ok(Some(node_using(&["kubernetes.io/csi/d^other"]))));
        assert!(verify_safe_to_detach(&others, V, "n1").await.is_ok());
        let none = FakeNodes::new(|| Ok(Some(node_using(&[]))));
        assert!(verify_safe_to_detach(&none, V, "n1").await.is_ok());
        let prefix = FakeNodes::new(|| Ok(Some(node_using(&["kubernetes.io/csi/d^h2"]))));
        assert!(
            verify_safe_to_detach(&prefix, V, "n1").await.is_ok(),
            "names compare whole"
        );
        let gone = FakeNodes::new(|| Ok(None));
        assert!(verify_safe_to_detach(&gone, V, "n1").await.is_ok());
    }

    #[tokio::test]
    async fn a_node_that_cannot_be_read_fails_the_detach() {
        let fake = FakeNodes::new(|| Err(status(503)));
        let e = verify_safe_to_detach(&fake, V, "n1").await;
        assert!(matches!(&e, Err(DetachError::GetNode { .. })), "{e:?}");
        let message = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.starts_with("get node n1 to verify"), "{message}");
    }

    #[test]
    fn only_final_attach_errors_leave_nothing_attached() {
        let api = |source| volume_plugins::Error::Api {
            action: "create VolumeAttachment csi-x".into(),
            source,
        };
        assert!(
            !may_be_attached(&api(status(403))),
            "refused: nothing created"
        );
        assert!(!may_be_attached(&api(status(422))));
        assert!(
            may_be_attached(&api(status(504))),
            "a server time-out may come after the create was stored"
        );
        assert!(
            may_be_attached(&api(kube::Error::Service("connection reset".into()))),
            "no answer: the create may have happened"
        );
        assert!(!may_be_attached(&volume_plugins::Error::InvalidSpec(
            "x".into()
        )));
        assert!(may_be_attached(&volume_plugins::Error::Timeout {
            what: "VolumeAttachment csi-x".into(),
            waited: Duration::from_secs(1),
        }));
        assert!(may_be_attached(&volume_plugins::Error::AttachFailed {
            volume_attachment: "csi-x".into(),
            message: "rpc error".into(),
        }));
    }
}
