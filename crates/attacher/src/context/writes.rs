//! Every write the controller makes, each one JSON merge patch and each skipped when its effect
//! is already there.
//!
//! Finalizer lists are replaced whole by a merge patch, so those patches carry
//! `metadata.resourceVersion`: the API server refuses a patch computed from a stale copy (409),
//! and we take the newer copy from the watch and recompute instead of dropping somebody else's
//! finalizer.
//! Status patches touch only our own fields and need no such guard.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use crate::slim_objects::Pv;
use crate::slim_objects::Va;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::fresh::Fresh;
use crate::Error;
use crate::names::NODE_ID_ANNOTATION;

/// Conflicts in a row before giving up (and retrying with backoff).
const MAX_CONFLICTS: u32 = 5;
/// How long to wait for the watch to deliver the copy that beat ours.
const CONFLICT_WAIT: Duration = Duration::from_secs(2);
/// `status.attachError.message` is limited to 1024 characters by the API.
const MAX_MESSAGE: usize = 1024;

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    is_status(e, 404)
}

/// An object kind as the writers see it: the API, the watch cache and our own last writes.
pub(crate) struct Objects<'a, K: Resource<DynamicType = ()> + 'static> {
    pub api: &'a Api<K>,
    pub store: &'a Store<K>,
    pub fresh: &'a Fresh<K>,
}

impl<K> Objects<'_, K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// The newest copy we know of: the cache, or our own last write if that is newer.
    pub(crate) fn current(&self, name: &str) -> Option<Arc<K>> {
        self.fresh.pick(name, self.store.get(&ObjectRef::new(name)))
    }
}

fn rv_of<K: Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

