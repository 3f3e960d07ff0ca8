//! Watches feeding the caches and the queues.
//!
//! Each watch applies its events to a reflector store itself (rather than through
//! `reflector()`), so it can compare the new object with the cached old one and decide whether
//! the change needs a worker. After a re-list (watch expired, API server restarted) objects
//! that disappeared meanwhile are reported as deleted, so a missed VolumeAttachment deletion
//! still pokes its PV.

use std::sync::Arc;

use crate::slim_objects::Pv;
use crate::slim_objects::{CsiNode, Va};
use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::context::{Ctx, writes};
use crate::names::NODE_ID_ANNOTATION;

pub(crate) struct Writers {
    pub vas: Writer<Va>,
    pub pvs: Writer<Pv>,
    pub csinodes: Writer<CsiNode>,
}

/// What a watch saw, with the cached object it replaces.
pub(crate) enum Change<'a, K> {
    Applied { old: Option<Arc<K>>, new: &'a K },
    Deleted(&'a K),
}

pub(crate) fn spawn(
    set: &mut JoinSet<()>,
    ctx: Arc<Ctx>,
    writers: Writers,
    stop: CancellationToken,
) {
    let c = ctx.clone();
    set.spawn(watch_loop(
        ctx.va_api.clone(),
        writers.vas,
        ctx.vas.clone(),
        stop.clone(),
        move |change| on_va(&c, change),
    ));
    let c = ctx.clone();
    set.spawn(watch_loop(
        ctx.pv_api.clone(),
        writers.pvs,
        ctx.pvs.clone(),
        stop.clone(),
        move |change| on_pv(&c, change),
    ));
    let c = ctx.clone();
    set.spawn(watch_loop(
        ctx.csinode_api.clone(),
        writers.csinodes,
        ctx.csinodes.clone(),
        stop,
        move |change| on_csinode(&c, change),
    ));
}

async fn watch_loop<K, F>(
    api: Api<K>,
    mut writer: Writer<K>,
    store: Store<K>,
    stop: CancellationToken,
    mut on_change: F,
) where
    K: component_runtime::CachedKind,
    F: FnMut(Change<'_, K>),
{
    let mut events = std::pin::pin!(component_runtime::watch_events(
        api,
        watcher::Config::default(),
        stop
    ));
    // Objects cached when a re-list started: those missing at its end were deleted meanwhile.
    let mut before_relist: Option<Vec<Arc<K>>> = None;
    while let Some(event) = events.next().await {
        match &event {
            Event::Apply(obj) | Event::InitApply(obj) => {
                let old = store.get(&ObjectRef::from_obj(obj));
                writer.apply_watcher_event(&event);
                on_change(Change::Applied { old, new: obj });
            }
            Event::Delete(obj) => {
                writer.apply_watcher_event(&event);
                on_change(Change::Deleted(obj));
            }
            Event::Init => {
                before_relist = Some(store.state());
                writer.apply_watcher_event(&event);
            }
            Event::InitDone => {
                writer.apply_watcher_event(&event);
                for obj in before_relist.take().unwrap_or_default() {
                    if store.get(&ObjectRef::from_obj(obj.as_ref())).is_none() {
                        on_change(Change::Deleted(obj.as_ref()));
                    }
                }
            }
        }
    }
}

/// Does this update need a worker? Not for changes of status (ours: attached, metadata, errors;
/// re-queuing on our own error write would defeat the backoff) nor for our own finalizer and
/// node-ID annotation, nor bookkeeping metadata. Yes for deletion, spec changes and any other
/// change made by somebody else to what is cached (labels are not: `crate::objects`).
pub(crate) fn va_needs_sync(old: &Va, new: &Va, finalizer: &str) -> bool {
    if old.metadata.deletion_timestamp.is_some() != new.metadata.deletion_timestamp.is_some() {
        return true;
    }
    if old.spec != new.spec {
        return true;
    }
    let strip = |va: &Va| {
        let mut m = va.metadata.clone();
        m.resource_version = None;
        m.managed_fields = None;
        m.generation = None;
        if let Some(f) = m.finalizers.as_mut() {
            f.retain(|x| x != finalizer);
        }
        if m.finalizers.as_ref().is_some_and(Vec::is_empty) {
            m.finalizers = None;
        }
        if let Some(a) = m.annotations.as_mut() {
            a.remove(NODE_ID_ANNOTATION);
        }
        if m.annotations.as_ref().is_some_and(|a| a.is_empty()) {
            m.annotations = None;
        }
        m
    };
    strip(old) != strip(new)
}

fn on_va(ctx: &Ctx, change: Change<'_, Va>) {
    match change {
        Change::Applied { old, new } => {
            if !ctx.owns(new) {
                return;
            }
            ctx.fresh_vas.observe(new);
            let sync = old.is_none_or(|old| va_needs_sync(&old, new, &ctx.finalizer));
            if sync {
                ctx.enqueue_va(new);
            }
        }
        Change::Deleted(va) => {
            let name = va.metadata.name.clone().unwrap_or_default();
            ctx.fresh_vas.remove(&name);
            if !ctx.owns(va) {
                return;
            }
            ctx.va_queue.forget(&name);
            if let Some(uid) = va.metadata.uid.as_deref() {
                ctx.events.forget(uid);
            }
            // The PV may now be free of VolumeAttachments: let the PV queue decide.
            if let Some(pv) = va.spec.source.persistent_volume_name.as_deref() {
                ctx.pv_queue.add(pv, 0);
            }
        }
    }
}

/// PVs the PV queue must look at: carrying our finalizer and either being deleted or handed
/// back to the in-tree plugin (migration rolled back). Everything else is left alone.
pub(crate) fn pv_needs_sync(pv: &Pv, finalizer: &str, driver: &str) -> bool {
    writes::has_finalizer(pv, finalizer)
        && (pv.metadata.deletion_timestamp.is_some() || pv.rolled_back(driver))
}

/// Retries now, rather than after their backoff, the VolumeAttachments waiting for something
/// that just appeared. (The Go sidecar waits out the backoff, up to `--retry-interval-max`.)
fn kick_waiting(ctx: &Ctx, waits_for: impl Fn(&Va) -> bool) {
    if !ctx.va_queue.has_kick_candidates() {
        return;
    }
    for va in ctx.vas.state() {
        let attachable = ctx.owns(&va)
            && va.metadata.deletion_timestamp.is_none()
            && !va.status.as_ref().is_some_and(|s| s.attached);
        if attachable && waits_for(&va) {
            if let Some(name) = va.metadata.name.as_deref() {
                ctx.va_queue.kick(name, crate::context::ATTACH);
            }
        }
    }
}

fn node_id_of<'a>(csinode: &'a CsiNode, driver: &str) -> Option<&'a str> {
    csinode.node_id(driver)
}

