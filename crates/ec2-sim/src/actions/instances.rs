//! RunInstances, TerminateInstances, DescribeInstances: just enough EC2 to register nodes.

use super::mappings::{EbsMapping, ebs_mappings};
use super::{
    DescribeQuery, DescribeSpec, check_id, client_token, describe_query, dry_run,
    idempotent_mismatch, paginate, tag_filter,
};
use crate::engine::Engine;
use crate::ids;
use crate::model::{AttachState, Attachment, Instance, Step, Token, Volume, duration_ms};
use crate::query::{Filter, Params, filter_matches};
use crate::render::{self, OWNER_ID};
use crate::xml::{ApiError, Xml};

/// One call starts at most this many instances (a sim, not a fleet).
const MAX_COUNT: i64 = 100;

fn render_reservation(x: &mut Xml, engine: &Engine, instances: &[&Instance], now: u64) {
    let reservation = instances
        .first()
        .map(|i| i.reservation_id.clone())
        .unwrap_or_default();
    x.leaf("reservationId", reservation)
        .leaf("ownerId", OWNER_ID)
        .start("groupSet")
        .end("groupSet")
        .start("instancesSet");
    for i in instances {
        let atts: Vec<_> = engine.cloud.attachments_of(&i.id).collect();
        x.start("item");
        render::instance_fields(x, i, &atts, now);
        x.end("item");
    }
    x.end("instancesSet");
}

pub(crate) fn run(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let token = client_token(params)?;
    let fingerprint = params.fingerprint(&["Action", "Version", "ClientToken", "DryRun"]);
    if let Some(t) = &token {
        if let Some(prev) = engine.cloud.tokens.get(&format!("RunInstances/{t}")) {
            if prev.fingerprint != fingerprint {
                return Err(idempotent_mismatch());
            }
            dry_run(params)?;
            let instances: Vec<&Instance> = prev
                .ids
                .iter()
                .filter_map(|id| engine.cloud.instances.get(id))
                .collect();
            render_reservation(x, engine, &instances, now);
            return Ok(());
        }
    }
    let image_id = params.require("ImageId")?.to_string();
    let min = params
        .int("MinCount")?
        .ok_or_else(|| ApiError::missing("MinCount"))?;
    let max = params
        .int("MaxCount")?
        .ok_or_else(|| ApiError::missing("MaxCount"))?;
    if min < 1 || max < 1 || min > max {
        return Err(ApiError::invalid_value(
            "MinCount",
            &min.to_string(),
            "MinCount and MaxCount must be at least 1 and MinCount <= MaxCount.",
        ));
    }
    if min > MAX_COUNT {
        return Err(ApiError::new(
            "InstanceLimitExceeded",
            format!(
                "Your quota allows for {MAX_COUNT} more running instance(s). You requested at least {min}"
            ),
        ));
    }
    let count = max.min(MAX_COUNT) as usize;
    let zone = match params.get("Placement.AvailabilityZone") {
        None | Some("") => engine.config.zones.first().cloned().unwrap_or_default(),
        Some(z) if engine.config.zones.iter().any(|c| c == z) => z.to_string(),
        Some(z) => {
            return Err(ApiError::new(
                "InvalidParameterValue",
                format!("Invalid availability zone: [{z}]"),
            ));
        }
    };
    let instance_type = params.get("InstanceType").unwrap_or("m5.large").to_string();
    let tags = params.tag_specifications_for("instance", &["volume", "network-interface"])?;
    let volume_tags =
        params.tag_specifications_for("volume", &["instance", "network-interface"])?;
    let mappings = ebs_mappings(engine, params, now)?;
    dry_run(params)?;

    let reservation_id = ids::resource_id("r");
    let boot = duration_ms(engine.config.timing, Step::Boot);
    // AWS launches an instance whose volume has an unusable KMS key, then terminates it.
    let launch_fails = mappings.iter().any(|m| !m.volume.key_exists);
    let mut created = Vec::with_capacity(count);
    let mut volumes = Vec::new();
    for _ in 0..count {
        let id = ids::resource_id("i");
        let instance = Instance {
            id: id.clone(),
            reservation_id: reservation_id.clone(),
            zone: zone.clone(),
            image_id: image_id.clone(),
            instance_type: instance_type.clone(),
            launch_ms: now,
            running_ms: now + boot,
            terminate: launch_fails.then_some((now, now + boot)),
            tags: tags.clone(),
        };
        if !launch_fails {
            for m in &mappings {
                volumes.push(launch_volume(m, &instance, &volume_tags, now));
            }
        }
        created.push(instance);
    }
    for v in &volumes {
        if let Err(e) = engine
            .disks
            .create_volume(&v.id, v.size_gib, v.snapshot_id.as_deref())
        {
            for v in &volumes {
                engine.disks.remove_volume(&v.id);
            }
            return Err(ApiError::internal(format!(
                "cannot create the volume image: {e}"
            )));
        }
    }
    for v in volumes {
        engine.cloud.volumes.insert(v.id.clone(), v);
    }
    let created: Vec<String> = created
        .into_iter()
        .map(|i| {
            let id = i.id.clone();
            engine.cloud.instances.insert(id.clone(), i);
            id
        })
        .collect();
    if let Some(t) = token {
        engine.cloud.tokens.insert(
            format!("RunInstances/{t}"),
            Token {
                fingerprint,
                ids: created.clone(),
                volume: None,
            },
        );
    }
    engine.dirty = true;
    let instances: Vec<&Instance> = created
        .iter()
        .filter_map(|id| engine.cloud.instances.get(id))
        .collect();
    render_reservation(x, engine, &instances, now);
    Ok(())
}

