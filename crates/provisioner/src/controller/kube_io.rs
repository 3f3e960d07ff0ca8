//! The API calls: secrets, PV create/patch/delete, claim reads, Events.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, Secret, SecretReference,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Resource};
use serde_json::json;

use super::Ctx;
use crate::{Error, PV_FINALIZER};

/// The data of the Secret `r` names, as CSI wants it (string values).
pub(crate) async fn secret_data(
    ctx: &Ctx,
    r: &SecretReference,
) -> Result<HashMap<String, String>, Error> {
    let ns = r.namespace.as_deref().unwrap_or_default();
    let name = r.name.as_deref().unwrap_or_default();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| Error::kube(format!("failed to get secret {ns}/{name}"), e))?;
    let mut out: HashMap<String, String> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    out.extend(secret.string_data.unwrap_or_default());
    Ok(out)
}

/// The claim as the API server has it now (`None`: gone).
pub(crate) async fn current_claim(
    ctx: &Ctx,
    ns: &str,
    name: &str,
) -> Result<Option<PersistentVolumeClaim>, Error> {
    Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("reading PersistentVolumeClaim {ns}/{name}"), e))
}

/// Removes `volume.kubernetes.io/selected-node` (only if the claim is still the one we looked
/// at): the scheduler then picks a node again.
pub(crate) async fn forget_selected_node(
    ctx: &Ctx,
    pvc: &PersistentVolumeClaim,
) -> Result<(), Error> {
    let ns = pvc.metadata.namespace.clone().unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {
            "resourceVersion": pvc.metadata.resource_version,
            "annotations": { crate::SELECTED_NODE_ANNOTATION: null },
        }
    });
    Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| {
            Error::kube(
                format!(
                    "removing {} from PersistentVolumeClaim {ns}/{name}",
                    crate::SELECTED_NODE_ANNOTATION
                ),
                e,
            )
        })
}

/// What creating the PV gave.
pub(crate) enum Created {
    Created,
    /// A PV of that name exists already (409).
    Exists(Box<PersistentVolume>),
}

pub(crate) async fn create_pv(ctx: &Ctx, pv: &PersistentVolume) -> Result<Created, Error> {
    let api = Api::<PersistentVolume>::all(ctx.client.clone());
    let name = pv.metadata.name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), pv).await {
        Ok(_) => Ok(Created::Created),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api
                .get(&name)
                .await
                .map_err(|e| Error::kube(format!("reading existing PersistentVolume {name}"), e))?;
            Ok(Created::Exists(Box::new(existing)))
        }
        Err(e) => Err(Error::kube(format!("creating PersistentVolume {name}"), e)),
    }
}

/// Removes our finalizer (test-and-set on resourceVersion) and returns the PV as written.
pub(crate) async fn remove_finalizer(
    ctx: &Ctx,
    pv: &PersistentVolume,
) -> Result<Option<PersistentVolume>, Error> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let finalizers: Vec<&String> = pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != PV_FINALIZER)
        .collect();
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": pv.metadata.resource_version,
        }
    });
    match Api::<PersistentVolume>::all(ctx.client.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(pv) => Ok(Some(pv)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(Error::kube(
            format!("removing finalizer {PV_FINALIZER} from PersistentVolume {name}"),
            e,
        )),
    }
}

/// Deletes the PV if it is still the one we looked at (same UID).
pub(crate) async fn delete_pv(ctx: &Ctx, pv: &PersistentVolume) -> Result<(), Error> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let params = DeleteParams {
        // The UID alone: the volume behind this PV is already deleted, so any later write to
        // the object (the PV controller's status or finalizer) must not turn the delete into a
        // 409 and a VolumeFailedDelete Event; a PV re-created under the name has another UID.
        preconditions: Some(Preconditions {
            uid: pv.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match Api::<PersistentVolume>::all(ctx.client.clone())
        .delete(&name, &params)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting PersistentVolume {name}"), e)),
    }
}

/// An Event on `obj` (namespaced objects in their namespace, PVs in `default`, as client-go).
pub(crate) async fn event<K: Resource<DynamicType = ()>>(
    ctx: &Ctx,
    obj: &K,
    warning: bool,
    reason: &str,
    message: &str,
) {
    let meta = obj.meta();
    let involved = ObjectReference {
        api_version: Some(K::api_version(&()).to_string()),
        kind: Some(K::kind(&()).to_string()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    };
    let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let kind = if warning {
        component_runtime::EventType::Warning
    } else {
        component_runtime::EventType::Normal
    };
    ctx.recorder
        .record(&ns, involved, kind, reason, message)
        .await;
}
