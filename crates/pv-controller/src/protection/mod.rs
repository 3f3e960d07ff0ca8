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

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::json;

/// What the protection controllers need of the controller that runs them (passed in, so this
/// module depends on no controller): the client, and where a written object goes so that the
/// next pass sees it before the watch does.
pub(crate) trait Writer {
    fn client(&self) -> &kube::Client;
    fn remember_volume(&self, volume: PersistentVolume) -> Arc<PersistentVolume>;
    fn remember_claim(&self, claim: PersistentVolumeClaim) -> Arc<PersistentVolumeClaim>;
}

/// The merge patch that sets `finalizers` to `list`, valid only on `resource_version`.
pub(crate) fn finalizers_patch(
    list: &[String],
    resource_version: Option<&str>,
) -> serde_json::Value {
    json!({"metadata": {"finalizers": list, "resourceVersion": resource_version}})
}

/// A finalizer write's result, with a 404 as `Ok(None)`: the object is already gone, which is
/// what removing the finalizer was for (and, when adding it, leaves nothing to protect). It is
/// success, not a failure to retry or warn about.
pub(crate) fn unless_gone<T>(result: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("m", "r")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn an_object_already_gone_is_success() {
        assert_eq!(unless_gone(Ok::<_, kube::Error>(1)).unwrap(), Some(1));
        assert_eq!(unless_gone::<i32>(Err(api_error(404))).unwrap(), None);
        assert!(unless_gone::<i32>(Err(api_error(409))).is_err());
        assert!(unless_gone::<i32>(Err(api_error(500))).is_err());
    }
}
