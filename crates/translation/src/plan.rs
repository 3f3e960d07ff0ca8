//! `csi-translate plan`: for each object, which plugin it uses, which CSI driver would serve
//! it, and whether it translates (and why not).

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::input::Document;
use crate::plugins::{plugin_by_csi_name, plugin_by_in_tree_name, plugins};
use crate::translator;

/// Volume source fields of a PersistentVolume spec, for naming plugins that do not migrate.
const PV_SOURCES: [&str; 22] = [
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// One line of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlanRow {
    pub kind: String,
    pub name: String,
    pub plugin: String,
    pub driver: String,
    pub translates: bool,
    pub reason: String,
}

impl PlanRow {
    fn new(doc_kind: &str, name: &str) -> Self {
        Self {
            kind: doc_kind.to_string(),
            name: if name.is_empty() {
                "-".into()
            } else {
                name.to_string()
            },
            plugin: "-".into(),
            driver: "-".into(),
            translates: false,
            reason: String::new(),
        }
    }
}

/// The plan rows of all documents.
pub(crate) fn plan(docs: &[Document]) -> Vec<PlanRow> {
    let mut rows = Vec::new();
    for doc in docs {
        match doc.kind.as_str() {
            "PersistentVolume" => rows.push(pv_row(doc)),
            "StorageClass" => rows.push(sc_row(doc)),
            "Pod" => rows.extend(pod_rows(doc)),
            other => {
                let mut row = PlanRow::new(
                    if other.is_empty() { "(no kind)" } else { other },
                    &doc.name,
                );
                row.reason =
                    "not a PersistentVolume, StorageClass or Pod: nothing to translate".into();
                rows.push(row);
            }
        }
    }
    rows
}

fn pv_row(doc: &Document) -> PlanRow {
    let mut row = PlanRow::new("PersistentVolume", &doc.name);
    let pv = match doc.pv() {
        Ok(pv) => pv,
        Err(e) => {
            row.reason = format!("unreadable: {e}");
            return row;
        }
    };
    let source = doc
        .value
        .get("spec")
        .and_then(Value::as_object)
        .and_then(|spec| PV_SOURCES.iter().find(|k| spec.contains_key(**k)).copied());
    if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        row.driver = csi.driver.clone();
        row.plugin = plugin_by_csi_name(&csi.driver)
            .map_or("-", |p| p.in_tree_plugin_name())
            .to_string();
        row.reason = "already a CSI volume".into();
        return row;
    }
    let Some(plugin) = plugins().iter().find(|p| p.can_support(&pv)) else {
        row.plugin = source.map_or("-".to_string(), |s| s.to_string());
        row.reason = match source {
            Some(s) => format!("in-tree source {s} has no CSI migration"),
            None => "no volume source in spec".into(),
        };
        return row;
    };
    row.plugin = plugin.in_tree_plugin_name().into();
    row.driver = plugin.csi_plugin_name().into();
    match translator::translate_in_tree_pv_to_csi(&pv) {
        Ok(csi) => {
            row.translates = true;
            let handle = csi
                .spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle)
                .unwrap_or_default();
            row.reason = format!("volumeHandle {handle}");
        }
        Err(e) => row.reason = e.to_string(),
    }
    row
}

fn sc_row(doc: &Document) -> PlanRow {
    let mut row = PlanRow::new("StorageClass", &doc.name);
    let sc = match doc.storage_class() {
        Ok(sc) => sc,
        Err(e) => {
            row.reason = format!("unreadable: {e}");
            return row;
        }
    };
    row.plugin = sc.provisioner.clone();
    if let Some(p) = plugin_by_csi_name(&sc.provisioner) {
        row.plugin = p.in_tree_plugin_name().into();
        row.driver = sc.provisioner.clone();
        row.reason = "already provisioned by a CSI driver".into();
        return row;
    }
    let Some(plugin) = plugin_by_in_tree_name(&sc.provisioner) else {
        row.reason = format!(
            "provisioner {:?} is not an in-tree plugin with CSI migration",
            sc.provisioner
        );
        return row;
    };
    row.driver = plugin.csi_plugin_name().into();
    match plugin.translate_in_tree_storage_class_to_csi(&sc) {
        Ok(_) => {
            row.translates = true;
            row.reason = "-".into();
        }
        Err(e) => row.reason = e.to_string(),
    }
    row
}

fn pod_rows(doc: &Document) -> Vec<PlanRow> {
    let pod: Pod = match doc.pod() {
        Ok(p) => p,
        Err(e) => {
            let mut row = PlanRow::new("Pod", &doc.name);
            row.reason = format!("unreadable: {e}");
            return vec![row];
        }
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let volumes = pod
        .spec
        .map(|s| s.volumes.unwrap_or_default())
        .unwrap_or_default();
    volumes
        .iter()
        .filter_map(|v| {
            let plugin = plugins().iter().find(|p| p.can_support_inline(v))?;
            let mut row = PlanRow::new("Pod volume", &format!("{}/{}", doc.name, v.name));
            row.plugin = plugin.in_tree_plugin_name().into();
            row.driver = plugin.csi_plugin_name().into();
            match translator::translate_in_tree_inline_volume_to_csi(v, &namespace) {
                Ok(_) => {
                    row.translates = true;
                    row.reason = "-".into();
                }
                Err(e) => row.reason = e.to_string(),
            }
            Some(row)
        })
        .collect()
}

/// The plan as an aligned table with a closing count.
pub(crate) fn render(rows: &[PlanRow]) -> String {
    let header = [
        "KIND",
        "NAME",
        "PLUGIN",
        "CSI DRIVER",
        "TRANSLATES",
        "REASON",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.kind.clone(),
                r.name.clone(),
                r.plugin.clone(),
                r.driver.clone(),
                if r.translates { "yes" } else { "no" }.to_string(),
                r.reason.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cols: &[String]| {
        let mut l = String::new();
        for (i, c) in cols.iter().enumerate() {
            if i + 1 == cols.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header.map(str::to_string));
    for row in &cells {
        line(row);
    }
    let yes = rows.iter().filter(|r| r.translates).count();
    let _ = writeln!(
        out,
        "\n{} objects: {yes} translate to CSI, {} do not",
        rows.len(),
        rows.len() - yes
    );
    out
}
