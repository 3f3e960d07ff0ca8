//! What each vector row calls, and how its result is compared.

use k8s_openapi::api::core::v1::{PersistentVolume, TopologySelectorTerm, Volume};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::outcome::{Outcome, to_json};
use super::{Row, Verdict, public};
use crate::plugins::{
    self, InTreePlugin, aws_ebs, azure_disk, azure_file, gce_pd, plugin_by_csi_name,
    plugin_by_in_tree_name, plugin_by_short_name,
};
use crate::topology::{self, LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_TOPOLOGY_ZONE, RegionParser};
use crate::translator;

/// The typed argument, or the error a caller gets for it (`null` is "no object").
fn typed<T: DeserializeOwned>(v: &Value, what: &str) -> Result<T, String> {
    if v.is_null() {
        return Err(format!("{what} is missing (null)"));
    }
    serde_path_to_error::deserialize(v)
        .map_err(|e| format!("{what}: field {}: {}", e.path(), e.inner()))
}

fn str_arg<'a>(row: &'a Row, key: &str) -> &'a str {
    row.input.get(key).and_then(Value::as_str).unwrap_or("")
}

fn strings_arg(row: &Row, key: &str) -> Vec<String> {
    row.input
        .get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn run(row: &Row) -> Verdict {
    let outcome = match call(row) {
        Ok(o) => o,
        Err(v) => return v,
    };
    judge(row, outcome)
}

/// The plugin a row names (short, in-tree or CSI name); `None` for `translator`, `common` or
/// no plugin.
fn row_plugin(row: &Row) -> Option<&'static dyn InTreePlugin> {
    let p = row.plugin.as_str();
    plugin_by_short_name(p)
        .or_else(|| plugin_by_in_tree_name(p))
        .or_else(|| plugin_by_csi_name(p))
}

fn call(row: &Row) -> Result<Outcome, Verdict> {
    let f = row.function.as_str();
    let plugin = row_plugin(row);
    if matches!(row.plugin.as_str(), "translator" | "") {
        if let Some(special) = translator_special(row) {
            return special;
        }
    }
    if row.plugin != "common" {
        if let Some(o) = public::call(row, plugin) {
            return Ok(o);
        }
    }
    Ok(
        match (plugin.map_or(row.plugin.as_str(), |p| p.short_name()), f) {
            ("aws-ebs", "KubernetesVolumeIDToEBSVolumeID") => {
                let r =
                    aws_ebs::kubernetes_volume_id_to_ebs_volume_id(str_arg(row, "kubernetesID"));
                let id = r.as_ref().map(String::clone).unwrap_or_default();
                Outcome::record(json!({ "ebsVolumeID": id }), r.err())
            }
            ("aws-ebs", "getAwsRegionFromZones") => {
                let r = aws_ebs::region_from_zones(&strings_arg(row, "zones"));
                let region = r.as_ref().map(String::clone).unwrap_or_default();
                Outcome::record(json!({ "region": region }), r.err())
            }
            ("gce-pd", "RepairVolumeHandle") => {
                let r = translator::repair_volume_handle(
                    gce_pd::DRIVER_NAME,
                    str_arg(row, "volumeHandle"),
                    str_arg(row, "nodeID"),
                );
                let handle = r.as_ref().map(String::clone).unwrap_or_default();
                Outcome::record(json!({ "volumeHandle": handle }), r.err())
            }
            ("gce-pd", "backwardCompatibleAccessModes") => {
                let modes = strings_arg(row, "accessModes");
                let out = gce_pd::backward_compatible_access_modes(Some(&modes));
                Outcome::ok(json!({ "accessModes": out }))
            }
            ("azure-disk", "isManagedDisk") => Outcome::ok(
                json!({ "managed": azure_disk::is_managed_disk(str_arg(row, "diskURI")) }),
            ),
            ("azure-disk", "getDiskName") => {
                let r = azure_disk::disk_name(str_arg(row, "diskURI"));
                let name = r.as_ref().map(String::clone).unwrap_or_default();
                Outcome::record(json!({ "diskName": name }), r.err())
            }
            ("azure-file", "getFileShareInfo") => {
                let r = azure_file::file_share_info(str_arg(row, "volumeID"));
                let i = r.as_ref().cloned().unwrap_or_default();
                Outcome::record(
                    json!({
                        "resourceGroup": i.resource_group,
                        "accountName": i.account_name,
                        "fileShareName": i.file_share_name,
                        "diskName": i.disk_name,
                    }),
                    r.err(),
                )
            }
            ("azure-file", "getStorageAccountName") => {
                let r = azure_file::storage_account_name(str_arg(row, "secretName"));
                let name = r.as_ref().map(String::clone).unwrap_or_default();
                Outcome::record(json!({ "accountName": name }), r.err())
            }
            ("common", _) => common_call(row)?,
            _ => return Err(unknown(row)),
        },
    )
}

