//! Event reasons and messages on claims and volumes, worded as the Go sidecar words them
//! (operators grep for them).

/// Normal, on the claim, when the CreateVolume call starts.
pub const PROVISIONING: &str = "Provisioning";
/// Normal, on the claim, when its PV exists.
pub const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
/// Warning, on the claim, for every failed attempt.
pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
/// Warning, on the PV, for a failed delete.
pub const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";

pub fn provisioning(namespace: &str, name: &str) -> String {
    format!("External provisioner is provisioning volume for claim \"{namespace}/{name}\"")
}

pub fn provisioning_succeeded(pv_name: &str) -> String {
    format!("Successfully provisioned volume {pv_name}")
}

pub fn provisioning_failed(class: &str, error: &impl std::fmt::Display) -> String {
    format!("failed to provision volume with StorageClass \"{class}\": {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wording_is_the_go_sidecars() {
        assert_eq!(
            provisioning("ns", "c"),
            "External provisioner is provisioning volume for claim \"ns/c\""
        );
        assert_eq!(
            provisioning_succeeded("pvc-1"),
            "Successfully provisioned volume pvc-1"
        );
        assert_eq!(
            provisioning_failed("fast", &"rpc error: code = Internal desc = x"),
            "failed to provision volume with StorageClass \"fast\": rpc error: code = Internal desc = x"
        );
    }
}