/// After a 409: waits (briefly) for the watch to bring a copy newer than `stale`. The watch
/// already carries every change, so this costs no API read (and no `get` permission).
async fn newer_than<K>(objs: &Objects<'_, K>, name: &str, stale: &K) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let deadline = tokio::time::Instant::now() + CONFLICT_WAIT;
    loop {
        if let Some(obj) = objs.current(name) {
            let newer = match (rv_of(obj.as_ref()), rv_of(stale)) {
                (Some(new), Some(old)) => new > old,
                _ => obj.meta().resource_version != stale.meta().resource_version,
            };
            if newer {
                return Some(obj);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Patches `metadata` with what `compute` returns for the current object (None: nothing to
/// do), guarded by the object's resourceVersion; on a conflict takes the newer copy from the
/// watch and recomputes.
pub(crate) async fn patch_metadata<K, F>(
    objs: &Objects<'_, K>,
    what: &str,
    start: Arc<K>,
    compute: F,
) -> Result<Arc<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + 'static,
    F: Fn(&K) -> Result<Option<Map<String, Value>>, Error>,
{
    let name = start.meta().name.clone().unwrap_or_default();
    let mut current = start;
    for _ in 0..MAX_CONFLICTS {
        let Some(mut meta) = compute(&current)? else {
            return Ok(current);
        };
        meta.insert(
            "resourceVersion".into(),
            json!(current.meta().resource_version),
        );
        let patch = json!({ "metadata": meta });
        match objs
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(obj) => {
                let obj = Arc::new(obj);
                objs.fresh.record(obj.clone());
                return Ok(obj);
            }
            Err(e) if is_status(&e, 409) => {
                tracing::debug!(object = what, "conflict; waiting for the newer copy");
                match newer_than(objs, &name, &current).await {
                    Some(obj) => current = obj,
                    None if objs.current(&name).is_none() => {
                        return Err(Error::kube(format!("patching {what}"), e));
                    }
                    None => break,
                }
            }
            Err(e) => return Err(Error::kube(format!("patching {what}"), e)),
        }
    }
    Err(Error::Conflict {
        action: format!("patching {what}"),
        attempts: MAX_CONFLICTS,
    })
}

fn finalizers<K: Resource>(obj: &K) -> Vec<String> {
    obj.meta().finalizers.clone().unwrap_or_default()
}

pub(crate) fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Adds our finalizer to the PV (no write if it is there). Refuses a PV being deleted.
pub(crate) async fn add_pv_finalizer(
    objs: &Objects<'_, Pv>,
    pv: Arc<Pv>,
    finalizer: &str,
) -> Result<Arc<Pv>, Error> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let what = format!("PersistentVolume {name}");
    patch_metadata(objs, &what, pv, |pv| {
        if pv.metadata.deletion_timestamp.is_some() {
            return Err(Error::PersistentVolumeDeleting { name: name.clone() });
        }
        if has_finalizer(pv, finalizer) {
            return Ok(None);
        }
        let mut list = finalizers(pv);
        list.push(finalizer.to_string());
        let mut meta = Map::new();
        meta.insert("finalizers".into(), json!(list));
        Ok(Some(meta))
    })
    .await
    .map_err(|e| match e {
        Error::Kube { ref source, .. } if is_not_found(source) => {
            Error::PersistentVolumeNotFound { name: name.clone() }
        }
        e => e,
    })
}

/// Removes our finalizer from the PV (no write if it is not there).
pub(crate) async fn remove_finalizer<K>(
    objs: &Objects<'_, K>,
    what: &str,
    obj: Arc<K>,
    finalizer: &str,
) -> Result<Arc<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + 'static,
{
    patch_metadata(objs, what, obj, |o| {
        if !has_finalizer(o, finalizer) {
            return Ok(None);
        }
        let list: Vec<String> = finalizers(o)
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        let mut meta = Map::new();
        meta.insert("finalizers".into(), json!(list));
        Ok(Some(meta))
    })
    .await
}

/// Adds our finalizer and the node-ID annotation to the VolumeAttachment in one patch (no
/// write if both are there).
pub(crate) async fn prepare_va(
    objs: &Objects<'_, Va>,
    va: Arc<Va>,
    finalizer: &str,
    node_id: &str,
) -> Result<Arc<Va>, Error> {
    let what = format!(
        "VolumeAttachment {}",
        va.metadata.name.as_deref().unwrap_or_default()
    );
    patch_metadata(objs, &what, va, |va| {
        if va.metadata.deletion_timestamp.is_some() {
            // Deleted while we were validating: no new finalizers on a dying object.
            return Err(Error::InvalidVolumeAttachment {
                name: va.metadata.name.clone().unwrap_or_default(),
                reason: "is being deleted; not attaching".into(),
            });
        }
        let mut meta = Map::new();
        if !has_finalizer(va, finalizer) {
            let mut list = finalizers(va);
            list.push(finalizer.to_string());
            meta.insert("finalizers".into(), json!(list));
        }
        let annotated = va.node_id.as_deref() == Some(node_id);
        if !annotated {
            meta.insert("annotations".into(), json!({ NODE_ID_ANNOTATION: node_id }));
        }
        Ok((!meta.is_empty()).then_some(meta))
    })
    .await
}

fn status(va: &Va) -> Option<&k8s_openapi::api::storage::v1::VolumeAttachmentStatus> {
    va.status.as_ref()
}

async fn patch_status(
    api: &Api<Va>,
    fresh: &Fresh<Va>,
    name: &str,
    status: Value,
) -> Result<Arc<Va>, Error> {
    let patch = json!({ "status": status });
    let obj = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("updating the status of VolumeAttachment {name}"), e))?;
    let obj = Arc::new(obj);
    fresh.record(obj.clone());
    Ok(obj)
}

/// `status.attached = true`, `attachmentMetadata` = the publish context, `attachError` cleared:
/// one status patch, skipped when the status already says exactly that.
pub(crate) async fn mark_attached(
    api: &Api<Va>,
    fresh: &Fresh<Va>,
    va: &Va,
    metadata: BTreeMap<String, String>,
) -> Result<(), Error> {
    let name = va.metadata.name.clone().unwrap_or_default();
    let current = status(va);
    let old_meta = current
        .and_then(|s| s.attachment_metadata.clone())
        .unwrap_or_default();
    let done =
        current.is_some_and(|s| s.attached && s.attach_error.is_none()) && old_meta == metadata;
    if done {
        return Ok(());
    }
    // Merge patch merges maps: keys of an earlier publish that are gone now must be nulled.
    let mut meta_patch: Map<String, Value> = old_meta
        .keys()
        .filter(|k| !metadata.contains_key(*k))
        .map(|k| (k.clone(), Value::Null))
        .collect();
    for (k, v) in metadata {
        meta_patch.insert(k, Value::String(v));
    }
    let mut st = Map::new();
    st.insert("attached".into(), json!(true));
    st.insert("attachmentMetadata".into(), Value::Object(meta_patch));
    if current.is_some_and(|s| s.attach_error.is_some()) {
        st.insert("attachError".into(), Value::Null);
    }
    patch_status(api, fresh, &name, Value::Object(st)).await?;
    Ok(())
}

/// `status.attached = true` with no metadata and no finalizer (the trivial handler).
pub(crate) async fn mark_attached_trivially(
    api: &Api<Va>,
    fresh: &Fresh<Va>,
    va: &Va,
) -> Result<(), Error> {
    if status(va).is_some_and(|s| s.attached && s.attach_error.is_none()) {
        return Ok(());
    }
    let name = va.metadata.name.clone().unwrap_or_default();
    patch_status(
        api,
        fresh,
        &name,
        json!({"attached": true, "attachError": null}),
    )
    .await?;
    Ok(())
}

/// After a successful ControllerUnpublishVolume: remove our finalizer. When it is the last
/// finalizer the object goes away with that one patch; when others keep it alive, the status is
/// first set to detached (attached=false, no metadata, no detachError) so it does not lie.
pub(crate) async fn mark_detached(
    objs: &Objects<'_, Va>,
    va: Arc<Va>,
    finalizer: &str,
) -> Result<(), Error> {
    let name = va.metadata.name.clone().unwrap_or_default();
    let others = finalizers(va.as_ref()).iter().any(|f| f != finalizer);
    let st = status(&va);
    let dirty_status = st
        .is_some_and(|s| s.attached || s.detach_error.is_some() || s.attachment_metadata.is_some());
    let va = if others && dirty_status {
        patch_status(
            objs.api,
            objs.fresh,
            &name,
            json!({"attached": false, "attachmentMetadata": null, "detachError": null}),
        )
        .await?
    } else {
        va
    };
    match remove_finalizer(objs, &format!("VolumeAttachment {name}"), va, finalizer).await {
        Ok(_) => Ok(()),
        Err(Error::Kube { source, .. }) if is_not_found(&source) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Cuts a message to what `status.*Error.message` accepts, on a character boundary.
pub(crate) fn truncate_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// Records a failed attach or detach in `status.attachError` / `status.detachError`.
pub(crate) async fn save_error(
    api: &Api<Va>,
    fresh: &Fresh<Va>,
    name: &str,
    detaching: bool,
    error: &Error,
) -> Result<(), Error> {
    let field = if detaching {
        "detachError"
    } else {
        "attachError"
    };
    let mut value = json!({
        "time": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        "message": truncate_message(&error.to_string()),
    });
    if let (Some(code), Some(obj)) = (error.grpc_code(), value.as_object_mut()) {
        obj.insert("errorCode".into(), json!(code as i32));
    }
    match patch_status(api, fresh, name, json!({ field: value })).await {
        Ok(_) => Ok(()),
        Err(Error::Kube { source, .. }) if is_not_found(&source) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let short = "x".repeat(1024);
        assert_eq!(truncate_message(&short), short);
        let long = "é".repeat(1000);
        let cut = truncate_message(&long);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with("..."));
    }
}
