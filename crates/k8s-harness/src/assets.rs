//! Where the binaries come from: `CSI_RS_K8S_ASSETS` (a Kubernetes server release's `bin/` plus
//! `csi-sanity`), `CSI_RS_PAUSE_IMAGE`, and the host tools on `PATH` (etcd, containerd, ctr,
//! runc, the CNI plugins, openssl, kubectl).

use std::path::{Path, PathBuf};

use crate::Error;

/// The directory of the Kubernetes binaries (kube-apiserver, kube-controller-manager,
/// kube-scheduler, kubelet, csi-sanity; an `etcd` there is used before the one on PATH).
pub const ASSETS_ENV: &str = "CSI_RS_K8S_ASSETS";
/// The pause image as a docker-archive `.tar`; default `$CSI_RS_K8S_ASSETS/../images/pause-3.9.tar`.
pub const PAUSE_IMAGE_ENV: &str = "CSI_RS_PAUSE_IMAGE";
/// Where the CNI plugins are (Debian's containernetworking-plugins).
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The real Kubernetes binaries a test may run.
#[derive(Debug, Clone)]
pub struct Assets {
    /// The directory `CSI_RS_K8S_ASSETS` names.
    pub dir: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubelet: PathBuf,
    pub csi_sanity: PathBuf,
    /// The pause image (may not exist: only a cluster with a node needs it).
    pub pause_image: PathBuf,
}

impl Assets {
    /// Reads `CSI_RS_K8S_ASSETS` (and `CSI_RS_PAUSE_IMAGE`); [`Error::Missing`] names what
    /// is not there.
    pub fn from_env() -> Result<Assets, Error> {
        let Some(dir) = std::env::var_os(ASSETS_ENV).filter(|d| !d.is_empty()) else {
            return Err(Error::Missing(format!(
                "{ASSETS_ENV} is not set (the bin/ of a kubernetes-server-linux-amd64 v1.26+ release plus csi-sanity; scripts/setup finds one, docs/real-kubernetes.md)"
            )));
        };
        let dir = PathBuf::from(dir);
        let bin = |name: &str| dir.join(name);
        let missing: Vec<&str> = [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "csi-sanity",
        ]
        .into_iter()
        .filter(|b| !is_executable(&bin(b)))
        .collect();
        if !missing.is_empty() {
            return Err(Error::Missing(format!(
                "{ASSETS_ENV}={} lacks {}",
                dir.display(),
                missing.join(", ")
            )));
        }
        let pause_image = std::env::var_os(PAUSE_IMAGE_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("../images/pause-3.9.tar"));
        Ok(Assets {
            kube_apiserver: bin("kube-apiserver"),
            kube_controller_manager: bin("kube-controller-manager"),
            kube_scheduler: bin("kube-scheduler"),
            kubelet: bin("kubelet"),
            csi_sanity: bin("csi-sanity"),
            pause_image,
            dir,
        })
    }

    /// `csi-sanity` for a conformance test, or `None` after `test_support::skip_or_fail`
    /// naming what is missing.
    pub fn csi_sanity_or_skip() -> Option<PathBuf> {
        match Assets::from_env() {
            Ok(a) => Some(a.csi_sanity),
            Err(e) => {
                test_support::skip_or_fail(&e.to_string());
                None
            }
        }
    }

    /// etcd: `etcd` in the assets dir (as envtest's assets have it), else on PATH.
    pub(crate) fn etcd(&self) -> Result<PathBuf, Error> {
        let own = self.dir.join("etcd");
        if is_executable(&own) {
            return Ok(own);
        }
        on_path("etcd", "Debian's etcd-server (scripts/setup installs it)")
    }
}

/// `name` on PATH, or [`Error::Missing`] saying which package has it.
pub(crate) fn on_path(name: &str, package: &str) -> Result<PathBuf, Error> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| Error::Missing(format!("{name} is not on PATH: install {package}")))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
