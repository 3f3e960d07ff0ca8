//! Each component's own credential on apiserver-lite, as a kubeadm (or kind) cluster gives each
//! its own: kube-controller-manager's controllers their service accounts (kcm's
//! `--use-service-account-credentials`), the scheduler `system:kube-scheduler`, each kubelet
//! (here the node agent) `system:node:<node>` in group `system:nodes`, and the CSI sidecars
//! the service accounts `deploy/` runs them under. So apiserver-lite's audit record names the
//! component behind every request, as the real audit log does.
//!
//! Each identity's kubeconfig is `<data-dir>/kubeconfigs/<file>.kubeconfig` (mode 0600); its
//! token is kept in apiserver-lite's data dir, so the file stays valid across restarts of the
//! API server and of `up`. `<data-dir>/kubeconfig` stays the admin's, for kubectl.

use std::path::{Path, PathBuf};

use crate::{EBS_DRIVER, Error, HOSTPATH_DRIVER};

/// The namespace of the service accounts below (kcm's controllers' and deploy/'s).
pub const SERVICE_ACCOUNT_NAMESPACE: &str = "kube-system";
/// kcm's service accounts of the controllers csi-cluster runs.
pub const PV_CONTROLLER_SA: &str = "persistent-volume-binder";
pub const ADC_SA: &str = "attachdetach-controller";
pub const EPHEMERAL_VOLUME_SA: &str = "ephemeral-volume-controller";
pub const STATEFULSET_SA: &str = "statefulset-controller";
/// deploy/kubernetes/base: the EBS controller pod's account (csi-attacher, csi-provisioner).
pub const EBS_CONTROLLER_SA: &str = "ebs-csi-controller-sa";
/// deploy/kubernetes/overlays/hostpath: the hostpath plugin's account (its csi-provisioner;
/// here also the csi-attacher of `--hostpath-attach-required`).
pub const HOSTPATH_SA: &str = "csi-hostpathplugin-sa";
/// The `--driver` drivers' sidecars (no manifest of theirs in deploy/): the accounts the
/// upstream sidecars' own RBAC examples create.
pub const EXTERNAL_ATTACHER_SA: &str = "csi-attacher";
pub const EXTERNAL_PROVISIONER_SA: &str = "csi-provisioner";
/// kube-scheduler's user (kubeadm's scheduler.conf).
pub const SCHEDULER_USER: &str = "system:kube-scheduler";
/// kube-controller-manager's own user (kubeadm's controller-manager.conf): its shared
/// informers list and watch with it, its controllers write with their service accounts.
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";

/// Who a component is to the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The kubeconfig's file name without `.kubeconfig`.
    pub file: String,
    /// The Kubernetes user name.
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    /// `system:serviceaccount:kube-system:<name>`, in the groups the real server gives a
    /// service account's token.
    pub fn service_account(name: &str) -> Self {
        Self {
            file: name.to_string(),
            user: format!("system:serviceaccount:{SERVICE_ACCOUNT_NAMESPACE}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{SERVICE_ACCOUNT_NAMESPACE}"),
            ],
        }
    }

    /// The kubelet of `node`: `system:node:<node>` in `system:nodes` (what the Node
    /// authorizer and NodeRestriction key on).
    pub fn node(node: &str) -> Self {
        Self {
            file: format!("kubelet-{node}"),
            user: format!("system:node:{node}"),
            groups: vec!["system:nodes".into()],
        }
    }

    /// kube-controller-manager itself: the control plane's shared watch caches.
    pub fn controller_manager() -> Self {
        Self {
            file: "kube-controller-manager".into(),
            user: CONTROLLER_MANAGER_USER.into(),
            groups: Vec::new(),
        }
    }

    pub fn scheduler() -> Self {
        Self {
            file: "kube-scheduler".into(),
            user: SCHEDULER_USER.into(),
            groups: Vec::new(),
        }
    }

    /// The csi-attacher of `driver`.
    pub fn attacher(driver: &str) -> Self {
        Self::service_account(match driver {
            EBS_DRIVER => EBS_CONTROLLER_SA,
            HOSTPATH_DRIVER => HOSTPATH_SA,
            _ => EXTERNAL_ATTACHER_SA,
        })
    }

    /// The csi-provisioner(s) of `driver`.
    pub fn provisioner(driver: &str) -> Self {
        Self::service_account(match driver {
            EBS_DRIVER => EBS_CONTROLLER_SA,
            HOSTPATH_DRIVER => HOSTPATH_SA,
            _ => EXTERNAL_PROVISIONER_SA,
        })
    }
}

/// `<data-dir>/kubeconfigs`.
pub fn kubeconfigs_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("kubeconfigs")
}

/// Writes the components' kubeconfigs from the running API server.
pub(crate) struct Kubeconfigs<'a> {
    server: &'a apiserver::RunningApiServer,
    dir: PathBuf,
}

impl<'a> Kubeconfigs<'a> {
    pub(crate) fn new(
        server: &'a apiserver::RunningApiServer,
        data_dir: &Path,
    ) -> Result<Self, Error> {
        let dir = kubeconfigs_dir(data_dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        Ok(Self { server, dir })
    }

    /// Writes `id`'s kubeconfig (its token minted on first use) and returns its path. Writing
    /// it again gives the same file.
    pub(crate) fn path(&self, id: &Identity) -> Result<PathBuf, Error> {
        let groups: Vec<&str> = id.groups.iter().map(String::as_str).collect();
        let yaml = self
            .server
            .kubeconfig_yaml_for_member(&id.user, &groups)
            .map_err(|e| Error::start(format!("a kubeconfig for {}", id.user), e))?;
        let path = self.dir.join(format!("{}.kubeconfig", id.file));
        apiserver::write_private(&path, yaml.as_bytes())
            .map_err(|e| Error::io("writing the kubeconfig", &path, e))?;
        Ok(path)
    }

    /// A client of `id` with `user_agent` (see [`crate::kubeconfig::client`]).
    pub(crate) async fn client(
        &self,
        id: &Identity,
        user_agent: &str,
    ) -> Result<kube::Client, Error> {
        crate::kubeconfig::client(&self.path(id)?, user_agent).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_real_components_and_deploy_manifests() {
        let sa = Identity::service_account(PV_CONTROLLER_SA);
        assert_eq!(
            sa.user,
            "system:serviceaccount:kube-system:persistent-volume-binder"
        );
        assert_eq!(
            sa.groups,
            vec![
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system"
            ]
        );
        let node = Identity::node("node-3");
        assert_eq!(
            (node.file.as_str(), node.user.as_str()),
            ("kubelet-node-3", "system:node:node-3")
        );
        assert_eq!(node.groups, vec!["system:nodes"]);
        assert_eq!(
            Identity::attacher(EBS_DRIVER),
            Identity::provisioner(EBS_DRIVER)
        );
        assert_eq!(Identity::provisioner(HOSTPATH_DRIVER).file, HOSTPATH_SA);
        assert_eq!(
            Identity::attacher("x.example.com").user,
            "system:serviceaccount:kube-system:csi-attacher"
        );
        // deploy/ has these accounts (the tests of deploy/ check the manifests themselves).
        let manifests = concat!(
            include_str!("../../../deploy/kubernetes/base/serviceaccounts.yaml"),
            include_str!("../../../deploy/kubernetes/overlays/hostpath/serviceaccount.yaml")
        );
        for sa in [EBS_CONTROLLER_SA, HOSTPATH_SA] {
            assert!(manifests.contains(&format!("name: {sa}\n")), "{sa}");
        }
    }
}
