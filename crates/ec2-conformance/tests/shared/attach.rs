//! AttachVolume / DetachVolume: states, exclusivity, device names, zones, detach errors.

use aws_sdk_ec2::types::{VolumeAttachmentState, VolumeState, VolumeType};
use ec2_conformance::{Flavor, wait};

use crate::common::*;

crate::both_endpoints!(
    attach_detach_lifecycle,
    exclusive_attachment,
    io2_multi_attach,
    device_already_used_on_instance,
    zone_mismatch,
    device_name_validation,
    delete_while_attached,
    detach_errors,
);

async fn attach(t: &Target, volume: &str, instance: &str, device: &str) -> Result<(), String> {
    t.client
        .attach_volume()
        .volume_id(volume)
        .instance_id(instance)
        .device(device)
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            ec2_conformance::failure(&e)
                .code
                .unwrap_or_else(|| "no code".into())
        })
}

async fn attached(t: &Target, volume: &str, instance: &str) {
    wait::attachment_state(
        &t.client,
        volume,
        instance,
        VolumeAttachmentState::Attached,
        WAIT,
    )
    .await
    .unwrap();
}

async fn attach_detach_lifecycle(t: &Target) {
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 8).await;
    let inst = instance(c, ZONE_A).await;
    let out = c
        .attach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .device("/dev/xvdba")
        .send()
        .await
        .unwrap();
    assert_eq!(out.volume_id(), Some(vol.as_str()));
    assert_eq!(out.instance_id(), Some(inst.as_str()));
    assert_eq!(out.device(), Some("/dev/xvdba"));
    assert_eq!(out.state(), Some(&VolumeAttachmentState::Attaching));
    assert_recent("AttachTime", out.attach_time());

    let (v, seen) = wait::attachment_state(c, &vol, &inst, VolumeAttachmentState::Attached, WAIT)
        .await
        .unwrap();
    if t.flavor == Flavor::Moto {
        // moto attaches at once (the sim's states on the way are asserted in the timing
        // tests, with slower timing).
        assert_eq!(seen[0].attachment, Some(VolumeAttachmentState::Attached));
    }
    assert_eq!(v.state(), Some(&VolumeState::InUse));
    let a = &v.attachments()[0];
    assert_eq!(v.attachments().len(), 1);
    assert_eq!(a.device(), Some("/dev/xvdba"));
    assert_eq!(a.instance_id(), Some(inst.as_str()));
    assert_eq!(a.volume_id(), Some(vol.as_str()));
    match t.flavor {
        Flavor::Aws => assert_eq!(a.delete_on_termination(), Some(false)),
        // moto leaves DeleteOnTermination out of DescribeVolumes attachments.
        Flavor::Moto => assert_eq!(a.delete_on_termination(), None),
    }
    assert_recent("attachment AttachTime", a.attach_time());

    // DescribeInstances shows the attachment among the block device mappings.
    let desc = c
        .describe_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    let i = &desc.reservations()[0].instances()[0];
    let bdm = i
        .block_device_mappings()
        .iter()
        .find(|m| m.device_name() == Some("/dev/xvdba"))
        .unwrap_or_else(|| panic!("no /dev/xvdba in {:?}", i.block_device_mappings()));
    let ebs = bdm.ebs().unwrap();
    assert_eq!(ebs.volume_id(), Some(vol.as_str()));
    assert_eq!(
        ebs.status(),
        Some(&aws_sdk_ec2::types::AttachmentStatus::Attached)
    );
    assert_eq!(ebs.delete_on_termination(), Some(false));

    let out = c
        .detach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .send()
        .await
        .unwrap();
    assert_eq!(out.state(), Some(&VolumeAttachmentState::Detaching));
    assert_eq!(out.device(), Some("/dev/xvdba"));
    let (v, seen) = wait::detached(c, &vol, &inst, WAIT).await.unwrap();
    if t.flavor == Flavor::Moto {
        assert_eq!(seen[0].attachment, None, "moto detaches at once: {seen:?}");
    }
    assert_eq!(v.unwrap().state(), Some(&VolumeState::Available));
    let desc = c
        .describe_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    let i = &desc.reservations()[0].instances()[0];
    assert!(
        i.block_device_mappings()
            .iter()
            .all(|m| m.ebs().and_then(|e| e.volume_id()) != Some(vol.as_str())),
        "{:?}",
        i.block_device_mappings()
    );

    // Attach again, under another name.
    attach(t, &vol, &inst, "/dev/xvdbb").await.unwrap();
    let (v, _) = wait::attachment_state(c, &vol, &inst, VolumeAttachmentState::Attached, WAIT)
        .await
        .unwrap();
    assert_eq!(v.attachments()[0].device(), Some("/dev/xvdbb"));
}

