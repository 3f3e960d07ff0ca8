//! Rows of upstream's public functions: the `CSITranslator` methods (`translate.go`) and, with a
//! plugin named, the `InTreePlugin` methods of that plugin.
//!
//! Arguments are found under upstream's Go parameter names (`pv`, `vol`/`volume`,
//! `podNamespace`, `inTreePluginName`, `pluginName`, `csiPluginName`, `driverName`,
//! `volumeHandle`, `nodeID`, `sc`/`storageClass`), or the input is the object itself (a PV as
//! `metadata`+`spec`, a Volume, a StorageClass). A row may call several functions
//! (`A+B`, or an `expected` object keyed by function names): each is evaluated and its result
//! recorded under its name (and the names upstream's tests give such results), and a
//! translation that follows another in the row takes the previous one's output.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Row;
use super::outcome::{Outcome, to_json};
use crate::plugins::InTreePlugin;
use crate::translator as t;

/// The public methods of upstream's `CSITranslator` (`translate.go`): every one of them runs
/// by its upstream name, and the crate's tests check that `tests/vectors/extra.jsonl` covers each.
pub const TRANSLATOR_FUNCTIONS: [&str; 12] = [
    "TranslateInTreePVToCSI",
    "TranslateCSIPVToInTree",
    "TranslateInTreeStorageClassToCSI",
    "TranslateInTreeInlineVolumeToCSI",
    "IsPVMigratable",
    "IsInlineMigratable",
    "IsMigratableIntreePluginByName",
    "IsMigratedCSIDriverByName",
    "GetInTreePluginNameFromSpec",
    "GetCSINameFromInTreeName",
    "GetInTreeNameFromCSIName",
    "RepairVolumeHandle",
];

/// The methods of upstream's `InTreePlugin` interface not already in the list above.
const PLUGIN_ONLY_FUNCTIONS: [&str; 4] = [
    "CanSupport",
    "CanSupportInline",
    "GetInTreePluginName",
    "GetCSIPluginName",
];

/// Functions whose name argument is a CSI driver name (a bare `pluginName` in a row that starts
/// with one of these is a CSI name).
const TAKES_CSI_NAME: [&str; 3] = [
    "GetInTreeNameFromCSIName",
    "IsMigratedCSIDriverByName",
    "RepairVolumeHandle",
];

const PV_KEYS: [&str; 3] = ["pv", "persistentVolume", "PersistentVolume"];
const VOLUME_KEYS: [&str; 4] = ["vol", "volume", "inlineVolume", "Volume"];
const SC_KEYS: [&str; 4] = ["sc", "storageClass", "class", "StorageClass"];
const IN_TREE_NAME_KEYS: [&str; 3] = ["inTreePluginName", "inTreeName", "inTreePlugin"];
const CSI_NAME_KEYS: [&str; 5] = [
    "csiPluginName",
    "csiDriverName",
    "driverName",
    "csiName",
    "driver",
];

fn is_public(name: &str, plugin_level: bool) -> bool {
    TRANSLATOR_FUNCTIONS.contains(&name) || (plugin_level && PLUGIN_ONLY_FUNCTIONS.contains(&name))
}

/// The functions a row calls: the `+`-separated names of `function` (a trailing ` (...)` note
/// dropped), then the function names that key `expected` (or prefix a dotted key of it).
/// `None` when the row names no public function (an internal helper row).
fn functions(row: &Row, plugin_level: bool) -> Option<Result<Vec<String>, String>> {
    let head = row.function.split(" (").next().unwrap_or("");
    let mut out: Vec<String> = head
        .split('+')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if let Value::Object(expected) = &row.expected {
        for key in expected.keys() {
            let f = key.split('.').next().unwrap_or("");
            if is_public(f, plugin_level) && !out.iter().any(|o| o == f) {
                out.push(f.to_string());
            }
        }
    }
    if !out.iter().any(|f| is_public(f, plugin_level)) {
        return None;
    }
    if let Some(bad) = out.iter().find(|f| !is_public(f, plugin_level)) {
        return Some(Err(format!(
            "no equivalent for {} {bad} in this runner",
            row.plugin
        )));
    }
    Some(Ok(out))
}