fn unknown(row: &Row) -> Verdict {
    let internal = row.function.chars().next().is_some_and(char::is_lowercase);
    let why = format!(
        "no equivalent for {} {} in this runner",
        row.plugin, row.function
    );
    if internal {
        Verdict::Skip(why)
    } else {
        Verdict::Fail(why)
    }
}

fn region_parser(name: &str) -> Result<Option<RegionParser>, Verdict> {
    match name {
        "none" | "" => Ok(None),
        "gceGetRegionFromZones" => Ok(Some(gce_pd::region_from_zones)),
        "getAwsRegionFromZones" => Ok(Some(aws_ebs::region_from_zones)),
        other => Err(Verdict::Fail(format!("unknown regionParser {other:?}"))),
    }
}

/// The shared topology helpers (upstream `in_tree_volume.go`).
fn common_call(row: &Row) -> Result<Outcome, Verdict> {
    let pv = || {
        typed::<PersistentVolume>(row.input.get("pv").unwrap_or(&Value::Null), "pv")
            .map_err(Verdict::Fail)
    };
    Ok(match row.function.as_str() {
        "addTopology" => Outcome::from(topology::add_topology(
            &pv()?,
            str_arg(row, "topologyKey"),
            &strings_arg(row, "zones"),
        )),
        "replaceTopology" => Outcome::ok(to_json(&topology::replace_topology(
            &pv()?,
            str_arg(row, "oldKey"),
            str_arg(row, "newKey"),
        ))),
        "translateAllowedTopologies" => {
            let terms: Vec<TopologySelectorTerm> =
                typed(row.input.get("terms").unwrap_or(&json!([])), "terms")
                    .map_err(Verdict::Fail)?;
            let out = topology::translate_allowed_topologies(Some(&terms), str_arg(row, "key"));
            Outcome::ok(to_json(&out))
        }
        "translateTopologyFromInTreeToCSI" => {
            Outcome::ok(to_json(&topology::translate_topology_from_in_tree_to_csi(
                &pv()?,
                str_arg(row, "csiTopologyKey"),
            )))
        }
        "translateTopologyFromCSIToInTree" => {
            Outcome::from(topology::translate_topology_from_csi_to_in_tree(
                &pv()?,
                str_arg(row, "csiTopologyKey"),
                region_parser(str_arg(row, "regionParser"))?,
            ))
        }
        _ => return Err(unknown(row)),
    })
}

/// The rows of upstream's `translate_test.go` that check more than a result: the round trip and
/// topology tests, and the randomised inline-name test. `None` for any other row.
fn translator_special(row: &Row) -> Option<Result<Outcome, Verdict>> {
    let f = row.function.as_str();
    if f.contains("(round trip)") || f.contains("(topology)") {
        return Some(round_trip(row));
    }
    if f == "TranslateInTreeInlineVolumeToCSI" && row.input.get("note").is_some() {
        return Some(Err(inline_name_uniqueness()));
    }
    None
}

fn round_trip(row: &Row) -> Result<Outcome, Verdict> {
    let f = row.function.as_str();
    let pv_value = if f.contains("(topology)") {
        row.input.get("pv").unwrap_or(&Value::Null)
    } else {
        &row.input
    };
    let pv: PersistentVolume = typed(pv_value, "PersistentVolume").map_err(Verdict::Fail)?;
    let csi = translator::translate_in_tree_pv_to_csi(&pv)
        .map_err(|e| Verdict::Fail(format!("to CSI: {e}")))?;
    let back = translator::translate_csi_pv_to_in_tree(&csi)
        .map_err(|e| Verdict::Fail(format!("back to in-tree: {e}")))?;
    if f.contains("(topology)") {
        let key = str_arg(row, "key");
        if !key.is_empty() {
            if topology::topology_key_exists(&back, key) {
                return Err(Verdict::Fail(format!(
                    "round trip still has the CSI key {key}"
                )));
            }
            if !topology::topology_key_exists(&back, LABEL_TOPOLOGY_ZONE)
                && !topology::topology_key_exists(&back, LABEL_FAILURE_DOMAIN_BETA_ZONE)
            {
                return Err(Verdict::Fail(
                    "round trip has neither the GA nor the beta zone key".into(),
                ));
            }
        }
    }
    Ok(Outcome::ok(
        json!({ "csi": to_json(&csi), "roundTrip": to_json(&back) }),
    ))
}

