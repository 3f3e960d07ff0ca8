//! Workers: take a key, look the object up in the cache, act, report the outcome to the queue.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::watch::pv_needs_sync;
use crate::context::{Ctx, writes};
use crate::handler::Handler;
use crate::tick::every;
use component_runtime::workqueue::Outcome;

pub(crate) async fn va_worker(ctx: Arc<Ctx>, handler: Arc<dyn Handler>, lane: usize) {
    while let Some(item) = ctx.va_queue.next(lane).await {
        let span = tracing::info_span!("volumeattachment", name = %item.key);
        let outcome = sync_va(&ctx, handler.as_ref(), &item.key)
            .instrument(span)
            .await;
        ctx.va_queue.done(&item, outcome);
    }
}

async fn sync_va(ctx: &Ctx, handler: &dyn Handler, name: &str) -> Outcome {
    let Some(va) = ctx.current_va(name) else {
        tracing::debug!("gone");
        return Outcome::Done;
    };
    if !ctx.owns(&va) {
        return Outcome::Done;
    }
    let force = ctx.take_force_sync(name);
    let detaching = va.metadata.deletion_timestamp.is_some();
    let result = if detaching {
        handler.detach(va.clone(), force).await
    } else {
        handler.attach(va.clone(), force).await
    };
    match result {
        Ok(()) => {
            tracing::debug!(detaching, "synced");
            Outcome::Done
        }
        Err(e) => {
            let op = if detaching { "detach" } else { "attach" };
            tracing::warn!(error = %e, "{op} failed; will retry with backoff");
            if force {
                // The reconciler's request stands until it succeeds.
                ctx.set_force_sync(name);
            }
            if let Err(save) =
                writes::save_error(&ctx.va_api, &ctx.fresh_vas, name, detaching, &e).await
            {
                tracing::warn!(error = %save, "saving the error in the status failed");
            }
            let reason = if detaching {
                "FailedDetach"
            } else {
                "FailedAttach"
            };
            let message = format!("{op} failed: {e}");
            ctx.events.warn(&va, reason, &message).await;
            if e.waits_for_another_object() {
                Outcome::RetryWhenAvailable
            } else {
                Outcome::Retry
            }
        }
    }
}

pub(crate) async fn pv_worker(ctx: Arc<Ctx>) {
    while let Some(item) = ctx.pv_queue.next(0).await {
        let span = tracing::info_span!("persistentvolume", name = %item.key);
        let outcome = sync_pv(&ctx, &item.key).instrument(span).await;
        ctx.pv_queue.done(&item, outcome);
    }
}

/// Removes our finalizer from a PV that is being deleted (or was handed back to its in-tree
/// plugin) once no VolumeAttachment refers to it. The attach path never attaches a PV that is
/// being deleted, so the two cannot race into a detached-but-finalized or attached-but-free PV
/// (the external-attacher design, docs/design/external-attacher.md, "Concurrency").
async fn sync_pv(ctx: &Ctx, name: &str) -> Outcome {
    let Some(pv) = ctx.current_pv(name) else {
        return Outcome::Done;
    };
    if !pv_needs_sync(&pv, &ctx.finalizer, &ctx.driver) {
        return Outcome::Done;
    }
    let users: Vec<String> = ctx
        .vas
        .state()
        .iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name))
        .filter_map(|va| va.metadata.name.clone())
        .collect();
    if !users.is_empty() {
        // Each of them pokes this PV again when it is deleted.
        tracing::debug!(
            ?users,
            "still used by VolumeAttachments; keeping the finalizer"
        );
        return Outcome::Done;
    }
    let why = if pv.metadata.deletion_timestamp.is_some() {
        "being deleted"
    } else if pv.rolled_back(&ctx.driver) {
        "handed back to its in-tree plugin"
    } else {
        "unused"
    };
    match writes::remove_finalizer(
        &ctx.pv_objects(),
        &format!("PersistentVolume {name}"),
        pv,
        &ctx.finalizer,
    )
    .await
    {
        Ok(_) => {
            tracing::info!(
                reason = why,
                "removed our finalizer from the PersistentVolume"
            );
            Outcome::Done
        }
        Err(crate::Error::Kube { source, .. }) if writes::is_not_found(&source) => Outcome::Done,
        Err(e) => {
            tracing::warn!(error = %e, "removing the PV finalizer failed; will retry");
            Outcome::Retry
        }
    }
}

/// Every `--resync`, queue every VolumeAttachment of ours and every PV that needs a look, as the
/// Go informers' resync does (a key waiting out its backoff keeps waiting).
pub(crate) async fn resync(ctx: Arc<Ctx>, stop: CancellationToken) {
    every(ctx.opts.resync, &stop, || async {
        let vas = ctx.vas.state();
        for va in vas.iter().filter(|va| ctx.owns(va)) {
            ctx.enqueue_va(va);
        }
        for pv in ctx.pvs.state() {
            if pv_needs_sync(&pv, &ctx.finalizer, &ctx.driver) {
                if let Some(name) = pv.metadata.name.as_deref() {
                    ctx.pv_queue.add(name, 0);
                }
            }
        }
        tracing::debug!(volumeattachments = vas.len(), "resync");
    })
    .await;
}
