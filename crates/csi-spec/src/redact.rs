//! `Debug` for requests that carry `secrets`: keys are shown, values never.
//!
//! The spec marks these maps `csi_secret` ("MUST NOT be logged"), yet every gRPC adapter logs
//! requests with `{:?}` sooner or later. build.rs tells prost not to derive `Debug` for exactly
//! these messages; prost's `Message` requires `Debug`, so a message listed there but not here
//! (or here but not there) fails to compile, and a test checks the list against every message
//! with a `secrets` field in the descriptor.

use std::collections::HashMap;
use std::fmt;

use crate::v1;

/// Shows the keys of a secrets map, each with a placeholder value, in sorted order.
struct Redacted<'a>(&'a HashMap<String, String>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        f.debug_map()
            .entries(keys.into_iter().map(|k| (k, "<redacted>")))
            .finish()
    }
}

macro_rules! redacted_debug {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {
        $(
            impl fmt::Debug for v1::$ty {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.debug_struct(stringify!($ty))
                        $(.field(stringify!($field), &self.$field))*
                        .field("secrets", &Redacted(&self.secrets))
                        .finish()
                }
            }
        )*

        /// Messages whose `Debug` is written here (must match build.rs `SECRET_MESSAGES`).
        #[cfg(test)]
        pub(crate) const REDACTED_MESSAGES: &[&str] = &[$(stringify!($ty)),*];
    };
}

redacted_debug! {
    CreateVolumeRequest {
        name, capacity_range, volume_capabilities, parameters, volume_content_source,
        accessibility_requirements, mutable_parameters,
    }
    DeleteVolumeRequest { volume_id }
    ControllerPublishVolumeRequest { volume_id, node_id, volume_capability, readonly, volume_context }
    ControllerUnpublishVolumeRequest { volume_id, node_id }
    ValidateVolumeCapabilitiesRequest {
        volume_id, volume_context, volume_capabilities, parameters, mutable_parameters,
    }
    ControllerModifyVolumeRequest { volume_id, mutable_parameters }
    CreateSnapshotRequest { source_volume_id, name, parameters }
    DeleteSnapshotRequest { snapshot_id }
    ListSnapshotsRequest { max_entries, starting_token, source_volume_id, snapshot_id }
    GetSnapshotRequest { snapshot_id }
    ControllerExpandVolumeRequest { volume_id, capacity_range, volume_capability }
    NodeStageVolumeRequest {
        volume_id, publish_context, staging_target_path, volume_capability, volume_context,
    }
    NodePublishVolumeRequest {
        volume_id, publish_context, staging_target_path, target_path, volume_capability,
        readonly, volume_context,
    }
    NodeExpandVolumeRequest {
        volume_id, volume_path, capacity_range, staging_target_path, volume_capability,
    }
    CreateVolumeGroupSnapshotRequest { name, source_volume_ids, parameters }
    DeleteVolumeGroupSnapshotRequest { group_snapshot_id, snapshot_ids }
    GetVolumeGroupSnapshotRequest { group_snapshot_id, snapshot_ids }
    GetMetadataAllocatedRequest { snapshot_id, starting_offset, max_results }
    GetMetadataDeltaRequest {
        base_snapshot_id, target_snapshot_id, starting_offset, max_results,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn secrets_values_never_reach_debug_output() {
        let req = v1::NodeStageVolumeRequest {
            volume_id: "vol-1".into(),
            staging_target_path: "/staging".into(),
            secrets: HashMap::from([
                ("password".into(), "hunter2".into()),
                ("api-key".into(), "AKIA-SECRET".into()),
            ]),
            ..Default::default()
        };
        let shown = format!("{req:?}");
        assert!(shown.contains("vol-1"), "{shown}");
        assert!(shown.contains("/staging"), "{shown}");
        assert!(shown.contains("\"api-key\": \"<redacted>\""), "{shown}");
        assert!(shown.contains("\"password\": \"<redacted>\""), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("AKIA-SECRET"), "{shown}");
        // Also through the pretty form and inside a tonic::Request.
        let pretty = format!("{:#?}", tonic::Request::new(req));
        assert!(!pretty.contains("hunter2"), "{pretty}");
    }

    #[test]
    fn every_message_with_secrets_is_redacted() {
        let fds = prost_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET)
            .expect("descriptor set decodes");
        let csi = fds
            .file
            .iter()
            .find(|f| f.package() == "csi.v1")
            .expect("csi.v1 file in the descriptor set");
        // Secrets only appear on top-level request messages.
        let mut with_secrets: Vec<&str> = csi
            .message_type
            .iter()
            .filter(|m| m.field.iter().any(|f| f.name() == "secrets"))
            .map(|m| m.name())
            .collect();
        with_secrets.sort_unstable();
        let mut redacted = REDACTED_MESSAGES.to_vec();
        redacted.sort_unstable();
        assert_eq!(with_secrets, redacted);
        assert_eq!(redacted.len(), 19);
    }
}
