//! Kubeconfig files and the clients made from them: the admin's under the data dir, each
//! component's own (`identity`). A leaf: every other module may use it.

use std::path::{Path, PathBuf};

use crate::Error;

pub(crate) fn kubeconfig_path(data_dir: &Path) -> PathBuf {
    data_dir.join("kubeconfig")
}

/// A client with `user_agent` and no rate limit (everything runs on one machine).
pub(crate) async fn client(kubeconfig: &Path, user_agent: &str) -> Result<kube::Client, Error> {
    component_runtime::build_client(Some(kubeconfig), user_agent, -1.0, 0)
        .await
        .map_err(|e| Error::start(format!("a client for {user_agent}"), e))
}
