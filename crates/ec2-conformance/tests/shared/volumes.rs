//! Volume lifecycle, client tokens, DryRun, KMS, IDs, tags, ModifyVolume.

use aws_sdk_ec2::types::{VolumeModificationState, VolumeState, VolumeType};
use ec2_conformance::Flavor;
use ec2_conformance::wait;

use crate::common::*;

crate::both_endpoints!(
    availability_zones,
    volume_lifecycle,
    client_token_idempotency,
    dry_run,
    kms_keys,
    volume_id_errors,
    create_and_delete_tags,
    modify_volume,
);

async fn availability_zones(t: &Target) {
    let out = t.client.describe_availability_zones().send().await.unwrap();
    let zones = out.availability_zones();
    let names: Vec<&str> = zones.iter().filter_map(|z| z.zone_name()).collect();
    assert!(
        names.contains(&ZONE_A) && names.contains(&ZONE_B),
        "{names:?}"
    );
    for z in zones {
        assert_eq!(z.region_name(), Some("us-east-1"), "{z:?}");
        assert_eq!(
            z.state(),
            Some(&aws_sdk_ec2::types::AvailabilityZoneState::Available),
            "{z:?}"
        );
    }
    let one = t
        .client
        .describe_availability_zones()
        .zone_names(ZONE_B)
        .send()
        .await
        .unwrap();
    let one: Vec<&str> = one
        .availability_zones()
        .iter()
        .filter_map(|z| z.zone_name())
        .collect();
    assert_eq!(one, [ZONE_B]);

    let unknown = t
        .client
        .describe_availability_zones()
        .zone_names("us-east-1z")
        .send()
        .await;
    match t.flavor {
        // AWS: "The zone 'us-east-1z' does not exist".
        Flavor::Aws => assert_eq!(code_of(unknown), "InvalidParameterValue"),
        // moto: an empty list.
        Flavor::Moto => assert!(unknown.unwrap().availability_zones().is_empty()),
    }
}

async fn volume_lifecycle(t: &Target) {
    let c = &t.client;
    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(10)
        .volume_type(VolumeType::Gp3)
        .tag_specifications(volume_tags(&[("Name", "conformance"), ("team", "storage")]))
        .send()
        .await
        .unwrap();
    let id = out.volume_id().unwrap().to_string();
    assert!(id.starts_with("vol-") && id.len() == 21, "{id}");
    assert_eq!(out.size(), Some(10));
    assert_eq!(out.availability_zone(), Some(ZONE_A));
    assert_eq!(out.volume_type(), Some(&VolumeType::Gp3));
    assert_eq!(out.iops(), Some(3000));
    assert_eq!(out.encrypted(), Some(false));
    assert_recent("CreateTime", out.create_time());
    assert_eq!(
        tag_pairs(out.tags()),
        pairs(&[("Name", "conformance"), ("team", "storage")])
    );
    match t.flavor {
        Flavor::Aws => {
            // AWS answers `creating` and reports gp3's baseline throughput.
            assert_eq!(out.state(), Some(&VolumeState::Creating));
            assert_eq!(out.throughput(), Some(125));
        }
        Flavor::Moto => {
            // moto: already available, no throughput unless one was asked for.
            assert_eq!(out.state(), Some(&VolumeState::Available));
            assert_eq!(out.throughput(), None);
        }
    }

    // (The states on the way are asserted in the timing tests, with slower timing.)
    let (v, _) = wait::volume_state(c, &id, VolumeState::Available, WAIT)
        .await
        .unwrap();
    assert_eq!(v.volume_id(), Some(id.as_str()));
    assert_eq!(v.size(), Some(10));
    assert_eq!(v.availability_zone(), Some(ZONE_A));
    assert_eq!(v.volume_type(), Some(&VolumeType::Gp3));
    assert_eq!(v.iops(), Some(3000));
    assert!(v.attachments().is_empty());
    assert_eq!(v.create_time(), out.create_time());
    assert_eq!(
        tag_pairs(v.tags()),
        pairs(&[("Name", "conformance"), ("team", "storage")])
    );

    c.delete_volume().volume_id(&id).send().await.unwrap();
    wait::gone(c, &id, WAIT).await.unwrap();
    let again = c.delete_volume().volume_id(&id).send().await;
    assert_eq!(code_of(again), "InvalidVolume.NotFound");
}

