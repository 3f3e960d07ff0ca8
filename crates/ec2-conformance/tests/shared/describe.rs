//! DescribeVolumes: filters, pagination with MaxResults / NextToken.

use std::collections::BTreeSet;

use aws_sdk_ec2::types::{Filter, VolumeAttachmentState, VolumeType};
use ec2_conformance::{Flavor, wait};

use crate::common::*;

crate::both_endpoints!(filters, pagination);

fn filter(name: &str, values: &[&str]) -> Filter {
    let mut f = Filter::builder().name(name);
    for v in values {
        f = f.values(*v);
    }
    f.build()
}

async fn create_tagged(t: &Target, zone: &str, tags: &[(&str, &str)]) -> String {
    let out = t
        .client
        .create_volume()
        .availability_zone(zone)
        .size(5)
        .volume_type(VolumeType::Gp3)
        .tag_specifications(volume_tags(tags))
        .send()
        .await
        .unwrap();
    out.volume_id().unwrap().to_string()
}

async fn filters(t: &Target) {
    let c = &t.client;
    let prod = create_tagged(t, ZONE_A, &[("env", "prod")]).await;
    let dev = create_tagged(t, ZONE_A, &[("env", "dev")]).await;
    let other = create_tagged(t, ZONE_B, &[("owner", "x")]).await;
    let ours: BTreeSet<String> = [&prod, &dev, &other].into_iter().cloned().collect();
    for id in &ours {
        wait::volume_state(c, id, aws_sdk_ec2::types::VolumeState::Available, WAIT)
            .await
            .unwrap();
    }
    let inst = instance(c, ZONE_A).await;
    c.attach_volume()
        .volume_id(&prod)
        .instance_id(&inst)
        .device("/dev/xvdba")
        .send()
        .await
        .unwrap();
    wait::attachment_state(c, &prod, &inst, VolumeAttachmentState::Attached, WAIT)
        .await
        .unwrap();

    // Only our volumes count: RunInstances may give the instance a root volume.
    let query = |filters: Vec<Filter>| {
        let ours = ours.clone();
        async move {
            let out = c
                .describe_volumes()
                .set_filters(Some(filters))
                .send()
                .await
                .unwrap();
            out.volumes()
                .iter()
                .filter_map(|v| v.volume_id())
                .filter(|id| ours.contains(*id))
                .map(str::to_string)
                .collect::<BTreeSet<String>>()
        }
    };
    let set = |ids: &[&String]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();

    assert_eq!(
        query(vec![filter("tag:env", &["prod"])]).await,
        set(&[&prod])
    );
    assert_eq!(
        query(vec![filter("tag:env", &["prod", "dev"])]).await,
        set(&[&prod, &dev])
    );
    assert_eq!(
        query(vec![filter("tag-key", &["env"])]).await,
        set(&[&prod, &dev])
    );
    assert_eq!(
        query(vec![filter("tag-key", &["owner"])]).await,
        set(&[&other])
    );
    assert_eq!(
        query(vec![filter("availability-zone", &[ZONE_B])]).await,
        set(&[&other])
    );
    assert_eq!(
        query(vec![filter("attachment.instance-id", &[&inst])]).await,
        set(&[&prod])
    );
    assert_eq!(
        query(vec![filter("status", &["in-use"])]).await,
        set(&[&prod])
    );
    assert_eq!(
        query(vec![filter("status", &["available"])]).await,
        set(&[&dev, &other])
    );
    // Several filters: all must match.
    assert_eq!(
        query(vec![
            filter("tag-key", &["env"]),
            filter("status", &["available"])
        ])
        .await,
        set(&[&dev])
    );
    assert_eq!(
        query(vec![filter("tag:env", &["nothing"])]).await,
        BTreeSet::new()
    );

    let unknown = c
        .describe_volumes()
        .filters(filter("no-such-filter", &["x"]))
        .send()
        .await;
    match t.flavor {
        Flavor::Aws => assert_eq!(code_of(unknown), "InvalidParameterValue"),
        // moto fails with an HTML 500 page, which carries no EC2 error code.
        Flavor::Moto => {
            let failure = ec2_conformance::expect_code(unknown).unwrap();
            assert_eq!(failure.status, Some(500), "{failure:?}");
            assert_eq!(failure.code, None, "{failure:?}");
        }
    }
}

async fn pagination(t: &Target) {
    let c = &t.client;
    let mut created = BTreeSet::new();
    for i in 0..7 {
        created.insert(create_tagged(t, ZONE_A, &[("n", &i.to_string())]).await);
    }
    let first = c.describe_volumes().max_results(5).send().await.unwrap();
    match t.flavor {
        Flavor::Aws => {
            assert_eq!(first.volumes().len(), 5);
            let token = first.next_token().expect("a NextToken after a full page");
            let second = c
                .describe_volumes()
                .max_results(5)
                .next_token(token)
                .send()
                .await
                .unwrap();
            assert_eq!(second.volumes().len(), 2);
            assert_eq!(second.next_token(), None);
            let all: BTreeSet<String> = first
                .volumes()
                .iter()
                .chain(second.volumes())
                .filter_map(|v| v.volume_id().map(str::to_string))
                .collect();
            assert_eq!(all, created, "each volume exactly once over the pages");

            let too_small = c.describe_volumes().max_results(4).send().await;
            assert_eq!(code_of(too_small), "InvalidParameterValue");
            let bad_token = c.describe_volumes().next_token("not-a-token").send().await;
            assert_eq!(code_of(bad_token), "InvalidPaginationToken");
            let with_ids = c
                .describe_volumes()
                .volume_ids(created.first().unwrap())
                .max_results(5)
                .send()
                .await;
            assert_eq!(code_of(with_ids), "InvalidParameterCombination");
        }
        Flavor::Moto => {
            // moto ignores MaxResults: one page with everything, no token.
            assert_eq!(first.volumes().len(), 7);
            assert_eq!(first.next_token(), None);
        }
    }

    // The SDK's paginator walks the pages the same way on both.
    let mut pages = c.describe_volumes().max_results(5).into_paginator().send();
    let mut seen = Vec::new();
    let mut page_count = 0;
    while let Some(page) = pages.next().await {
        page_count += 1;
        seen.extend(
            page.unwrap()
                .volumes()
                .iter()
                .filter_map(|v| v.volume_id().map(str::to_string)),
        );
    }
    assert_eq!(seen.len(), 7, "{seen:?}");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), created);
    assert_eq!(page_count, if t.flavor.is_aws() { 2 } else { 1 });
}