fn on_csinode(ctx: &Ctx, change: Change<'_, CsiNode>) {
    let Change::Applied { old, new } = change else {
        return;
    };
    let registered = node_id_of(new, &ctx.driver);
    if registered.is_none() || old.as_ref().and_then(|o| node_id_of(o, &ctx.driver)) == registered {
        return;
    }
    // The driver just registered on this node.
    let node = new.metadata.name.clone().unwrap_or_default();
    kick_waiting(ctx, |va| va.spec.node_name == node);
}

fn on_pv(ctx: &Ctx, change: Change<'_, Pv>) {
    match change {
        Change::Applied { old, new } => {
            ctx.fresh_pvs.observe(new);
            if old.is_none() {
                // A new PV: VolumeAttachments created before it may be waiting for it.
                let name = new.metadata.name.clone().unwrap_or_default();
                kick_waiting(ctx, |va| {
                    va.spec.source.persistent_volume_name.as_deref() == Some(name.as_str())
                });
            }
            if pv_needs_sync(new, &ctx.finalizer, &ctx.driver) {
                if let Some(name) = new.metadata.name.as_deref() {
                    ctx.pv_queue.add(name, 0);
                }
            }
        }
        Change::Deleted(pv) => {
            let name = pv.metadata.name.clone().unwrap_or_default();
            ctx.fresh_pvs.remove(&name);
            ctx.pv_queue.forget(&name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::api::storage::v1::{
        VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
        VolumeError,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const FIN: &str = "external-attacher/mock-csi-rs";

    fn va() -> Va {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some("va".into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: "mock.csi.rs".into(),
                node_name: "n".into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some("pv".into()),
                    inline_volume_spec: None,
                },
            },
            status: None,
        }
        .into()
    }

    #[test]
    fn our_own_writes_and_status_changes_do_not_requeue() {
        let old = va();
        let mut new = va();
        new.metadata.resource_version = Some("2".into());
        new.metadata.finalizers = Some(vec![FIN.into()]);
        new.metadata.annotations = Some(
            [(NODE_ID_ANNOTATION.to_string(), "id".to_string())]
                .into_iter()
                .collect(),
        );
        assert!(!va_needs_sync(&old, &new, FIN));
        let mut errored = new.clone();
        errored.status = Some(VolumeAttachmentStatus {
            attach_error: Some(VolumeError {
                message: Some("boom".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(
            !va_needs_sync(&new, &errored, FIN),
            "an error write must not defeat the backoff"
        );
    }

    #[test]
    fn deletion_and_foreign_changes_requeue() {
        let old = va();
        let mut deleted = va();
        deleted.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert!(va_needs_sync(&old, &deleted, FIN));
        let mut labelled = va();
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into_iter().collect());
        assert!(va_needs_sync(&old, &labelled, FIN));
        let mut other_finalizer = va();
        other_finalizer.metadata.finalizers = Some(vec!["someone/else".into()]);
        assert!(va_needs_sync(&old, &other_finalizer, FIN));
    }

    #[test]
    fn only_finalized_pvs_being_deleted_or_rolled_back_go_to_the_pv_queue() {
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv".into()),
                finalizers: Some(vec![FIN.into()]),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PersistentVolumeSpec {
                csi: Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                    driver: "mock.csi.rs".into(),
                    volume_handle: "v".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        };
        let mut pv = Pv::from(pv);
        assert!(!pv_needs_sync(&pv, FIN, "mock.csi.rs"), "alive CSI PV");
        pv.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert!(pv_needs_sync(&pv, FIN, "mock.csi.rs"));
        pv.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
        assert!(!pv_needs_sync(&pv, FIN, "mock.csi.rs"), "not our finalizer");
    }
}