async fn client_token_idempotency(t: &Target) {
    let c = &t.client;
    let create = |size: i32| {
        c.create_volume()
            .availability_zone(ZONE_A)
            .size(size)
            .volume_type(VolumeType::Gp3)
            .client_token("conformance-token-1")
            .send()
    };
    let first = create(10).await.unwrap();
    let second = create(10).await.unwrap();
    let other = create(20).await;
    let count = c.describe_volumes().send().await.unwrap().volumes().len();
    match t.flavor {
        Flavor::Aws => {
            // The same token and parameters: the same volume, no second one.
            assert_eq!(second.volume_id(), first.volume_id());
            assert_eq!(second.size(), Some(10));
            assert_eq!(code_of(other), "IdempotentParameterMismatch");
            assert_eq!(count, 1);
        }
        Flavor::Moto => {
            // moto ignores ClientToken: every call makes a new volume.
            assert_ne!(second.volume_id(), first.volume_id());
            assert_eq!(other.unwrap().size(), Some(20));
            assert_eq!(count, 3);
        }
    }
}

async fn dry_run(t: &Target) {
    let c = &t.client;
    let dry = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(10)
        .dry_run(true)
        .send()
        .await;
    let failure = ec2_conformance::expect_code(dry).unwrap();
    assert_eq!(failure.code.as_deref(), Some("DryRunOperation"));
    assert_eq!(failure.status, Some(412));
    assert!(
        c.describe_volumes()
            .send()
            .await
            .unwrap()
            .volumes()
            .is_empty()
    );

    let id = available_volume(c, ZONE_A, 5).await;
    let dry = c.delete_volume().volume_id(&id).dry_run(true).send().await;
    assert_eq!(code_of(dry), "DryRunOperation");
    let inst = instance(c, ZONE_A).await;
    let dry = c
        .attach_volume()
        .volume_id(&id)
        .instance_id(&inst)
        .device("/dev/xvdba")
        .dry_run(true)
        .send()
        .await;
    assert_eq!(code_of(dry), "DryRunOperation");
    // Nothing happened: still there, still unattached.
    let v = wait::describe_volume(c, &id).await.unwrap().unwrap();
    assert_eq!(v.state(), Some(&VolumeState::Available));
    assert!(v.attachments().is_empty());
}

async fn kms_keys(t: &Target) {
    let c = &t.client;
    let default_key = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(5)
        .encrypted(true)
        .send()
        .await
        .unwrap();
    assert_eq!(default_key.encrypted(), Some(true));
    let key = default_key.kms_key_id().unwrap_or_default();
    match t.flavor {
        // AWS reports the key as an ARN.
        Flavor::Aws => assert!(key.starts_with("arn:aws:kms:us-east-1:"), "{key}"),
        Flavor::Moto => assert!(!key.is_empty()),
    }

    let unknown_key = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000";
    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(5)
        .encrypted(true)
        .kms_key_id(unknown_key)
        .send()
        .await
        .unwrap();
    let id = out.volume_id().unwrap().to_string();
    assert_eq!(out.encrypted(), Some(true));
    assert_eq!(out.kms_key_id(), Some(unknown_key));
    match t.flavor {
        Flavor::Aws => {
            // AWS accepts the call, shows the volume as creating, then it vanishes.
            assert_eq!(out.state(), Some(&VolumeState::Creating));
            let seen = wait::gone(c, &id, WAIT).await.unwrap();
            assert!(
                seen.iter()
                    .all(|o| o.volume != Some(VolumeState::Available)),
                "the volume must never become available: {seen:?}"
            );
        }
        Flavor::Moto => {
            let v = wait::describe_volume(c, &id).await.unwrap().unwrap();
            assert_eq!(v.state(), Some(&VolumeState::Available));
        }
    }

    // A key without Encrypted.
    let no_flag = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(5)
        .kms_key_id("alias/aws/ebs")
        .send()
        .await;
    assert_eq!(code_of(no_flag), "InvalidParameterDependency");
}

async fn volume_id_errors(t: &Target) {
    let c = &t.client;
    let malformed = c.describe_volumes().volume_ids("vol-xyz").send().await;
    let absent = c
        .describe_volumes()
        .volume_ids("vol-0123456789abcdef0")
        .send()
        .await;
    assert_eq!(code_of(absent), "InvalidVolume.NotFound");
    let delete_absent = c
        .delete_volume()
        .volume_id("vol-0123456789abcdef0")
        .send()
        .await;
    assert_eq!(code_of(delete_absent), "InvalidVolume.NotFound");
    let delete_malformed = c.delete_volume().volume_id("volume-1").send().await;
    let instance_malformed = c.describe_instances().instance_ids("i-xyz").send().await;
    let instance_absent = c
        .describe_instances()
        .instance_ids("i-0123456789abcdef0")
        .send()
        .await;
    assert_eq!(code_of(instance_absent), "InvalidInstanceID.NotFound");
    match t.flavor {
        Flavor::Aws => {
            assert_eq!(code_of(malformed), "InvalidVolumeID.Malformed");
            assert_eq!(code_of(delete_malformed), "InvalidVolumeID.Malformed");
            assert_eq!(code_of(instance_malformed), "InvalidInstanceID.Malformed");
        }
        Flavor::Moto => {
            assert_eq!(code_of(malformed), "InvalidVolume.NotFound");
            assert_eq!(code_of(delete_malformed), "InvalidVolume.NotFound");
            assert_eq!(code_of(instance_malformed), "InvalidInstanceID.NotFound");
        }
    }
}

