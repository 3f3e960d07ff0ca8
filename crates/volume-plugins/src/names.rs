//! The names Kubernetes gives volumes and VolumeAttachments. The attach/detach controller, the
//! kubelet and the external attacher find each other's objects by these names, so they must be
//! byte for byte Kubernetes' own.

use sha2::{Digest, Sha256};

/// The in-tree CSI volume plugin's name; also the prefix of CSI unique volume names.
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";

/// The in-tree AWS EBS plugin's name.
pub const AWS_EBS_PLUGIN_NAME: &str = "kubernetes.io/aws-ebs";

/// A VolumeAttachment's name: `csi-` + hex(sha256(volume handle + driver + node)). An existing
/// VolumeAttachment for the same volume on the same node is found (and reused) by this name.
pub fn volume_attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    let mut h = Sha256::new();
    h.update(volume_handle.as_bytes());
    h.update(driver.as_bytes());
    h.update(node.as_bytes());
    format!("csi-{}", hex::encode(h.finalize()))
}

/// A CSI volume's unique name in `node.status.volumesAttached` / `volumesInUse`:
/// `kubernetes.io/csi/<driver>^<volume handle>`.
pub fn csi_unique_volume_name(driver: &str, volume_handle: &str) -> String {
    format!("{CSI_PLUGIN_NAME}/{driver}^{volume_handle}")
}

/// An in-tree EBS volume's unique name: `kubernetes.io/aws-ebs/<volumeID as in the spec>`.
pub fn aws_ebs_unique_volume_name(volume_id: &str) -> String {
    format!("{AWS_EBS_PLUGIN_NAME}/{volume_id}")
}

/// The kubelet's staging path of a CSI volume under its root dir:
/// `plugins/kubernetes.io/csi/<driver>/<hex(sha256(volume handle))>/globalmount`.
pub fn csi_staging_path(root_dir: &str, driver: &str, volume_handle: &str) -> String {
    let digest = hex::encode(Sha256::digest(volume_handle.as_bytes()));
    format!(
        "{}/plugins/{CSI_PLUGIN_NAME}/{driver}/{digest}/globalmount",
        root_dir.trim_end_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_attachment_name_is_the_sha256_of_the_three_concatenated() {
        let name = volume_attachment_name("vol-0123", "ebs.csi.aws.com", "node-1");
        // sha256("vol-0123ebs.csi.aws.comnode-1"), computed independently with sha256sum.
        assert_eq!(
            name,
            "csi-07ecfc852da5dfbbd7b01cdb93df1864837f37ce73ed4e3cb83ccc4a0168a004"
        );
        assert_eq!(
            name,
            format!("csi-{}", sha256_hex("vol-0123ebs.csi.aws.comnode-1"))
        );
        assert_eq!(name.len(), 4 + 64);
        assert_ne!(
            name,
            volume_attachment_name("vol-0123", "ebs.csi.aws.com", "node-2")
        );
    }

    fn sha256_hex(s: &str) -> String {
        let out = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(s.as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_string()
    }

    #[test]
    fn unique_names_and_paths() {
        assert_eq!(
            csi_unique_volume_name("ebs.csi.aws.com", "vol-1"),
            "kubernetes.io/csi/ebs.csi.aws.com^vol-1"
        );
        assert_eq!(
            aws_ebs_unique_volume_name("aws://us-east-1a/vol-1"),
            "kubernetes.io/aws-ebs/aws://us-east-1a/vol-1"
        );
        assert_eq!(
            csi_staging_path("/var/lib/kubelet/", "hostpath.csi.k8s.io", "v1"),
            format!(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/{}/globalmount",
                sha256_hex("v1")
            )
        );
    }
}