/// A volume of a launch mapping, attached to `instance` from the start: `attaching` until
/// the instance is running.
fn launch_volume(
    m: &EbsMapping,
    instance: &Instance,
    tags: &[(String, String)],
    now: u64,
) -> Volume {
    let mut v = m.volume.clone().into_volume(
        ids::resource_id("vol"),
        instance.zone.clone(),
        tags.to_vec(),
        now,
        now,
    );
    v.attachments.push(Attachment {
        instance_id: instance.id.clone(),
        device: m.device.clone(),
        state: AttachState::Attaching,
        attach_ms: now,
        done_ms: instance.running_ms,
        force: false,
        delete_on_termination: m.delete_on_termination,
        never_attached: false,
    });
    v
}

pub(crate) fn terminate(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let ids = params.list("InstanceId");
    if ids.is_empty() {
        return Err(ApiError::missing("InstanceId"));
    }
    for id in &ids {
        check_id(id, "i", "InvalidInstanceID.Malformed")?;
    }
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !engine.cloud.instances.contains_key(*id))
        .collect();
    if !missing.is_empty() {
        let list: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        return Err(ApiError::new(
            "InvalidInstanceID.NotFound",
            format!("The instance IDs '{}' do not exist", list.join(", ")),
        ));
    }
    dry_run(params)?;
    let shutdown = duration_ms(engine.config.timing, Step::Shutdown);
    let delete = duration_ms(engine.config.timing, Step::Delete);
    x.start("instancesSet");
    for id in &ids {
        let Some(i) = engine.cloud.instances.get_mut(id) else {
            continue;
        };
        let (pcode, pname) = i.state(now);
        if i.terminate.is_none() {
            i.terminate = Some((now, now + shutdown));
        }
        let (ccode, cname) = i.state(now);
        x.start("item")
            .leaf("instanceId", id)
            .start("currentState")
            .leaf("code", ccode)
            .leaf("name", cname)
            .end("currentState")
            .start("previousState")
            .leaf("code", pcode)
            .leaf("name", pname)
            .end("previousState")
            .end("item");
        // EBS volumes are detached while the instance shuts down.
        // Those with DeleteOnTermination are deleted once detached.
        for v in engine.cloud.volumes.values_mut() {
            for a in v.attachments.iter_mut().filter(|a| a.instance_id == *id) {
                if a.state != AttachState::Detaching {
                    a.never_attached = a.state == AttachState::Attaching;
                    a.state = AttachState::Detaching;
                    a.done_ms = now + shutdown;
                }
                a.force = true;
                if a.delete_on_termination {
                    v.delete_when_detached = Some(delete);
                }
            }
        }
    }
    x.end("instancesSet");
    engine.dirty = true;
    Ok(())
}

const INSTANCE_FILTERS: &[&str] = &[
    "availability-zone",
    "block-device-mapping.device-name",
    "block-device-mapping.volume-id",
    "image-id",
    "instance-id",
    "instance-state-code",
    "instance-state-name",
    "instance-type",
    "reservation-id",
];

fn instance_matches(engine: &Engine, i: &Instance, f: &Filter, now: u64) -> bool {
    if let Some(m) = tag_filter(f, &i.tags) {
        return m;
    }
    let one = |s: &str| filter_matches(f, [s]);
    match f.name.as_str() {
        "availability-zone" => one(&i.zone),
        "block-device-mapping.device-name" => engine
            .cloud
            .attachments_of(&i.id)
            .any(|(_, a)| one(&a.device)),
        "block-device-mapping.volume-id" => {
            engine.cloud.attachments_of(&i.id).any(|(v, _)| one(&v.id))
        }
        "image-id" => one(&i.image_id),
        "instance-id" => one(&i.id),
        "instance-state-code" => one(&i.state(now).0.to_string()),
        "instance-state-name" => one(i.state(now).1),
        "instance-type" => one(&i.instance_type),
        "reservation-id" => one(&i.reservation_id),
        _ => false,
    }
}

pub(crate) fn describe(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let DescribeQuery { ids, filters, page } = describe_query(
        params,
        &DescribeSpec {
            id_param: "InstanceId",
            set_name: "instancesSet",
            filters: INSTANCE_FILTERS,
            max_results: 1000,
            id_prefix: "i",
            malformed: "InvalidInstanceID.Malformed",
            not_found: "InvalidInstanceID.NotFound",
            noun: "instance ID",
        },
        |id| engine.cloud.instances.contains_key(id),
    )?;
    let selected: Vec<(String, &Instance)> = engine
        .cloud
        .instances
        .values()
        .filter(|i| ids.is_empty() || ids.contains(&i.id))
        .filter(|i| filters.iter().all(|f| instance_matches(engine, i, f, now)))
        .map(|i| (i.id.clone(), i))
        .collect();
    let (items, next) = paginate(selected, &page);
    // Group by reservation, keeping the order of first appearance.
    let mut groups: Vec<Vec<&Instance>> = Vec::new();
    for (_, i) in items {
        match groups.iter_mut().find(|g| {
            g.first()
                .is_some_and(|f| f.reservation_id == i.reservation_id)
        }) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    x.start("reservationSet");
    for g in &groups {
        x.start("item");
        render_reservation(x, engine, g, now);
        x.end("item");
    }
    x.end("reservationSet");
    x.opt_leaf("nextToken", next);
    Ok(())
}
