//! ControllerModifyVolume (CSI `mutable_parameters`, Kubernetes VolumeAttributesClass) and
//! CreateVolume's `mutable_parameters`, through the driver's real unix socket, against ec2-sim
//! through the real aws-sdk-ec2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ctl;

use std::time::Duration;

use csi_spec::v1::controller_service_capability::rpc::Type as Rpc;
use csi_spec::v1::*;
use ctl::{Driver, Env, GIB, controller_rpcs, create, create_req, expect_code, params};
use ebs_cloud::Cloud;
use ebs_driver::Mode as DriverMode;
use ec2_sim::{Backing, Timing};
use tonic::Code;

fn modify_req(volume_id: &str, pairs: &[(&str, &str)]) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: volume_id.into(),
        mutable_parameters: params(pairs),
        ..Default::default()
    }
}

fn modify_calls(env: &Env) -> u64 {
    env.calls("ModifyVolume")
}

#[tokio::test]
async fn modify_changes_type_iops_throughput_and_tags_idempotently() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();

    let rpcs = controller_rpcs(&mut c).await;
    assert!(rpcs.contains(&Rpc::ModifyVolume), "{rpcs:?}");

    let v = create(&mut c, create_req("pvc-modify", 10 * GIB)).await;
    let before = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    assert_eq!(before.volume_type, "gp3");

    // gp3 -> io2 at 4000 IOPS; then the same request again: OK, and no second ModifyVolume.
    for _ in 0..2 {
        c.controller_modify_volume(modify_req(
            &v.volume_id,
            &[("type", "io2"), ("iops", "4000")],
        ))
        .await
        .unwrap();
        let after = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap();
        assert_eq!(after.volume_type, "io2");
        assert_eq!(after.iops, Some(4000));
        assert_eq!(modify_calls(&env), 1);
    }

    // Throughput on a gp3 volume.
    let g = create(&mut c, create_req("pvc-modify-gp3", 10 * GIB)).await;
    c.controller_modify_volume(modify_req(
        &g.volume_id,
        &[("throughput", "250"), ("iops", "4000")],
    ))
    .await
    .unwrap();
    let gp3 = env.cloud.get_disk_by_id(&g.volume_id).await.unwrap();
    assert_eq!(gp3.volume_type, "gp3");
    assert_eq!(gp3.throughput, Some(250));
    assert_eq!(gp3.iops, Some(4000));
    assert_eq!(modify_calls(&env), 2);

    // Tags only: CreateTags / DeleteTags, never ModifyVolume.
    c.controller_modify_volume(modify_req(
        &g.volume_id,
        &[
            ("tagSpecification_1", "team=storage"),
            ("tagSpecification_2", "cost-center="),
        ],
    ))
    .await
    .unwrap();
    let tagged = env.cloud.get_disk_by_id(&g.volume_id).await.unwrap();
    assert_eq!(tagged.tags.get("team").map(String::as_str), Some("storage"));
    assert_eq!(tagged.tags.get("cost-center").map(String::as_str), Some(""));
    c.controller_modify_volume(modify_req(&g.volume_id, &[("tagDeletion_1", "team")]))
        .await
        .unwrap();
    let untagged = env.cloud.get_disk_by_id(&g.volume_id).await.unwrap();
    assert!(!untagged.tags.contains_key("team"), "{:?}", untagged.tags);
    assert!(untagged.tags.contains_key("CSIVolumeName"));
    assert_eq!(modify_calls(&env), 2);

    // Bad requests name what is wrong.
    let ghost = "vol-0123456789abcdef0";
    for (volume_id, pairs, code, needle) in [
        (
            g.volume_id.as_str(),
            &[("encrypted", "true")],
            Code::InvalidArgument,
            "encrypted",
        ),
        (
            g.volume_id.as_str(),
            &[("iops", "lots")],
            Code::InvalidArgument,
            "iops",
        ),
        (
            g.volume_id.as_str(),
            &[("type", "gp9")],
            Code::InvalidArgument,
            "type",
        ),
        ("", &[("type", "io2")], Code::InvalidArgument, "volume_id"),
        (ghost, &[("type", "io2")], Code::NotFound, ghost),
        (
            ghost,
            &[("tagSpecification_1", "a=b")],
            Code::NotFound,
            ghost,
        ),
    ] {
        expect_code(
            c.controller_modify_volume(modify_req(volume_id, pairs))
                .await,
            code,
            needle,
        );
    }
    // A missing volume is NOT_FOUND before anything else is checked: csi-sanity's "should fail
    // when the volume does not exist" sends no mutable_parameters at all (it was
    // INVALID_ARGUMENT). An existing volume without them is INVALID_ARGUMENT naming the field.
    for pairs in [&[][..], &[("type", "gp9")][..]] {
        expect_code(
            c.controller_modify_volume(modify_req(ghost, pairs)).await,
            Code::NotFound,
            ghost,
        );
    }
    expect_code(
        c.controller_modify_volume(modify_req(&g.volume_id, &[]))
            .await,
        Code::InvalidArgument,
        "mutable_parameters",
    );
    assert_eq!(modify_calls(&env), 2);
}

