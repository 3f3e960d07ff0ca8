//! kube-controller-manager's pvc-protection and pv-protection controllers: every claim and
//! volume carries its protection finalizer (kcm adds it when the admission plugin did not), and
//! the finalizer goes only when the object is being deleted and nothing uses it any more: no
//! scheduled, unfinished pod names the claim; the volume is not Bound.
//!
//! Finalizers are written with a merge patch of the whole list plus the resourceVersion it was
//! computed from: a finalizer another controller added in between makes it 409 and the next
//! pass looks again, so no one else's finalizer is ever dropped.

pub(crate) mod pv;
pub(crate) mod pvc;

use serde_json::json;

/// The merge patch that sets `finalizers` to `list`, valid only on `resource_version`.
pub(crate) fn finalizers_patch(
    list: &[String],
    resource_version: Option<&str>,
) -> serde_json::Value {
    json!({"metadata": {"finalizers": list, "resourceVersion": resource_version}})
}