/// Upstream's randomised test: two different inline volumes of one driver never share a PV name
/// (the name is the unique part of the staging path).
fn inline_name_uniqueness() -> Verdict {
    for plugin in plugins::plugins() {
        let a = sample_inline_volume(plugin.short_name());
        let b = sample_inline_volume(plugin.short_name());
        let pa = translator::translate_in_tree_inline_volume_to_csi(&a, "");
        let pb = translator::translate_in_tree_inline_volume_to_csi(&b, "");
        match (pa, pb) {
            (Ok(pa), Ok(pb)) => {
                if pa.metadata.name.is_none() || pa.metadata.name == pb.metadata.name {
                    return Verdict::Fail(format!(
                        "{}: two volumes got the PV name {:?}",
                        plugin.short_name(),
                        pa.metadata.name
                    ));
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                return Verdict::Fail(format!("{}: {e}", plugin.short_name()));
            }
        }
    }
    Verdict::Pass
}

fn sample_inline_volume(plugin: &str) -> Volume {
    let id = uuid::Uuid::new_v4().to_string();
    let v = match plugin {
        "gce-pd" => json!({ "gcePersistentDisk": { "pdName": id } }),
        "aws-ebs" => json!({ "awsElasticBlockStore": { "volumeID": id } }),
        "cinder" => json!({ "cinder": { "volumeID": id } }),
        "azure-disk" => json!({ "azureDisk": { "diskName": id, "diskURI": id } }),
        "azure-file" => json!({ "azureFile": { "secretName": id, "shareName": id } }),
        "vsphere" => json!({ "vsphereVolume": {
            "volumePath": format!(" [vsanDatastore] 6785a85e-268e-6352-a2e8-02008b7afadd/kubernetes-dynamic-pvc-{id}.vmdk"),
            "fsType": "ext4" } }),
        _ => json!({ "portworxVolume": { "volumeID": id } }),
    };
    let mut v = v;
    v["name"] = json!("");
    serde_json::from_value(v).unwrap_or_default()
}

fn judge(row: &Row, o: Outcome) -> Verdict {
    let never_errors = row.function == "replaceTopology";
    match (&o.error, row.expect_error && !never_errors) {
        (None, true) => {
            return Verdict::Fail(format!(
                "expected an error{}, got {}",
                row.go_error
                    .as_ref()
                    .map(|e| format!(" like {e:?}"))
                    .unwrap_or_default(),
                o.value.unwrap_or(Value::Null)
            ));
        }
        (Some(e), false) => return Verdict::Fail(format!("unexpected error: {e}")),
        _ => {}
    }
    if row.compare.contains("exact error text") {
        let want = row.expected.get("error").and_then(Value::as_str);
        if want != o.error.as_deref() {
            return Verdict::Fail(format!("error text: expected {want:?}, got {:?}", o.error));
        }
    }
    if row.expect_error
        && !never_errors
        && (o.value.is_none() || row.compare.contains("only when no error"))
    {
        return Verdict::Pass;
    }
    let mut problems = Vec::new();
    let expected = if row.function.contains("(round trip)") {
        json!({ "roundTrip": row.expected })
    } else {
        row.expected.clone()
    };
    if row.compare == "full" || !expected.is_object() {
        let mut exp = expected;
        if let Value::Object(m) = &mut exp {
            m.remove("error");
        }
        if let Some(d) = o.full_diff(&exp) {
            problems.push(format!("against expected:\n{d}"));
        }
    } else if let Value::Object(fields) = &expected {
        problems.extend(o.keyed_diff(fields));
    }
    if let Some(go) = &row.go_output {
        if let Some(d) = o.full_diff(go) {
            problems.push(format!("against go_output:\n{d}"));
        }
    }
    if problems.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(problems.join("\n"))
    }
}
