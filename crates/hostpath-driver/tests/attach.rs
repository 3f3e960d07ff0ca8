//! `--enable-attach` over the real unix socket: PUBLISH_UNPUBLISH_VOLUME is offered,
//! ControllerPublish checks fields, volume and node (CSI v1.12's codes) and is idempotent,
//! ControllerUnpublish succeeds for what is unknown, and a controller-only instance (another
//! state dir, as csi-cluster's attacher talks to) validates a node's volume from its ID.
//! Controller calls only: no root needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use csi_spec::v1::controller_service_capability::rpc::Type as CtrlRpc;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use hostpath_driver::Config;
use tonic::Code;

fn publish_req(
    volume_id: &str,
    node_id: &str,
    cap: VolumeCapability,
) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node_id.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn unpublish_req(volume_id: &str, node_id: &str) -> ControllerUnpublishVolumeRequest {
    ControllerUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node_id.into(),
        ..Default::default()
    }
}

fn attach_config(s: &Scratch) -> Config {
    Config {
        enable_attach: true,
        ..config(s)
    }
}

#[tokio::test]
async fn enable_attach_offers_publish_and_checks_the_node() {
    let s = Scratch::new();
    let d = Driver::start(attach_config(&s)).await;
    let mut c = d.controller();
    let rpcs: Vec<_> = c
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(ControllerServiceCapability::rpc_type)
        .collect();
    assert!(rpcs.contains(&CtrlRpc::PublishUnpublishVolume), "{rpcs:?}");
    assert!(rpcs.contains(&CtrlRpc::CreateDeleteVolume), "{rpcs:?}");

    let v = create(&mut c, "pvc-1", MIB, mount_cap()).await;
    assert!(
        v.volume_id.starts_with(&format!("{NODE}_")),
        "the ID names its node: {}",
        v.volume_id
    );

    // Published twice: the same empty answer (nothing to attach, idempotent).
    for _ in 0..2 {
        let r = c
            .controller_publish_volume(publish_req(&v.volume_id, NODE, mount_cap()))
            .await
            .unwrap()
            .into_inner();
        assert!(r.publish_context.is_empty(), "{r:?}");
    }
    // Another node: CSI's "Node does not exist" (NOT_FOUND), naming both nodes.
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, "node-b", mount_cap()))
            .await,
        Code::NotFound,
        "node node-b does not exist",
    );
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, "node-b", mount_cap()))
            .await,
        Code::NotFound,
        NODE,
    );
    // Unknown volumes, with or without a node in the ID.
    let unknown_here = format!("{NODE}_5c0b1f9e-0000-4000-8000-000000000000");
    for id in [
        "5c0b1f9e-0000-4000-8000-000000000000",
        unknown_here.as_str(),
    ] {
        expect_code(
            c.controller_publish_volume(publish_req(id, NODE, mount_cap()))
                .await,
            Code::NotFound,
            &format!("volume {id} does not exist"),
        );
    }
    // Required fields, named.
    expect_code(
        c.controller_publish_volume(publish_req("", NODE, mount_cap()))
            .await,
        Code::InvalidArgument,
        "volume_id is required",
    );
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, "", mount_cap()))
            .await,
        Code::InvalidArgument,
        "node_id is required",
    );
    expect_code(
        c.controller_publish_volume(ControllerPublishVolumeRequest {
            volume_capability: None,
            ..publish_req(&v.volume_id, NODE, mount_cap())
        })
        .await,
        Code::InvalidArgument,
        "volume_capability is required",
    );
    // A capability the volume cannot have.
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, NODE, block_cap()))
            .await,
        Code::InvalidArgument,
        "volume_capability.access_type",
    );
    expect_code(
        c.controller_publish_volume(publish_req(
            &v.volume_id,
            NODE,
            VolumeCapability::mount("", vec![], Mode::MultiNodeMultiWriter),
        ))
        .await,
        Code::InvalidArgument,
        "volume_capability.access_mode",
    );

    // Unpublish: idempotent, and fine for unknown volumes and nodes; the ID is required.
    for (id, node) in [
        (v.volume_id.as_str(), NODE),
        (v.volume_id.as_str(), NODE),
        (v.volume_id.as_str(), "node-b"),
        (v.volume_id.as_str(), ""),
        ("no-such-volume", "no-such-node"),
    ] {
        c.controller_unpublish_volume(unpublish_req(id, node))
            .await
            .unwrap_or_else(|e| panic!("unpublish {id} from {node:?}: {e:?}"));
    }
    expect_code(
        c.controller_unpublish_volume(unpublish_req("", NODE)).await,
        Code::InvalidArgument,
        "volume_id is required",
    );
    d.stop().await;
}

#[tokio::test]
async fn a_controller_only_instance_validates_a_node_s_volume_from_its_id() {
    // The node's instance creates the volume; the controller-only one, with its own (empty)
    // state dir, is what one attacher for all nodes talks to.
    let node_scratch = Scratch::new();
    let node = Driver::start(attach_config(&node_scratch)).await;
    let v = create(&mut node.controller(), "pvc-1", MIB, block_cap()).await;

    let ctl_scratch = Scratch::new();
    let ctl = Driver::start(Config {
        node_id: "controller".into(),
        ..attach_config(&ctl_scratch)
    })
    .await;
    let mut c = ctl.controller();
    c.controller_publish_volume(publish_req(&v.volume_id, NODE, block_cap()))
        .await
        .expect("the node the ID names");
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, "node-b", block_cap()))
            .await,
        Code::NotFound,
        &format!("can be published only to its own node, {NODE}"),
    );
    // An ID without a node cannot be checked by anybody but its node: NOT_FOUND here.
    expect_code(
        c.controller_publish_volume(publish_req(
            "5c0b1f9e-0000-4000-8000-000000000000",
            NODE,
            block_cap(),
        ))
        .await,
        Code::NotFound,
        "does not exist",
    );
    c.controller_unpublish_volume(unpublish_req(&v.volume_id, NODE))
        .await
        .unwrap();
    ctl.stop().await;
    node.stop().await;
}

#[tokio::test]
async fn without_enable_attach_publish_is_unimplemented_and_ids_still_name_the_node() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let v = create(&mut c, "pvc-1", MIB, mount_cap()).await;
    assert!(
        v.volume_id.starts_with(&format!("{NODE}_")),
        "{}",
        v.volume_id
    );
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, NODE, mount_cap()))
            .await,
        Code::Unimplemented,
        "--enable-attach",
    );
    expect_code(
        c.controller_unpublish_volume(unpublish_req(&v.volume_id, NODE))
            .await,
        Code::Unimplemented,
        "--enable-attach",
    );
    d.stop().await;
}
