//! Constructors for the nested capability messages.
//!
//! The generated shapes are deep (`Capability { type: Some(Type::Rpc(Rpc { type: i32 })) }`);
//! every plugin and every CO builds and inspects them, so the helpers live with the types.

use std::collections::HashMap;

use crate::v1::{
    ControllerServiceCapability, GroupControllerServiceCapability, NodeServiceCapability,
    PluginCapability, Topology, VolumeCapability, controller_service_capability,
    group_controller_service_capability, node_service_capability, plugin_capability,
    volume_capability,
};

impl PluginCapability {
    /// A `service` capability (CONTROLLER_SERVICE, VOLUME_ACCESSIBILITY_CONSTRAINTS, ...).
    pub fn service(kind: plugin_capability::service::Type) -> Self {
        Self {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: kind.into(),
                },
            )),
        }
    }

    /// A `volume_expansion` capability (ONLINE or OFFLINE).
    pub fn volume_expansion(kind: plugin_capability::volume_expansion::Type) -> Self {
        Self {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: kind.into(),
                },
            )),
        }
    }

    /// The service type, if this is a known `service` capability.
    pub fn service_type(&self) -> Option<plugin_capability::service::Type> {
        match &self.r#type {
            Some(plugin_capability::Type::Service(s)) => {
                plugin_capability::service::Type::try_from(s.r#type).ok()
            }
            _ => None,
        }
    }
}

impl ControllerServiceCapability {
    /// An `rpc` capability of the Controller service.
    pub fn rpc(kind: controller_service_capability::rpc::Type) -> Self {
        Self {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc {
                    r#type: kind.into(),
                },
            )),
        }
    }

    /// The RPC type, if this is a known `rpc` capability.
    pub fn rpc_type(&self) -> Option<controller_service_capability::rpc::Type> {
        match &self.r#type {
            Some(controller_service_capability::Type::Rpc(r)) => {
                controller_service_capability::rpc::Type::try_from(r.r#type).ok()
            }
            None => None,
        }
    }
}

impl NodeServiceCapability {
    /// An `rpc` capability of the Node service.
    pub fn rpc(kind: node_service_capability::rpc::Type) -> Self {
        Self {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc {
                    r#type: kind.into(),
                },
            )),
        }
    }

    /// The RPC type, if this is a known `rpc` capability.
    pub fn rpc_type(&self) -> Option<node_service_capability::rpc::Type> {
        match &self.r#type {
            Some(node_service_capability::Type::Rpc(r)) => {
                node_service_capability::rpc::Type::try_from(r.r#type).ok()
            }
            None => None,
        }
    }
}

impl GroupControllerServiceCapability {
    /// An `rpc` capability of the GroupController service.
    pub fn rpc(kind: group_controller_service_capability::rpc::Type) -> Self {
        Self {
            r#type: Some(group_controller_service_capability::Type::Rpc(
                group_controller_service_capability::Rpc {
                    r#type: kind.into(),
                },
            )),
        }
    }
}

impl VolumeCapability {
    /// Filesystem access: `fs_type` may be empty (plugin default), `mount_flags` may be empty.
    pub fn mount(
        fs_type: impl Into<String>,
        mount_flags: Vec<String>,
        mode: volume_capability::access_mode::Mode,
    ) -> Self {
        Self {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    fs_type: fs_type.into(),
                    mount_flags,
                    volume_mount_group: String::new(),
                },
            )),
            access_mode: Some(volume_capability::AccessMode { mode: mode.into() }),
        }
    }

    /// Raw block access.
    pub fn block(mode: volume_capability::access_mode::Mode) -> Self {
        Self {
            access_type: Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume {},
            )),
            access_mode: Some(volume_capability::AccessMode { mode: mode.into() }),
        }
    }

    /// The access mode, if set and known to this version of the spec.
    pub fn mode(&self) -> Option<volume_capability::access_mode::Mode> {
        self.access_mode
            .as_ref()
            .and_then(|m| volume_capability::access_mode::Mode::try_from(m.mode).ok())
    }

    /// True for block access, false for mount access or none.
    pub fn is_block(&self) -> bool {
        matches!(
            self.access_type,
            Some(volume_capability::AccessType::Block(_))
        )
    }
}

impl Topology {
    /// A topology segment map from `(domain, segment)` pairs.
    pub fn from_segments<K, V>(segments: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        Self {
            segments: segments
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect::<HashMap<_, _>>(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::volume_capability::access_mode::Mode;

    #[test]
    fn controller_rpc_round_trips_through_the_enum() {
        let cap = ControllerServiceCapability::rpc(
            controller_service_capability::rpc::Type::PublishUnpublishVolume,
        );
        assert_eq!(
            cap.rpc_type(),
            Some(controller_service_capability::rpc::Type::PublishUnpublishVolume)
        );
        // An enum value from a newer spec is not guessed at.
        let future = ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: 999 },
            )),
        };
        assert_eq!(future.rpc_type(), None);
    }

    #[test]
    fn node_and_plugin_helpers_set_the_oneof() {
        let node =
            NodeServiceCapability::rpc(node_service_capability::rpc::Type::StageUnstageVolume);
        assert_eq!(
            node.rpc_type(),
            Some(node_service_capability::rpc::Type::StageUnstageVolume)
        );
        let plugin = PluginCapability::service(plugin_capability::service::Type::ControllerService);
        assert_eq!(
            plugin.service_type(),
            Some(plugin_capability::service::Type::ControllerService)
        );
        let online =
            PluginCapability::volume_expansion(plugin_capability::volume_expansion::Type::Online);
        assert_eq!(online.service_type(), None);
    }

    #[test]
    fn volume_capability_helpers() {
        let mount = VolumeCapability::mount("ext4", vec!["noatime".into()], Mode::SingleNodeWriter);
        assert!(!mount.is_block());
        assert_eq!(mount.mode(), Some(Mode::SingleNodeWriter));
        let block = VolumeCapability::block(Mode::MultiNodeMultiWriter);
        assert!(block.is_block());
        assert_eq!(block.mode(), Some(Mode::MultiNodeMultiWriter));
        assert_eq!(VolumeCapability::default().mode(), None);
    }

    #[test]
    fn topology_from_pairs() {
        let t = Topology::from_segments([("topology.ebs.csi.aws.com/zone", "us-east-1a")]);
        assert_eq!(
            t.segments
                .get("topology.ebs.csi.aws.com/zone")
                .map(String::as_str),
            Some("us-east-1a")
        );
    }
}