/// Runs a row of public functions; `None` when the row names none.
pub(super) fn call(row: &Row, plugin: Option<&'static dyn InTreePlugin>) -> Option<Outcome> {
    let fns = match functions(row, plugin.is_some())? {
        Ok(f) => f,
        Err(e) => return Some(Outcome::err(e)),
    };
    let mut ctx = Ctx::new(row, plugin, &fns);
    let mut results: Vec<(String, Result<Value, String>)> = Vec::new();
    for f in &fns {
        let r = ctx.eval(f);
        results.push((f.clone(), r));
    }
    Some(outcome(results))
}

/// What a Go caller sees for a function that failed: the zero value of its result.
fn zero_of(function: &str) -> Value {
    match function {
        "GetInTreePluginNameFromSpec"
        | "GetCSINameFromInTreeName"
        | "GetInTreeNameFromCSIName"
        | "RepairVolumeHandle" => Value::String(String::new()),
        _ => Value::Null,
    }
}

/// Other names upstream's tests give a function's result.
fn aliases(function: &str) -> &'static [&'static str] {
    match function {
        "GetCSINameFromInTreeName" => &["csiPluginName", "csiDriverName", "csiName"],
        "GetInTreeNameFromCSIName" => &["inTreePluginName", "inTreeName"],
        "GetInTreePluginNameFromSpec" => &["pluginName", "inTreePluginName"],
        "RepairVolumeHandle" => &["volumeHandle", "repairedVolumeHandle"],
        "TranslateInTreePVToCSI" => &["csi", "csiPV", "pv"],
        "TranslateCSIPVToInTree" => &["inTree", "inTreePV", "roundTrip", "pv"],
        "TranslateInTreeStorageClassToCSI" => &["sc", "storageClass"],
        "TranslateInTreeInlineVolumeToCSI" => &["pv"],
        "IsPVMigratable" | "IsInlineMigratable" => &["migratable"],
        "CanSupport" | "CanSupportInline" => &["supported", "canSupport"],
        _ => &[],
    }
}

fn outcome(results: Vec<(String, Result<Value, String>)>) -> Outcome {
    let single = results.len() == 1;
    let mut named = BTreeMap::new();
    let mut errored = BTreeSet::new();
    let mut errors = Vec::new();
    let mut value = None;
    for (f, r) in &results {
        let v = match r {
            Ok(v) => v.clone(),
            Err(e) => {
                errors.push(if single {
                    e.clone()
                } else {
                    format!("{f}: {e}")
                });
                errored.insert(f.clone());
                errored.extend(aliases(f).iter().map(|a| a.to_string()));
                zero_of(f)
            }
        };
        if single {
            value = r.as_ref().ok().cloned();
            for generic in ["result", "output"] {
                named.insert(generic.to_string(), v.clone());
            }
        }
        for a in aliases(f) {
            named.entry(a.to_string()).or_insert_with(|| v.clone());
        }
        named.insert(f.clone(), v);
    }
    if !single {
        // The record of every function's result is the row's result.
        let mut record = serde_json::Map::new();
        for (k, v) in &named {
            record.insert(k.clone(), v.clone());
        }
        value = Some(Value::Object(record));
    }
    Outcome {
        value,
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        named,
        errored,
    }
}

struct Ctx<'a> {
    input: &'a Value,
    plugin: Option<&'static dyn InTreePlugin>,
    in_tree_name: Option<String>,
    csi_name: Option<String>,
    /// The PV the last translation in the row produced: the next one's input.
    last_pv: Option<Result<Value, String>>,
}

fn str_of(input: &Value, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str))
        .map(str::to_string)
}

fn first_of<'v>(input: &'v Value, keys: &[&str]) -> Option<&'v Value> {
    keys.iter().find_map(|k| input.get(*k))
}

fn looks_like_pv(v: &Value) -> bool {
    v.get("kind").and_then(Value::as_str) == Some("PersistentVolume")
        || v.get("spec").is_some()
        || v.get("metadata").is_some()
        || v.as_object().is_some_and(|m| m.is_empty())
}

fn looks_like_volume(v: &Value) -> bool {
    v.as_object().is_some_and(|m| {
        !m.contains_key("spec")
            && !m.contains_key("metadata")
            && (m.contains_key("name")
                || m.keys().any(|k| {
                    matches!(
                        k.as_str(),
                        "awsElasticBlockStore"
                            | "gcePersistentDisk"
                            | "azureDisk"
                            | "azureFile"
                            | "cinder"
                            | "vsphereVolume"
                            | "portworxVolume"
                    )
                }))
    })
}