async fn exclusive_attachment(t: &Target) {
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 8).await;
    let first = instance(c, ZONE_A).await;
    let second = instance(c, ZONE_A).await;
    attach(t, &vol, &first, "/dev/xvdba").await.unwrap();
    attached(t, &vol, &first).await;
    let to_other = attach(t, &vol, &second, "/dev/xvdba").await;
    let to_same_again = attach(t, &vol, &first, "/dev/xvdbc").await;
    let v = wait::describe_volume(c, &vol).await.unwrap().unwrap();
    match t.flavor {
        Flavor::Aws => {
            assert_eq!(to_other, Err("VolumeInUse".to_string()));
            assert_eq!(to_same_again, Err("VolumeInUse".to_string()));
            assert_eq!(v.attachments().len(), 1);
        }
        Flavor::Moto => {
            // moto accepts both; each attach replaces the volume's one attachment record,
            // so the last one wins and the instances disagree about where the volume is.
            assert_eq!(to_other, Ok(()));
            assert_eq!(to_same_again, Ok(()));
            assert_eq!(v.attachments().len(), 1, "{:?}", v.attachments());
            assert_eq!(v.attachments()[0].instance_id(), Some(first.as_str()));
            assert_eq!(v.attachments()[0].device(), Some("/dev/xvdbc"));
        }
    }
}

async fn io2_multi_attach(t: &Target) {
    let c = &t.client;
    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(10)
        .volume_type(VolumeType::Io2)
        .iops(1000)
        .multi_attach_enabled(true)
        .send()
        .await
        .unwrap();
    let vol = out.volume_id().unwrap().to_string();
    assert_eq!(out.multi_attach_enabled(), Some(true));
    wait::volume_state(c, &vol, VolumeState::Available, WAIT)
        .await
        .unwrap();
    let first = instance(c, ZONE_A).await;
    let second = instance(c, ZONE_A).await;
    attach(t, &vol, &first, "/dev/xvdba").await.unwrap();
    attach(t, &vol, &second, "/dev/xvdba").await.unwrap();
    attached(t, &vol, &second).await;
    let v = wait::describe_volume(c, &vol).await.unwrap().unwrap();
    if t.flavor == Flavor::Moto {
        // moto keeps one attachment per volume: the second attach replaced the first.
        assert_eq!(v.attachments().len(), 1, "{:?}", v.attachments());
        assert_eq!(v.attachments()[0].instance_id(), Some(second.as_str()));
        return;
    }
    attached(t, &vol, &first).await;
    let v = wait::describe_volume(c, &vol).await.unwrap().unwrap();
    let mut instances: Vec<&str> = v
        .attachments()
        .iter()
        .filter_map(|a| a.instance_id())
        .collect();
    instances.sort_unstable();
    let mut want = vec![first.as_str(), second.as_str()];
    want.sort_unstable();
    assert_eq!(instances, want);
}

async fn device_already_used_on_instance(t: &Target) {
    let c = &t.client;
    let one = available_volume(c, ZONE_A, 8).await;
    let two = available_volume(c, ZONE_A, 8).await;
    let inst = instance(c, ZONE_A).await;
    attach(t, &one, &inst, "/dev/xvdba").await.unwrap();
    let clash = attach(t, &two, &inst, "/dev/xvdba").await;
    match t.flavor {
        // "Attachment point /dev/xvdba is already in use".
        Flavor::Aws => assert_eq!(clash, Err("InvalidParameterValue".to_string())),
        // moto lets two volumes share one device name.
        Flavor::Moto => assert_eq!(clash, Ok(())),
    }
    // Another name works on both.
    if t.flavor.is_aws() {
        attach(t, &two, &inst, "/dev/xvdbb").await.unwrap();
        attached(t, &two, &inst).await;
    }
}

