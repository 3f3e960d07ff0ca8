//! How the node service finds a volume's device on real loop devices: stale links to another
//! volume's device, the verified by-id link, the Xen rename, late devices, and per-volume
//! serialisation.
// Shared helpers are plain fns, not #[test]s; a failure in them is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::{MIB, VOL_A, VOL_B, blkid_type, mount_access, rdev, stage_req, started};
use ebs_driver::Error;

#[tokio::test]
async fn a_stale_link_to_another_volume_is_refused() {
    let Some(mut fx) = fixture!() else { return };
    let _a = fx.attach(VOL_A, 64 * MIB);
    let b = fx.attach(VOL_B, 64 * MIB);
    // /dev/xvdba still points at B's device (B was detached from that name, A attached to it,
    // udev has not caught up), and A's by-id link has not appeared.
    fx.link("xvdba", &b);
    let svc = fx.service();
    let staging = fx.path("staging");
    let err = svc
        .stage(stage_req(
            VOL_A,
            "/dev/xvdba",
            &staging,
            mount_access("ext4"),
        ))
        .await
        .unwrap_err();
    match &err {
        Error::WrongVolume {
            expected, actual, ..
        } => {
            assert_eq!(expected, VOL_A);
            assert_eq!(actual, VOL_B);
        }
        other => panic!("expected WrongVolume, got {other}"),
    }
    assert!(err.to_string().contains(VOL_B), "{err}");
    assert_eq!(blkid_type(&b), None, "B was not touched");

    // A by-id link that points at the wrong device is just as stale.
    fx.link_by_id(VOL_A, &b);
    let err = svc
        .stage(stage_req(
            VOL_A,
            "/dev/xvdbb",
            &staging,
            mount_access("ext4"),
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongVolume { .. }), "{err}");
    assert!(fx.mounted(&staging).is_none());
    assert_eq!(blkid_type(&b), None, "B was not touched");
}

#[tokio::test]
async fn the_verified_by_id_link_wins_over_a_stale_device_path() {
    let Some(mut fx) = fixture!() else { return };
    let a = fx.attach(VOL_A, 64 * MIB);
    let b = fx.attach(VOL_B, 64 * MIB);
    fx.link("xvdba", &b);
    fx.link_by_id(VOL_A, &a);
    let staging = fx.path("staging");
    fx.service()
        .stage(stage_req(
            VOL_A,
            "/dev/xvdba",
            &staging,
            mount_access("ext4"),
        ))
        .await
        .unwrap();
    assert_eq!(blkid_type(&a).as_deref(), Some("ext4"));
    assert_eq!(
        blkid_type(&b),
        None,
        "the stale link's device was not formatted"
    );
    assert_eq!(std::fs::metadata(&staging).unwrap().dev(), rdev(&a));
}

#[tokio::test]
async fn sd_names_are_found_under_their_xen_rename() {
    let Some(mut fx) = fixture!() else { return };
    let a = fx.attach(VOL_A, 64 * MIB);
    fx.link("xvdf", &a);
    let staging = fx.path("staging");
    fx.service()
        .stage(stage_req(VOL_A, "/dev/sdf", &staging, mount_access("ext4")))
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(&staging).unwrap().dev(), rdev(&a));
}

#[tokio::test]
async fn stage_waits_for_a_device_that_appears_late() {
    let Some(mut fx) = fixture!() else { return };
    let a = fx.attach(VOL_A, 64 * MIB);
    let mut cfg = fx.config();
    cfg.device_wait = Duration::from_secs(30);
    let svc = ebs_driver::NodeService::new(cfg).unwrap();
    let staging = fx.path("staging");
    let req = stage_req(VOL_A, "/dev/xvdba", &staging, mount_access("ext4"));
    let call = started(svc.stage(req.clone()));
    // No link to A's device exists, so the stage can only be waiting for one.
    let err = svc.stage(req).await.unwrap_err();
    assert!(matches!(err, Error::OperationInFlight(_)), "{err}");
    fx.link_by_id(VOL_A, &a);
    call.await.unwrap();
    assert_eq!(std::fs::metadata(&staging).unwrap().dev(), rdev(&a));
}

/// Per-volume, not global, serialisation: B's stage must finish while A's is in progress, since
/// A's device only appears once B is staged. Were stages serialised, B would wait behind A,
/// A would time out with no device, and the test would fail.
#[tokio::test]
async fn a_second_call_for_a_busy_volume_is_in_flight_and_others_proceed() {
    let Some(mut fx) = fixture!() else { return };
    let a = fx.attach(VOL_A, 64 * MIB);
    let b = fx.attach_linked(VOL_B, 64 * MIB, "xvdbb");
    let mut cfg = fx.config();
    cfg.device_wait = Duration::from_secs(30);
    let svc = ebs_driver::NodeService::new(cfg).unwrap();
    let staging_a = fx.path("staging-a");
    let req_a = stage_req(VOL_A, "/dev/xvdba", &staging_a, mount_access("ext4"));
    let first = started(svc.stage(req_a.clone()));
    let err = svc.stage(req_a).await.unwrap_err();
    assert!(
        matches!(err, Error::OperationInFlight(ref v) if v == VOL_A),
        "{err}"
    );
    svc.stage(stage_req(
        VOL_B,
        "/dev/xvdbb",
        &fx.path("staging-b"),
        mount_access("ext4"),
    ))
    .await
    .unwrap();
    assert_eq!(blkid_type(&b).as_deref(), Some("ext4"));
    // Only now does A's device appear: A can only succeed if it was still waiting.
    fx.link("xvdba", &a);
    first.await.unwrap();
    assert_eq!(std::fs::metadata(&staging_a).unwrap().dev(), rdev(&a));
}

#[tokio::test]
async fn staging_path_holding_another_device_is_an_error() {
    let Some(mut fx) = fixture!() else { return };
    fx.attach_linked(VOL_A, 64 * MIB, "xvdba");
    fx.attach_linked(VOL_B, 64 * MIB, "xvdbb");
    let svc = fx.service();
    let staging = fx.path("staging");
    svc.stage(stage_req(
        VOL_B,
        "/dev/xvdbb",
        &staging,
        mount_access("ext4"),
    ))
    .await
    .unwrap();
    let err = svc
        .stage(stage_req(
            VOL_A,
            "/dev/xvdba",
            &staging,
            mount_access("ext4"),
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StagedWithOtherDevice { .. }), "{err}");
}
