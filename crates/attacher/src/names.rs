//! Names shared with the Go sidecar and Kubernetes: finalizers and annotations that other
//! components (and an attacher of the other implementation) recognise.

/// VolumeAttachment annotation with the CSI node ID the volume was published to, so a detach
/// still works when the node (and its CSINode) is gone.
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

/// PV annotation set by the in-tree controllers when a PV of a migrated plugin is handled by a
/// CSI driver (the migration design, docs/design/migration.md).
pub const MIGRATED_TO_ANNOTATION: &str = "pv.kubernetes.io/migrated-to";

/// The attacher name `--dummy` mode handles (the external-attacher design,
/// docs/design/external-attacher.md).
pub const DUMMY_DRIVER: &str = "csi/dummy";

/// The same in a spelling today's API servers accept: they validate `spec.attacher` as a CSI
/// driver name (a DNS subdomain), so `csi/dummy` can no longer be created. Dummy mode handles
/// both.
pub const DUMMY_DRIVER_VALID: &str = "csi-dummy";

pub use component_runtime::sanitize_driver_name;

/// The finalizer this attacher puts on VolumeAttachments and PVs:
/// `external-attacher/<sanitized driver name>`, exactly as the Go sidecar names it, so the two
/// implementations can replace each other on a live cluster.
pub fn finalizer_name(driver: &str) -> String {
    format!("external-attacher/{}", sanitize_driver_name(driver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_names_match_the_go_sidecar() {
        assert_eq!(
            finalizer_name("ebs.csi.aws.com"),
            "external-attacher/ebs-csi-aws-com"
        );
        assert_eq!(finalizer_name("csi/dummy"), "external-attacher/csi-dummy");
        assert_eq!(
            finalizer_name("mock.csi.rs"),
            "external-attacher/mock-csi-rs"
        );
        assert_eq!(finalizer_name("Foo_Bar-9"), "external-attacher/Foo-Bar-9");
        assert_eq!(finalizer_name("driver."), "external-attacher/driver-X");
        assert_eq!(finalizer_name(""), "external-attacher/X");
    }
}