/// `null` is Go's nil; anything else must deserialize. `defaults` fills required fields a Go
/// zero value would leave empty (a Volume's `name`, a StorageClass's `provisioner`).
fn optional<T: DeserializeOwned>(
    v: Option<&Value>,
    what: &str,
    defaults: &[&str],
) -> Result<Option<T>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let mut v = v.clone();
    if let Value::Object(m) = &mut v {
        for d in defaults {
            m.entry(d.to_string())
                .or_insert(Value::String(String::new()));
        }
    }
    serde_path_to_error::deserialize(&v)
        .map(Some)
        .map_err(|e| format!("{what}: field {}: {}", e.path(), e.inner()))
}

fn required<T>(v: Result<Option<T>, String>, what: &str) -> Result<T, String> {
    v?.ok_or_else(|| format!("{what} is nil"))
}

fn json_of<T: serde::Serialize>(r: crate::Result<T>) -> Result<Value, String> {
    r.map(|v| to_json(&v)).map_err(|e| e.to_string())
}

impl<'a> Ctx<'a> {
    fn new(row: &'a Row, plugin: Option<&'static dyn InTreePlugin>, fns: &[String]) -> Self {
        let input = &row.input;
        let plugin_name = str_of(input, &["pluginName"]);
        let bare_is_csi = fns
            .first()
            .is_some_and(|f| TAKES_CSI_NAME.contains(&f.as_str()));
        let mut in_tree = str_of(input, &IN_TREE_NAME_KEYS);
        let mut csi = str_of(input, &CSI_NAME_KEYS);
        if let Some(p) = plugin_name {
            if bare_is_csi {
                csi.get_or_insert(p);
            } else {
                in_tree.get_or_insert(p);
            }
        }
        // A name not given is the one the other maps to (what the row's other function returns).
        let in_tree_name = in_tree.clone().or_else(|| {
            csi.as_deref()
                .and_then(|c| t::in_tree_name_from_csi_name(c).ok())
                .map(str::to_string)
                .or_else(|| plugin.map(|p| p.in_tree_plugin_name().to_string()))
        });
        let csi_name = csi.or_else(|| {
            in_tree
                .as_deref()
                .and_then(|n| t::csi_name_from_in_tree_name(n).ok())
                .map(str::to_string)
                .or_else(|| plugin.map(|p| p.csi_plugin_name().to_string()))
        });
        Self {
            input,
            plugin,
            in_tree_name,
            csi_name,
            last_pv: None,
        }
    }