async fn zone_mismatch(t: &Target) {
    let c = &t.client;
    let vol = available_volume(c, ZONE_B, 8).await;
    let inst = instance(c, ZONE_A).await;
    let result = attach(t, &vol, &inst, "/dev/xvdba").await;
    match t.flavor {
        Flavor::Aws => assert_eq!(result, Err("InvalidVolume.ZoneMismatch".to_string())),
        // moto attaches across zones.
        Flavor::Moto => assert_eq!(result, Ok(())),
    }
}

async fn device_name_validation(t: &Target) {
    let c = &t.client;
    let inst = instance(c, ZONE_A).await;
    let vol = available_volume(c, ZONE_A, 8).await;
    for bad in [
        "bogus",
        "/dev/",
        "/dev/xvd",
        "xvdf",
        "/dev/sdf1x",
        "/dev/../xvdf",
    ] {
        let result = attach(t, &vol, &inst, bad).await;
        match t.flavor {
            Flavor::Aws => assert_eq!(result, Err("InvalidParameterValue".to_string()), "{bad}"),
            Flavor::Moto => {
                // moto takes any string as a device name; detach it again for the next one.
                assert_eq!(result, Ok(()), "{bad}");
                c.detach_volume()
                    .volume_id(&vol)
                    .instance_id(&inst)
                    .send()
                    .await
                    .unwrap();
                wait::detached(c, &vol, &inst, WAIT).await.unwrap();
            }
        }
    }
    for good in ["/dev/sdf", "/dev/xvdf", "/dev/xvdba"] {
        attach(t, &vol, &inst, good)
            .await
            .unwrap_or_else(|e| panic!("{good}: {e}"));
        attached(t, &vol, &inst).await;
        c.detach_volume()
            .volume_id(&vol)
            .instance_id(&inst)
            .send()
            .await
            .unwrap();
        wait::detached(c, &vol, &inst, WAIT).await.unwrap();
    }
}

async fn delete_while_attached(t: &Target) {
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 8).await;
    let inst = instance(c, ZONE_A).await;
    attach(t, &vol, &inst, "/dev/xvdba").await.unwrap();
    let result = c.delete_volume().volume_id(&vol).send().await;
    assert_eq!(code_of(result), "VolumeInUse");
    attached(t, &vol, &inst).await;
    let result = c.delete_volume().volume_id(&vol).send().await;
    assert_eq!(code_of(result), "VolumeInUse");
}

async fn detach_errors(t: &Target) {
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 8).await;
    let inst = instance(c, ZONE_A).await;
    let other = instance(c, ZONE_A).await;

    // Not attached at all.
    let result = c
        .detach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .send()
        .await;
    match t.flavor {
        // "Volume 'vol-...' is in the 'available' state."
        Flavor::Aws => assert_eq!(code_of(result), "IncorrectState"),
        Flavor::Moto => assert_eq!(code_of(result), "InvalidAttachment.NotFound"),
    }

    attach(t, &vol, &inst, "/dev/xvdba").await.unwrap();
    attached(t, &vol, &inst).await;
    // Attached, but to another instance than the one named.
    let result = c
        .detach_volume()
        .volume_id(&vol)
        .instance_id(&other)
        .send()
        .await;
    assert_eq!(code_of(result), "InvalidAttachment.NotFound");

    // Force detaches.
    let out = c
        .detach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .force(true)
        .send()
        .await
        .unwrap();
    assert_eq!(out.state(), Some(&VolumeAttachmentState::Detaching));
    let (v, _) = wait::detached(c, &vol, &inst, WAIT).await.unwrap();
    assert_eq!(v.unwrap().state(), Some(&VolumeState::Available));

    let absent = c
        .detach_volume()
        .volume_id("vol-0123456789abcdef0")
        .instance_id(&inst)
        .send()
        .await;
    assert_eq!(code_of(absent), "InvalidVolume.NotFound");
}
