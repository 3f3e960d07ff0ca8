//! Kubeconfig files and the clients made from them: the admin's under the data dir, each
//! component's own (`identity`). A leaf: every other module may use it.

use std::path::{Path, PathBuf};

use crate::Error;

/// Writes `data` to `path` with mode 0600 (also when the file exists).
pub(crate) fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
}

pub(crate) fn kubeconfig_path(data_dir: &Path) -> PathBuf {
    data_dir.join("kubeconfig")
}

/// A client with `user_agent` and no rate limit (everything runs on one machine).
pub(crate) async fn client(kubeconfig: &Path, user_agent: &str) -> Result<kube::Client, Error> {
    component_runtime::build_client(Some(kubeconfig), user_agent, -1.0, 0)
        .await
        .map_err(|e| Error::start(format!("a client for {user_agent}"), e))
}