#[tokio::test]
async fn create_volume_applies_mutable_parameters_over_parameters() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let mut r = create_req("pvc-vac", 10 * GIB);
    r.parameters = params(&[("type", "gp3"), ("iopsPerGB", "10")]);
    r.mutable_parameters = params(&[
        ("type", "io2"),
        ("iops", "5000"),
        ("tagSpecification_1", "class=fast"),
    ]);
    let v = create(&mut c, r.clone()).await;
    let disk = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    assert_eq!(disk.volume_type, "io2");
    assert_eq!(disk.iops, Some(5000));
    assert_eq!(disk.tags.get("class").map(String::as_str), Some("fast"));
    // ValidateVolumeCapabilities confirms the mutable parameters it was given.
    let confirmed = c
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: v.volume_id.clone(),
            volume_capabilities: r.volume_capabilities.clone(),
            mutable_parameters: r.mutable_parameters.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .confirmed
        .unwrap();
    assert_eq!(confirmed.mutable_parameters, r.mutable_parameters);
    // Idempotent with the same mutable parameters.
    let again = create(&mut c, r).await;
    assert_eq!(again.volume_id, v.volume_id);

    let mut bad = create_req("pvc-vac-bad", GIB);
    bad.mutable_parameters = params(&[("kmsKeyId", "x")]);
    expect_code(
        c.create_volume(bad).await,
        Code::InvalidArgument,
        "mutable_parameters",
    );
}

#[tokio::test]
async fn a_modification_under_way_is_waited_for_not_repeated() {
    // Realistic timing: `modifying` lasts 2-5 s, longer than the first call's deadline.
    let env = Env::start(Timing::Realistic, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let v = create(&mut c, create_req("pvc-slow-modify", 10 * GIB)).await;
    let slow = &[("type", "io1"), ("iops", "500")];
    let mut first = tonic::Request::new(modify_req(&v.volume_id, slow));
    first.set_timeout(Duration::from_millis(800));
    let err = c.controller_modify_volume(first).await.unwrap_err();
    // The deadline ends the call from either side: the server answers DEADLINE_EXCEEDED, or,
    // when its answer is a moment late (a loaded machine), the client's own timer cancels the
    // call first (tonic: CANCELLED "Timeout expired").
    let client_timeout = err.code() == Code::Cancelled && err.message() == "Timeout expired";
    assert!(
        err.code() == Code::DeadlineExceeded || client_timeout,
        "{err:?}"
    );
    assert_eq!(modify_calls(&env), 1);
    // The retry finds the same modification running and waits for it: one ModifyVolume.
    c.controller_modify_volume(modify_req(&v.volume_id, slow))
        .await
        .unwrap();
    assert_eq!(modify_calls(&env), 1);
    let disk = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    assert_eq!(disk.volume_type, "io1");
    assert_eq!(disk.iops, Some(500));
}

#[tokio::test]
async fn warn_on_invalid_tag_skips_bad_tags_instead_of_failing() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let mut config = env.driver_config(DriverMode::Controller);
    config.controller.warn_on_invalid_tag = true;
    let d = Driver::start(config).await;
    let mut c = d.controller();
    let mut r = create_req("pvc-warn-tags", GIB);
    r.parameters = params(&[
        ("tagSpecification_1", "good=yes"),
        ("tagSpecification_2", "no-equals-sign"),
    ]);
    let v = create(&mut c, r).await;
    let tags = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap().tags;
    assert_eq!(tags.get("good").map(String::as_str), Some("yes"));
    assert!(!tags.keys().any(|k| k.contains("no-equals")), "{tags:?}");
    c.controller_modify_volume(modify_req(
        &v.volume_id,
        &[
            ("tagSpecification_1", "aws:reserved=1"),
            ("tagSpecification_2", "more=tags"),
        ],
    ))
    .await
    .unwrap();
    let tags = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap().tags;
    assert_eq!(tags.get("more").map(String::as_str), Some("tags"));
    assert!(!tags.contains_key("aws:reserved"));
    // Other bad values still fail.
    expect_code(
        c.controller_modify_volume(modify_req(&v.volume_id, &[("iops", "x")]))
            .await,
        Code::InvalidArgument,
        "iops",
    );
}
