//! The reconciler (drivers with LIST_VOLUMES_PUBLISHED_NODES): every `--reconcile-sync`, page
//! through ListVolumes and compare each VolumeAttachment's `status.attached` with whether the
//! driver reports the volume published on the node. A VolumeAttachment that disagrees is queued
//! with "force sync", so its worker attaches (or detaches) again even though the status already
//! says it is done — e.g. a volume detached behind Kubernetes' back is attached again.
//! VolumeAttachments a worker is busy with (queued, in progress, in backoff, or finished after
//! the listing started) are skipped: their worker settles them anyway, a publish in flight is
//! not drift, and a listing older than the last attach must not undo it (the Go sidecar
//! re-publishes in that case).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::slim_objects::Va;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::context::Ctx;
use crate::csi::CsiClient;
use crate::handler::{Source, source_of};
use crate::migration;

/// Pages beyond this mean a driver handing out tokens forever.
const MAX_PAGES: usize = 100_000;

pub(crate) async fn run(ctx: Arc<Ctx>, csi: CsiClient, stop: CancellationToken) {
    crate::tick::every(ctx.opts.reconcile_sync, &stop, || async {
        match reconcile_once(&ctx, &csi).await {
            Ok(0) => tracing::debug!("reconciler: every VolumeAttachment agrees with the driver"),
            Ok(n) => tracing::info!(
                requeued = n,
                "reconciler: VolumeAttachments disagree with the driver; re-syncing them"
            ),
            Err(e) => tracing::warn!(error = %e, "reconciler: ListVolumes failed"),
        }
    })
    .await;
}

/// The driver's view: volume ID → node IDs it is published on.
async fn published(ctx: &Ctx, csi: &CsiClient) -> Result<HashMap<String, HashSet<String>>, Error> {
    let mut out: HashMap<String, HashSet<String>> = HashMap::new();
    let mut token = String::new();
    for _ in 0..MAX_PAGES {
        let page = csi
            .list_volumes(ctx.opts.max_entries, token.clone())
            .await?;
        for entry in page.entries {
            let Some(volume) = entry.volume else { continue };
            let nodes = entry
                .status
                .map(|s| s.published_node_ids)
                .unwrap_or_default();
            out.entry(volume.volume_id).or_default().extend(nodes);
        }
        if page.next_token.is_empty() {
            return Ok(out);
        }
        if page.next_token == token {
            return Err(Error::Csi {
                method: "ListVolumes",
                code: tonic::Code::Internal,
                message: format!("next_token {token:?} repeats; stopping"),
            });
        }
        token = page.next_token;
    }
    Err(Error::Csi {
        method: "ListVolumes",
        code: tonic::Code::Internal,
        message: format!("more than {MAX_PAGES} pages"),
    })
}

/// The volume handle and node ID the driver would know this VolumeAttachment by.
fn identify(ctx: &Ctx, va: &Va) -> Option<(String, String)> {
    let node_id = ctx
        .csinodes
        .get(&ObjectRef::new(&va.spec.node_name))
        .and_then(|n| n.node_id(&ctx.driver).map(str::to_string))
        .or_else(|| va.node_id.clone())?;
    let volume = match source_of(va).ok()? {
        Source::Pv(name) => {
            migration::pv_volume(&ctx.current_pv(name)?.to_full(), &ctx.driver).ok()?
        }
        Source::Inline(spec) => {
            migration::inline_volume(va.metadata.name.as_deref()?, spec, &ctx.driver).ok()?
        }
    };
    let handle = if volume.migrated {
        csi_translation::repair_volume_handle(
            &volume.csi.driver,
            &volume.csi.volume_handle,
            &node_id,
        )
        .ok()?
    } else {
        volume.csi.volume_handle
    };
    Some((handle, node_id))
}

/// One pass; returns how many VolumeAttachments were queued.
pub(crate) async fn reconcile_once(ctx: &Ctx, csi: &CsiClient) -> Result<usize, Error> {
    // VolumeAttachments a worker touched after this instant may be newer than the listing.
    let listed_at = std::time::Instant::now();
    let published = published(ctx, csi).await?;
    let mut requeued = 0;
    for va in ctx.vas.state().iter().filter(|va| ctx.owns(va)) {
        let Some(name) = va.metadata.name.as_deref() else {
            continue;
        };
        if ctx.va_queue.busy_since(name, listed_at) {
            continue;
        }
        let Some(va) = ctx.current_va(name) else {
            continue;
        };
        let Some((handle, node_id)) = identify(ctx, &va) else {
            continue;
        };
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        let is_published = published
            .get(&handle)
            .is_some_and(|nodes| nodes.contains(&node_id));
        if attached != is_published {
            tracing::warn!(
                volumeattachment = name,
                volume = %handle,
                node = %node_id,
                attached,
                published = is_published,
                "status disagrees with the driver; re-syncing"
            );
            ctx.set_force_sync(name);
            ctx.enqueue_va(&va);
            requeued += 1;
        }
    }
    Ok(requeued)
}
