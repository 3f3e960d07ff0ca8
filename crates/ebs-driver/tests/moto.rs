//! The controller path once more against moto_server, a second, independent EC2 endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ctl;

use csi_spec::v1::*;
use ctl::{Driver, GIB, create_req, publish_req, unpublish_req};
use ebs_cloud::{Cloud, CloudMetrics};
use ebs_cloud_aws::AwsCloud;
use ebs_driver::{DriverConfig, Mode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_path_against_moto() {
    let moto = match ec2_conformance::MotoServer::start().await {
        Ok(m) => m,
        Err(ec2_conformance::Error::MotoNotFound) => {
            test_support::skip_or_fail("moto_server is not installed (scripts/setup installs it)");
            return;
        }
        Err(e) => panic!("moto_server: {e}"),
    };
    let aws = ctl::aws_config(moto.endpoint());
    let cloud = AwsCloud::new(aws.clone(), CloudMetrics::new())
        .await
        .unwrap();
    let node = cloud
        .run_instance("moto-node", Some("us-east-1a"))
        .await
        .unwrap();
    let config = DriverConfig {
        mode: Mode::Controller,
        aws,
        ..DriverConfig::default()
    };
    let d = Driver::start(config).await;
    assert_eq!(
        d.identity()
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
    let mut c = d.controller();
    let v = c
        .create_volume(create_req("pvc-moto", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let again = c
        .create_volume(create_req("pvc-moto", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.volume_id, again.volume_id);
    let dev = c
        .controller_publish_volume(publish_req(&v.volume_id, &node.instance_id))
        .await
        .unwrap()
        .into_inner()
        .publish_context["devicePath"]
        .clone();
    assert!(dev.starts_with("/dev/xvd"), "{dev}");
    let disk = cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    assert_eq!(disk.attachments.len(), 1);
    c.controller_unpublish_volume(unpublish_req(&v.volume_id, &node.instance_id))
        .await
        .unwrap();
    c.delete_volume(DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.delete_volume(DeleteVolumeRequest {
        volume_id: v.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(cloud.get_disk_by_name("pvc-moto").await.unwrap().is_none());
}
