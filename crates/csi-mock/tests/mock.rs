//! The mock over its real unix socket, dialed with the csi-spec client.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use csi_mock::{ANY_VOLUME, Method, MockConfig, MockDriver, Step};
use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::controller_service_capability::rpc::Type as RpcType;
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::plugin_capability::service::Type as ServiceType;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::{
    ControllerGetCapabilitiesRequest, ControllerPublishVolumeRequest,
    ControllerUnpublishVolumeRequest, GetPluginCapabilitiesRequest, GetPluginInfoRequest,
    ListVolumesRequest, ProbeRequest, VolumeCapability,
};
use tonic::transport::Channel;
use tonic::{Code, Request};

async fn mock(config: MockConfig) -> (tempfile::TempDir, MockDriver, Channel) {
    let dir = tempfile::tempdir().unwrap();
    let driver = csi_mock::start(dir.path(), config).await.unwrap();
    let channel = csi_spec::connect_unix(&driver.endpoint()).await.unwrap();
    (dir, driver, channel)
}

fn rwo() -> VolumeCapability {
    VolumeCapability::mount("ext4", vec![], Mode::SingleNodeWriter)
}

fn publish_req(volume: &str, node: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    }
}

fn unpublish_req(volume: &str, node: &str) -> ControllerUnpublishVolumeRequest {
    ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

async fn controller_caps(channel: &Channel) -> Result<Vec<RpcType>, tonic::Status> {
    let caps = ControllerClient::new(channel.clone())
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await?
        .into_inner()
        .capabilities;
    Ok(caps.iter().filter_map(|c| c.rpc_type()).collect())
}

/// Polls `cond` until it holds or 10 s pass (the mock records some things after answering).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn identity_answers_and_default_capabilities() {
    let (_dir, driver, channel) = mock(MockConfig {
        name: "test.mock.csi".into(),
        ..MockConfig::default()
    })
    .await;
    assert!(driver.endpoint().starts_with("unix:///"));
    assert!(driver.endpoint().ends_with("/csi.sock"));
    assert!(driver.socket_path().exists());

    let mut identity = IdentityClient::new(channel.clone());
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "test.mock.csi");
    assert!(!info.vendor_version.is_empty());
    let probe = identity.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let plugin = identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<_> = plugin
        .capabilities
        .iter()
        .filter_map(|c| c.service_type())
        .collect();
    assert_eq!(services, vec![ServiceType::ControllerService]);

    let caps = controller_caps(&channel).await.unwrap();
    for want in [
        RpcType::PublishUnpublishVolume,
        RpcType::PublishReadonly,
        RpcType::ListVolumes,
        RpcType::ListVolumesPublishedNodes,
    ] {
        assert!(caps.contains(&want), "{want:?} missing from {caps:?}");
    }

    let methods: Vec<Method> = driver.calls().iter().map(|c| c.method).collect();
    assert_eq!(
        methods,
        vec![
            Method::GetPluginInfo,
            Method::Probe,
            Method::GetPluginCapabilities,
            Method::ControllerGetCapabilities
        ]
    );
    assert!(driver.calls().iter().all(|c| c.code == Code::Ok));
    let path = driver.socket_path().to_path_buf();
    driver.shutdown().await;
    assert!(!path.exists(), "shutdown removes the socket");
}