async fn create_and_delete_tags(t: &Target) {
    let c = &t.client;
    let id = available_volume(c, ZONE_A, 5).await;
    c.create_tags()
        .resources(&id)
        .tags(tag("a", "1"))
        .tags(tag("b", "2"))
        .send()
        .await
        .unwrap();
    let tags_now = |id: String| async move {
        let v = wait::describe_volume(c, &id).await.unwrap().unwrap();
        tag_pairs(v.tags())
    };
    assert_eq!(tags_now(id.clone()).await, pairs(&[("a", "1"), ("b", "2")]));
    // Overwrite a value.
    c.create_tags()
        .resources(&id)
        .tags(tag("a", "3"))
        .send()
        .await
        .unwrap();
    assert_eq!(tags_now(id.clone()).await, pairs(&[("a", "3"), ("b", "2")]));
    // DeleteTags with a value only deletes when the value matches.
    c.delete_tags()
        .resources(&id)
        .tags(tag("a", "not-3"))
        .send()
        .await
        .unwrap();
    assert_eq!(tags_now(id.clone()).await, pairs(&[("a", "3"), ("b", "2")]));
    c.delete_tags()
        .resources(&id)
        .tags(tag("a", "3"))
        .send()
        .await
        .unwrap();
    // A key alone deletes whatever the value.
    c.delete_tags()
        .resources(&id)
        .tags(aws_sdk_ec2::types::Tag::builder().key("b").build())
        .send()
        .await
        .unwrap();
    assert!(tags_now(id.clone()).await.is_empty());

    let absent = c
        .create_tags()
        .resources("vol-0123456789abcdef0")
        .tags(tag("a", "1"))
        .send()
        .await;
    assert_eq!(code_of(absent), "InvalidVolume.NotFound");
}

async fn modify_volume(t: &Target) {
    let c = &t.client;
    let id = available_volume(c, ZONE_A, 10).await;
    let out = c
        .modify_volume()
        .volume_id(&id)
        .size(20)
        .iops(4000)
        .send()
        .await
        .unwrap();
    let m = out.volume_modification().unwrap();
    assert_eq!(m.volume_id(), Some(id.as_str()));
    assert_eq!(m.original_size(), Some(10));
    assert_eq!(m.target_size(), Some(20));
    assert_eq!(m.original_iops(), Some(3000));
    assert_eq!(m.target_iops(), Some(4000));
    match t.flavor {
        Flavor::Aws => assert_eq!(m.target_volume_type(), Some(&VolumeType::Gp3)),
        // moto leaves out the target type when the request did not change it.
        Flavor::Moto => assert_eq!(m.target_volume_type(), None),
    }
    assert_recent("StartTime", m.start_time());
    match t.flavor {
        Flavor::Aws => assert_eq!(
            m.modification_state(),
            Some(&VolumeModificationState::Modifying)
        ),
        Flavor::Moto => assert_eq!(
            m.modification_state(),
            Some(&VolumeModificationState::Completed)
        ),
    }

    // The modification reaches optimizing or completed; the volume reports the new size.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let mods = c
            .describe_volumes_modifications()
            .volume_ids(&id)
            .send()
            .await
            .unwrap();
        let m = &mods.volumes_modifications()[0];
        assert_eq!(m.target_size(), Some(20));
        if m.modification_state() == Some(&VolumeModificationState::Completed) {
            assert!(m.end_time().is_some(), "{m:?}");
            assert_eq!(m.progress(), Some(100));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{m:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let v = wait::describe_volume(c, &id).await.unwrap().unwrap();
    assert_eq!(v.size(), Some(20));
    assert_eq!(v.iops(), Some(4000));

    // A fresh volume: AWS also limits how often one volume may be modified.
    let other = available_volume(c, ZONE_A, 10).await;
    let shrink = c.modify_volume().volume_id(&other).size(5).send().await;
    match t.flavor {
        // AWS cannot shrink a volume.
        Flavor::Aws => assert_eq!(code_of(shrink), "InvalidParameterValue"),
        Flavor::Moto => assert_eq!(
            shrink.unwrap().volume_modification().unwrap().target_size(),
            Some(5)
        ),
    }
    let absent = c
        .modify_volume()
        .volume_id("vol-0123456789abcdef0")
        .size(50)
        .send()
        .await;
    assert_eq!(code_of(absent), "InvalidVolume.NotFound");
}
