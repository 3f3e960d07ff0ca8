//! Protobuf's canonical JSON mapping for any CSI message (camelCase names, int64 as strings,
//! enums by name, Timestamps in RFC 3339, defaults left out), through the compiled descriptor
//! set of `csi.proto` and `prost-reflect`.

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};

use crate::{Error, Result};

/// The canonical JSON of a CSI message named `full_name` (e.g. `csi.v1.ProbeResponse`).
pub fn to_json<M: Message>(full_name: &str, message: &M) -> Result<String> {
    let pool = DescriptorPool::decode(csi_spec::FILE_DESCRIPTOR_SET)
        .map_err(|e| Error::Internal(format!("csi descriptor set: {e}")))?;
    let desc = pool
        .get_message_by_name(full_name)
        .ok_or_else(|| Error::Internal(format!("no message {full_name} in csi.proto")))?;
    let dynamic = DynamicMessage::decode(desc, message.encode_to_vec().as_slice())
        .map_err(|e| Error::Internal(format!("re-decoding {full_name}: {e}")))?;
    serde_json::to_string_pretty(&dynamic)
        .map_err(|e| Error::Internal(format!("JSON of {full_name}: {e}")))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use csi_spec::v1::{ControllerPublishVolumeResponse, NodeGetInfoResponse, ProbeResponse};

    use super::*;

    #[test]
    fn canonical_mapping() {
        let json = to_json(
            "csi.v1.NodeGetInfoResponse",
            &NodeGetInfoResponse {
                node_id: "i-1".into(),
                max_volumes_per_node: 25,
                accessible_topology: None,
            },
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["nodeId"], "i-1");
        // int64 is a string in the canonical mapping.
        assert_eq!(v["maxVolumesPerNode"], "25");
        let json = to_json(
            "csi.v1.ControllerPublishVolumeResponse",
            &ControllerPublishVolumeResponse {
                publish_context: HashMap::from([("devicePath".into(), "/dev/xvdba".into())]),
            },
        )
        .unwrap();
        assert!(json.contains("\"publishContext\""), "{json}");
        let json = to_json("csi.v1.ProbeResponse", &ProbeResponse { ready: Some(true) }).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["ready"], true);
    }
}