#[tokio::test]
async fn capabilities_toggle_and_turned_off_rpcs_are_unimplemented() {
    let (_dir, _driver, channel) = mock(MockConfig {
        publish_unpublish: false,
        publish_readonly: false,
        list_published_nodes: true,
        ..MockConfig::default()
    })
    .await;
    assert_eq!(
        controller_caps(&channel).await.unwrap(),
        vec![RpcType::ListVolumes, RpcType::ListVolumesPublishedNodes]
    );
    let mut controller = ControllerClient::new(channel.clone());
    let err = controller
        .controller_publish_volume(publish_req("v", "n"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let err = controller
        .controller_unpublish_volume(unpublish_req("v", "n"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);

    let (_dir, _driver, channel) = mock(MockConfig {
        list_published_nodes: false,
        ..MockConfig::default()
    })
    .await;
    assert_eq!(
        controller_caps(&channel).await.unwrap(),
        vec![RpcType::PublishUnpublishVolume, RpcType::PublishReadonly]
    );
    let err = ControllerClient::new(channel.clone())
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);

    // Without the controller service: no plugin capability and no Controller RPCs.
    let (_dir, driver, channel) = mock(MockConfig {
        controller_service: false,
        ..MockConfig::default()
    })
    .await;
    let plugin = IdentityClient::new(channel.clone())
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(plugin.capabilities.is_empty(), "{plugin:?}");
    let err = controller_caps(&channel).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert_eq!(
        driver.calls_of(Method::ControllerGetCapabilities)[0].code,
        Code::Unimplemented
    );
}

#[tokio::test]
async fn publish_is_idempotent_and_unpublish_removes() {
    let (_dir, driver, channel) = mock(MockConfig::default()).await;
    let mut controller = ControllerClient::new(channel);
    let mut req = publish_req("vol-1", "node-a");
    req.secrets.insert("password".into(), "s3cret".into());
    req.volume_context.insert("k".into(), "v".into());
    let first = controller
        .controller_publish_volume(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        first
            .publish_context
            .get(csi_mock::DEVICE_PATH_KEY)
            .unwrap(),
        "/dev/mock/vol-1"
    );
    let again = controller
        .controller_publish_volume(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.publish_context, again.publish_context);
    assert_eq!(
        driver.published().get("vol-1").unwrap(),
        &["node-a".to_owned()].into()
    );

    let calls = driver.calls_of(Method::ControllerPublishVolume);
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].volume_id, "vol-1");
    assert_eq!(calls[0].node_id, "node-a");
    assert_eq!(calls[0].secrets.get("password").unwrap(), "s3cret");
    assert_eq!(calls[0].volume_context.get("k").unwrap(), "v");
    assert_eq!(calls[0].capability, Some(rwo()));
    assert!(calls[0].at <= calls[1].at);

    // Same node, other readonly flag: incompatible.
    let mut ro = req.clone();
    ro.readonly = true;
    let err = controller.controller_publish_volume(ro).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    // Another node while single-node published: refused.
    let err = controller
        .controller_publish_volume(publish_req("vol-1", "node-b"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("node-a"), "{err:?}");
    // A multi-node mode may be published on two nodes.
    let mut multi = publish_req("vol-2", "node-a");
    multi.volume_capability = Some(VolumeCapability::block(Mode::MultiNodeMultiWriter));
    controller
        .controller_publish_volume(multi.clone())
        .await
        .unwrap();
    multi.node_id = "node-b".into();
    controller.controller_publish_volume(multi).await.unwrap();
    assert_eq!(driver.published().get("vol-2").unwrap().len(), 2);

    controller
        .controller_unpublish_volume(unpublish_req("vol-1", "node-a"))
        .await
        .unwrap();
    // Idempotent: again, and for a volume never seen.
    controller
        .controller_unpublish_volume(unpublish_req("vol-1", "node-a"))
        .await
        .unwrap();
    controller
        .controller_unpublish_volume(unpublish_req("vol-unknown", "node-a"))
        .await
        .unwrap();
    // An empty node ID unpublishes from every node.
    controller
        .controller_unpublish_volume(unpublish_req("vol-2", ""))
        .await
        .unwrap();
    assert!(driver.published().is_empty(), "{:?}", driver.published());
    // Now the other node may have vol-1.
    controller
        .controller_publish_volume(publish_req("vol-1", "node-b"))
        .await
        .unwrap();
    assert_eq!(
        driver.published().get("vol-1").unwrap(),
        &["node-b".to_owned()].into()
    );
}

#[tokio::test]
async fn validation_errors_name_the_field() {
    let (_dir, driver, channel) = mock(MockConfig {
        publish_readonly: false,
        ..MockConfig::default()
    })
    .await;
    let mut controller = ControllerClient::new(channel);
    let cases: Vec<(&str, ControllerPublishVolumeRequest)> = vec![
        ("volume_id", publish_req("", "n")),
        ("node_id", publish_req("v", "")),
        (
            "volume_capability",
            ControllerPublishVolumeRequest {
                volume_capability: None,
                ..publish_req("v", "n")
            },
        ),
        (
            "volume_capability.access_mode",
            ControllerPublishVolumeRequest {
                volume_capability: Some(VolumeCapability {
                    access_mode: None,
                    ..rwo()
                }),
                ..publish_req("v", "n")
            },
        ),
        (
            "volume_capability.access_type",
            ControllerPublishVolumeRequest {
                volume_capability: Some(VolumeCapability {
                    access_type: None,
                    ..rwo()
                }),
                ..publish_req("v", "n")
            },
        ),
        (
            "readonly",
            ControllerPublishVolumeRequest {
                readonly: true,
                ..publish_req("v", "n")
            },
        ),
    ];
    for (field, req) in cases {
        let err = controller.controller_publish_volume(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().starts_with(&format!("{field}:")),
            "{field}: {err:?}"
        );
    }
    let err = controller
        .controller_unpublish_volume(unpublish_req("", "n"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("volume_id:"), "{err:?}");
    assert!(driver.published().is_empty());
    assert!(
        driver
            .calls_of(Method::ControllerPublishVolume)
            .iter()
            .all(|c| c.code == Code::InvalidArgument)
    );
}

#[tokio::test]
async fn list_volumes_pages_with_published_nodes() {
    let (_dir, driver, channel) = mock(MockConfig::default()).await;
    let mut controller = ControllerClient::new(channel);
    for i in 0..5 {
        controller
            .controller_publish_volume(publish_req(&format!("vol-{i}"), &format!("node-{i}")))
            .await
            .unwrap();
    }
    controller
        .controller_unpublish_volume(unpublish_req("vol-3", "node-3"))
        .await
        .unwrap();
    driver.set_published("vol-9", &["node-x", "node-y"]);

    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = controller
            .list_volumes(ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.entries.len() <= 2);
        for e in page.entries {
            let id = e.volume.unwrap().volume_id;
            seen.push((id, e.status.unwrap().published_node_ids));
        }
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(pages, 3);
    let want: Vec<(String, Vec<String>)> = vec![
        ("vol-0".into(), vec!["node-0".into()]),
        ("vol-1".into(), vec!["node-1".into()]),
        ("vol-2".into(), vec!["node-2".into()]),
        ("vol-3".into(), vec![]),
        ("vol-4".into(), vec!["node-4".into()]),
        ("vol-9".into(), vec!["node-x".into(), "node-y".into()]),
    ];
    assert_eq!(seen, want);

    // max_entries 0: everything at once.
    let all = controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.entries.len(), 6);
    assert!(all.next_token.is_empty());

    let err = controller
        .list_volumes(ListVolumesRequest {
            max_entries: 2,
            starting_token: "no-such-token".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    let err = controller
        .list_volumes(ListVolumesRequest {
            max_entries: -1,
            starting_token: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("max_entries:"), "{err:?}");
}

#[tokio::test]
async fn scripted_steps_are_consumed_in_order() {
    let (_dir, driver, channel) = mock(MockConfig::default()).await;
    let mut controller = ControllerClient::new(channel.clone());
    driver.script(
        Method::ControllerPublishVolume,
        "vol-1",
        vec![
            Step::Fail(Code::Unavailable, "backend busy".into()),
            Step::Fail(Code::Internal, "boom".into()),
            Step::Delay(Duration::from_millis(20)),
        ],
    );
    // A step for any volume, used only when the volume has none of its own.
    driver.script(
        Method::ControllerPublishVolume,
        ANY_VOLUME,
        vec![Step::Fail(Code::ResourceExhausted, "attach limit".into())],
    );
    driver.script(
        Method::Probe,
        "",
        vec![Step::Fail(Code::FailedPrecondition, "not yet".into())],
    );

    let mut codes = Vec::new();
    let mut messages = Vec::new();
    for volume in ["vol-1", "vol-1", "vol-1", "vol-1", "vol-2", "vol-2"] {
        let r = controller
            .controller_publish_volume(publish_req(volume, "node-a"))
            .await;
        codes.push(r.as_ref().map(|_| Code::Ok).unwrap_or_else(|s| s.code()));
        messages.push(r.err().map(|s| s.message().to_owned()).unwrap_or_default());
    }
    assert_eq!(messages[0], "backend busy");
    assert_eq!(messages[3], "attach limit");
    // vol-1's own steps first; the any-volume step only once they are used up.
    assert_eq!(
        codes,
        vec![
            Code::Unavailable,
            Code::Internal,
            Code::Ok,
            Code::ResourceExhausted,
            Code::Ok,
            Code::Ok
        ]
    );

    let mut identity = IdentityClient::new(channel);
    assert_eq!(
        identity.probe(ProbeRequest {}).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert!(identity.probe(ProbeRequest {}).await.is_ok());

    let recorded: Vec<Code> = driver
        .calls_of(Method::ControllerPublishVolume)
        .iter()
        .map(|c| c.code)
        .collect();
    assert_eq!(recorded, codes);
    let calls = driver.calls_of(Method::ControllerPublishVolume);
    assert!(
        calls[3].at.duration_since(calls[2].at) >= Duration::from_millis(20),
        "the delayed call answered before its delay"
    );
}

#[tokio::test]
async fn hang_lasts_until_the_callers_deadline() {
    let (_dir, driver, channel) = mock(MockConfig::default()).await;
    driver.script(Method::ControllerPublishVolume, "vol-h", vec![Step::Hang]);
    let mut controller = ControllerClient::new(channel.clone());
    let mut req = Request::new(publish_req("vol-h", "node-a"));
    req.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let err = controller.controller_publish_volume(req).await.unwrap_err();
    // tonic's server enforces the grpc-timeout header as CANCELLED "Timeout expired"; a Go
    // client would report DEADLINE_EXCEEDED from its own timer.
    assert!(
        matches!(err.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{err:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        driver.published().is_empty(),
        "a hung publish must not record"
    );
    eventually("the hung call to be recorded as cancelled", || {
        driver.calls_of(Method::ControllerPublishVolume)[0].code == Code::Cancelled
    })
    .await;
    // The hang was one step: the next call works.
    controller
        .controller_publish_volume(publish_req("vol-h", "node-a"))
        .await
        .unwrap();

    // A hang without a deadline ends at shutdown with UNAVAILABLE; the socket goes away.
    driver.script(
        Method::ControllerUnpublishVolume,
        ANY_VOLUME,
        vec![Step::Hang],
    );
    let hung = tokio::spawn(async move {
        ControllerClient::new(channel)
            .controller_unpublish_volume(unpublish_req("vol-h", "node-a"))
            .await
    });
    eventually("the unpublish to arrive", || {
        !driver
            .calls_of(Method::ControllerUnpublishVolume)
            .is_empty()
    })
    .await;
    let path = driver.socket_path().to_path_buf();
    driver.shutdown().await;
    let err = hung.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(!path.exists());
}

#[tokio::test]
async fn configured_delay_applies_to_publish_and_unpublish() {
    let (_dir, driver, channel) = mock(MockConfig {
        delay: Duration::from_millis(50),
        ..MockConfig::default()
    })
    .await;
    let mut controller = ControllerClient::new(channel);
    let t = Instant::now();
    controller
        .controller_publish_volume(publish_req("v", "n"))
        .await
        .unwrap();
    controller
        .controller_unpublish_volume(unpublish_req("v", "n"))
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert_eq!(driver.calls().len(), 2);
}

#[tokio::test]
async fn create_and_delete_volume_are_idempotent_and_off_by_default() {
    use csi_spec::v1::{CapacityRange, CreateVolumeRequest, DeleteVolumeRequest};
    let req = |name: &str, bytes: i64| CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![rwo()],
        ..Default::default()
    };
    let (_dir, _driver, channel) = mock(MockConfig::default()).await;
    assert!(
        !controller_caps(&channel)
            .await
            .unwrap()
            .contains(&RpcType::CreateDeleteVolume)
    );
    let e = ControllerClient::new(channel)
        .create_volume(req("v", 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);

    let (_dir, driver, channel) = mock(MockConfig {
        create_delete_volume: true,
        volume_id_prefix: "vol-".into(),
        ..MockConfig::default()
    })
    .await;
    assert!(
        controller_caps(&channel)
            .await
            .unwrap()
            .contains(&RpcType::CreateDeleteVolume)
    );
    let mut c = ControllerClient::new(channel);
    let v = c
        .create_volume(req("a", 4096))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!((v.volume_id.as_str(), v.capacity_bytes), ("vol-a", 4096));
    let again = c
        .create_volume(req("a", 4096))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, "vol-a");
    let e = c.create_volume(req("a", 8192)).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    let e = c.create_volume(req("", 1)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("name"), "{}", e.message());
    assert_eq!(driver.created_volumes().len(), 1);
    let calls = driver.calls_of(Method::CreateVolume);
    assert_eq!(calls[0].volume_id, "a");
    assert_eq!(calls[0].create_request.as_ref().unwrap().name, "a");

    for _ in 0..2 {
        c.delete_volume(DeleteVolumeRequest {
            volume_id: "vol-a".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(driver.created_volumes().is_empty());
    assert_eq!(driver.calls_of(Method::DeleteVolume).len(), 2);
}