    fn pv_value(&self) -> Option<&'a Value> {
        first_of(self.input, &PV_KEYS).or_else(|| looks_like_pv(self.input).then_some(self.input))
    }

    /// The PV argument of a translation: the previous translation's output, else the input.
    fn translation_pv(&self) -> Result<PersistentVolume, String> {
        match &self.last_pv {
            Some(Ok(v)) => required(optional(Some(v), "PersistentVolume", &[]), "pv"),
            Some(Err(e)) => Err(format!("previous translation failed: {e}")),
            None => {
                let v = first_of(self.input, &PV_KEYS).unwrap_or(self.input);
                required(optional(Some(v), "PersistentVolume", &[]), "pv")
            }
        }
    }

    fn pv(&self) -> Result<Option<PersistentVolume>, String> {
        optional(self.pv_value(), "PersistentVolume", &[])
    }

    fn volume(&self) -> Result<Option<Volume>, String> {
        let v = first_of(self.input, &VOLUME_KEYS)
            .or_else(|| looks_like_volume(self.input).then_some(self.input));
        optional(v, "Volume", &["name"])
    }

    fn storage_class(&self) -> Result<Option<StorageClass>, String> {
        let v = first_of(self.input, &SC_KEYS).or_else(|| {
            let explicit = self.input.as_object().is_some_and(|m| {
                ["provisioner", "parameters", "allowedTopologies", "metadata"]
                    .iter()
                    .any(|k| m.contains_key(*k))
                    || m.is_empty()
            });
            explicit.then_some(self.input)
        });
        optional(v, "StorageClass", &["provisioner"])
    }

    fn pod_namespace(&self) -> String {
        str_of(self.input, &["podNamespace", "namespace"]).unwrap_or_default()
    }

    fn eval(&mut self, f: &str) -> Result<Value, String> {
        let plugin = self.plugin;
        let in_tree = self.in_tree_name.clone().unwrap_or_default();
        let csi = self.csi_name.clone().unwrap_or_default();
        match f {
            "TranslateInTreePVToCSI" | "TranslateCSIPVToInTree" => {
                let r = self.translation_pv().and_then(|pv| {
                    json_of(match (f, plugin) {
                        ("TranslateInTreePVToCSI", Some(p)) => p.translate_in_tree_pv_to_csi(&pv),
                        ("TranslateInTreePVToCSI", None) => t::translate_in_tree_pv_to_csi(&pv),
                        (_, Some(p)) => p.translate_csi_pv_to_in_tree(&pv),
                        (_, None) => t::translate_csi_pv_to_in_tree(&pv),
                    })
                });
                self.last_pv = Some(r.clone());
                r
            }
            "TranslateInTreeStorageClassToCSI" => {
                required(self.storage_class(), "sc").and_then(|sc| {
                    json_of(match plugin {
                        Some(p) => p.translate_in_tree_storage_class_to_csi(&sc),
                        None => {
                            let name = self
                                .in_tree_name
                                .clone()
                                .unwrap_or_else(|| sc.provisioner.clone());
                            t::translate_in_tree_storage_class_to_csi(&name, &sc)
                        }
                    })
                })
            }
            "TranslateInTreeInlineVolumeToCSI" => {
                let ns = self.pod_namespace();
                required(self.volume(), "volume").and_then(|v| {
                    json_of(match plugin {
                        Some(p) => p.translate_in_tree_inline_volume_to_csi(&v, &ns),
                        None => t::translate_in_tree_inline_volume_to_csi(&v, &ns),
                    })
                })
            }
            "IsPVMigratable" => self
                .pv()
                .map(|pv| Value::Bool(pv.as_ref().is_some_and(t::is_pv_migratable))),
            "IsInlineMigratable" => self
                .volume()
                .map(|v| Value::Bool(v.as_ref().is_some_and(t::is_inline_migratable))),
            "CanSupport" => self.pv().map(|pv| {
                Value::Bool(
                    pv.as_ref()
                        .is_some_and(|pv| plugin.is_some_and(|p| p.can_support(pv))),
                )
            }),
            "CanSupportInline" => self.volume().map(|v| {
                Value::Bool(
                    v.as_ref()
                        .is_some_and(|v| plugin.is_some_and(|p| p.can_support_inline(v))),
                )
            }),
            "IsMigratableIntreePluginByName" => Ok(Value::Bool(
                t::is_migratable_in_tree_plugin_by_name(&in_tree),
            )),
            "IsMigratedCSIDriverByName" => Ok(Value::Bool(t::is_migrated_csi_driver_by_name(&csi))),
            "GetCSINameFromInTreeName" => json_of(t::csi_name_from_in_tree_name(&in_tree)),
            "GetInTreeNameFromCSIName" => json_of(t::in_tree_name_from_csi_name(&csi)),
            "GetInTreePluginName" => Ok(Value::String(
                plugin
                    .map(|p| p.in_tree_plugin_name())
                    .unwrap_or_default()
                    .into(),
            )),
            "GetCSIPluginName" => Ok(Value::String(
                plugin
                    .map(|p| p.csi_plugin_name())
                    .unwrap_or_default()
                    .into(),
            )),
            "GetInTreePluginNameFromSpec" => {
                let pv = first_of(self.input, &PV_KEYS).or_else(|| {
                    (looks_like_pv(self.input) && !looks_like_volume(self.input))
                        .then_some(self.input)
                });
                optional::<PersistentVolume>(pv, "PersistentVolume", &[]).and_then(|pv| {
                    let vol = self.volume()?;
                    json_of(t::in_tree_plugin_name_from_spec(pv.as_ref(), vol.as_ref()))
                })
            }
            "RepairVolumeHandle" => {
                let handle = str_of(self.input, &["volumeHandle", "handle"]).unwrap_or_default();
                let node = str_of(self.input, &["nodeID", "nodeId"]).unwrap_or_default();
                let explicit_driver = str_of(self.input, &CSI_NAME_KEYS).is_some()
                    || str_of(self.input, &["pluginName"]).is_some();
                json_of(match plugin {
                    Some(p) if !explicit_driver => p.repair_volume_handle(&handle, &node),
                    _ => t::repair_volume_handle(&csi, &handle, &node),
                })
            }
            other => Err(format!("no equivalent for {other} in this runner")),
        }
    }
}
