//! The controller path once more against moto_server, a second, independent EC2 endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ctl;

use ctl::{Driver, GIB, attach, create, create_req, delete_req, probe_ready, unpublish_req};
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
    assert_eq!(probe_ready(&mut d.identity()).await, Some(true));
    let mut c = d.controller();
    let v = create(&mut c, create_req("pvc-moto", GIB)).await;
    let again = create(&mut c, create_req("pvc-moto", GIB)).await;
    assert_eq!(v.volume_id, again.volume_id);
    let dev = attach(&mut c, &v.volume_id, &node.instance_id).await;
    assert!(dev.starts_with("/dev/xvd"), "{dev}");
    let disk = cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    assert_eq!(disk.attachments.len(), 1);
    c.controller_unpublish_volume(unpublish_req(&v.volume_id, &node.instance_id))
        .await
        .unwrap();
    // Twice: the second finds it gone, which is success.
    for _ in 0..2 {
        c.delete_volume(delete_req(&v.volume_id)).await.unwrap();
    }
    assert!(cloud.get_disk_by_name("pvc-moto").await.unwrap().is_none());
}
