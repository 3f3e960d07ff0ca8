//! `--feature-gates` as kube-controller-manager and the kubelet spell it
//! (`CSIMigrationAWS=true,CSIMigrationGCE=true`): which in-tree plugins this component serves
//! through their CSI driver.
//!
//! The standalone binaries start from [`MigratedPlugins::kubernetes_v1_26`], the gates'
//! defaults in kube-controller-manager and the kubelet v1.26, so they drop into a current
//! cluster, and apply `--feature-gates` over them ([`MigratedPlugins::with_feature_gates`]).
//! Gates v1.26 locks to true are refused as `=false` with its words, except `CSIMigrationAWS`:
//! the upgrade and downgrade walkthroughs of the migration design (docs/design/migration.md) turn
//! aws-ebs migration off and on again, so `CSIMigrationAWS=false` is accepted (a deviation from
//! v1.26, which refuses it), with a warning from [`feature_gate_warnings`]. Tests and library
//! callers that want an exact set use [`MigratedPlugins::from_feature_gates`], which starts from
//! none migrated.

use std::collections::BTreeSet;
use std::fmt;

use crate::Error;

/// The per-plugin migration gate names and the in-tree plugins they migrate.
pub const MIGRATION_GATES: [(&str, &str); 7] = [
    ("CSIMigrationAWS", "kubernetes.io/aws-ebs"),
    ("CSIMigrationGCE", "kubernetes.io/gce-pd"),
    ("CSIMigrationAzureDisk", "kubernetes.io/azure-disk"),
    ("CSIMigrationAzureFile", "kubernetes.io/azure-file"),
    ("CSIMigrationOpenStack", "kubernetes.io/cinder"),
    ("CSIMigrationvSphere", "kubernetes.io/vsphere-volume"),
    ("CSIMigrationPortworx", "kubernetes.io/portworx-volume"),
];

/// What a migration gate is in kube-controller-manager and the kubelet v1.26.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateStage {
    /// GA and locked to true: `=true` accepted with a warning, `=false` refused.
    LockedOn,
    /// GA, on by default, still switchable (`=false` accepted with a warning).
    GaOn,
    /// Beta, off by default.
    BetaOff,
    /// Removed: v1.26 refuses the gate as unrecognized; its in-tree plugin is gone and its
    /// volumes are always served by the CSI driver.
    RemovedOn,
}

/// [`GateStage`] of each gate of [`MIGRATION_GATES`] (and the general `CSIMigration`) in
/// v1.26, as `kube-controller-manager --feature-gates=...` v1.26.0 answers.
pub fn v1_26_stage(gate: &str) -> Option<GateStage> {
    Some(match gate {
        "CSIMigration"
        | "CSIMigrationAWS"
        | "CSIMigrationGCE"
        | "CSIMigrationAzureDisk"
        | "CSIMigrationvSphere" => GateStage::LockedOn,
        "CSIMigrationAzureFile" => GateStage::GaOn,
        "CSIMigrationPortworx" => GateStage::BetaOff,
        "CSIMigrationOpenStack" => GateStage::RemovedOn,
        _ => return None,
    })
}

/// The one locked gate accepted as `=false`, for the migration design's walkthroughs.
pub const SWITCHABLE_LOCKED_GATE: &str = "CSIMigrationAWS";

/// The warnings kube-controller-manager v1.26 prints for `value` (`Setting GA feature gate
/// X=true. It will be removed in a future release.`), and ours for what we accept where it
/// refuses (`CSIMigrationAWS=false`). Call after [`MigratedPlugins::with_feature_gates`]
/// accepted `value`.
pub fn feature_gate_warnings(value: &str) -> Vec<String> {
    let mut warnings = Vec::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, setting)) = pair.split_once('=') else {
            continue;
        };
        let (name, setting) = (name.trim(), setting.trim());
        let on = setting.eq_ignore_ascii_case("true");
        match v1_26_stage(name) {
            Some(GateStage::LockedOn) if !on => warnings.push(format!(
                "Setting GA feature gate {name}=false, which kube-controller-manager and the \
                 kubelet v1.26 refuse (the gate is locked to true); accepted here so the \
                 plugin can be un-migrated as in the migration design's downgrade walkthrough \
                 (docs/design/migration.md)"
            )),
            Some(GateStage::LockedOn | GateStage::GaOn) => warnings.push(format!(
                "Setting GA feature gate {name}={setting}. It will be removed in a future release."
            )),
            _ => {}
        }
    }
    warnings
}

/// The in-tree plugins a component has migrated to CSI, by in-tree plugin name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigratedPlugins(BTreeSet<String>);

impl MigratedPlugins {
    /// None migrated (every gate off).
    pub fn none() -> Self {
        Self::default()
    }

    /// The gates' defaults in kube-controller-manager and the kubelet v1.26: aws-ebs, gce-pd,
    /// azure-disk, azure-file, vsphere-volume and cinder (whose gate v1.26 removed) migrated,
    /// portworx-volume not.
    pub fn kubernetes_v1_26() -> Self {
        MIGRATION_GATES
            .iter()
            .filter(|(gate, _)| {
                matches!(
                    v1_26_stage(gate),
                    Some(GateStage::LockedOn | GateStage::GaOn | GateStage::RemovedOn)
                )
            })
            .map(|(_, plugin)| (*plugin).to_string())
            .collect()
    }

    /// Parses a `--feature-gates` value over none migrated (every gate off): exactly the
    /// plugins `value` turns on. See [`Self::with_feature_gates`].
    pub fn from_feature_gates(value: &str) -> Result<Self, Error> {
        Self::none().with_feature_gates(value)
    }

    /// Applies a `--feature-gates` value over `self` (a later setting of a gate wins). Gates
    /// that are not about migration are accepted and left alone (the flag carries every gate
    /// of the component); a migration gate with a value other than true/false is refused, as
    /// Kubernetes refuses it, and so is `=false` for a gate v1.26 locks to true
    /// ([`GateStage::LockedOn`]), in v1.26's words, except [`SWITCHABLE_LOCKED_GATE`].
    /// `CSIMigrationOpenStack`, which v1.26 no longer knows, is accepted.
    pub fn with_feature_gates(self, value: &str) -> Result<Self, Error> {
        let mut migrated = self.0;
        for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, setting) = pair.split_once('=').ok_or_else(|| {
                Error::FeatureGates(format!(
                    "missing bool value for {pair:?} (want NAME=true|false)"
                ))
            })?;
            let (name, setting) = (name.trim(), setting.trim());
            let on = match setting.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(Error::FeatureGates(format!(
                        "invalid value of {name}={setting}, err: want true or false"
                    )));
                }
            };
            if !on
                && name != SWITCHABLE_LOCKED_GATE
                && v1_26_stage(name) == Some(GateStage::LockedOn)
            {
                return Err(Error::FeatureGates(format!(
                    "cannot set feature gate {name} to false, feature is locked to true"
                )));
            }
            if let Some((_, plugin)) = MIGRATION_GATES.iter().find(|(gate, _)| *gate == name) {
                if on {
                    migrated.insert((*plugin).to_string());
                } else {
                    migrated.remove(*plugin);
                }
            }
        }
        Ok(Self(migrated))
    }

    /// Whether `in_tree_plugin` (e.g. `kubernetes.io/aws-ebs`) is migrated here.
    pub fn contains(&self, in_tree_plugin: &str) -> bool {
        self.0.contains(in_tree_plugin)
    }

    /// The value the kubelet writes into the CSINode `migrated-plugins` annotation: the
    /// migrated plugin names, sorted, comma-separated.
    pub fn annotation_value(&self) -> String {
        self.to_string()
    }

    /// The plugins, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

impl fmt::Display for MigratedPlugins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().collect();
        f.write_str(&names.join(","))
    }
}

impl FromIterator<String> for MigratedPlugins {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_name_plugins() {
        let m = MigratedPlugins::from_feature_gates(
            "CSIMigrationAWS=true, CSIMigrationAzureFile=false,CSIMigration=true,SomeOtherGate=false",
        )
        .unwrap();
        assert!(m.contains("kubernetes.io/aws-ebs"));
        assert!(!m.contains("kubernetes.io/azure-file"));
        assert_eq!(m.annotation_value(), "kubernetes.io/aws-ebs");
        let all = MigratedPlugins::from_feature_gates(
            &MIGRATION_GATES.map(|(g, _)| format!("{g}=True")).join(","),
        )
        .unwrap();
        assert_eq!(all.iter().count(), 7);
        assert_eq!(
            all.annotation_value().split(',').next(),
            Some("kubernetes.io/aws-ebs"),
            "sorted"
        );
    }

    #[test]
    fn a_later_setting_of_the_same_gate_wins() {
        let m = MigratedPlugins::from_feature_gates("CSIMigrationAWS=true,CSIMigrationAWS=false")
            .unwrap();
        assert_eq!(m, MigratedPlugins::none());
    }

    #[test]
    fn bad_values_are_refused_naming_the_gate() {
        for bad in [
            "CSIMigrationAWS",
            "CSIMigrationAWS=yes",
            "CSIMigration=false",
            "CSIMigrationGCE=false",
            "CSIMigrationAzureDisk=false",
            "CSIMigrationvSphere=false",
        ] {
            let err = MigratedPlugins::from_feature_gates(bad).unwrap_err();
            assert!(err.to_string().contains("CSIMigration"), "{bad}: {err}");
        }
        assert_eq!(
            MigratedPlugins::from_feature_gates("").unwrap(),
            MigratedPlugins::none()
        );
    }

    #[test]
    fn defaults_are_kubernetes_v1_26s() {
        let d = MigratedPlugins::kubernetes_v1_26();
        // Exactly what a v1.26.0 kubelet with no --feature-gates writes on its CSINode (seen on
        // one started by k8s-harness).
        assert_eq!(
            d.annotation_value(),
            "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file,\
             kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/vsphere-volume"
        );
        assert!(!d.contains("kubernetes.io/portworx-volume"));
        assert_eq!(d.clone().with_feature_gates("").unwrap(), d);
        let no_aws = d
            .clone()
            .with_feature_gates("CSIMigrationAWS=false")
            .unwrap();
        assert!(!no_aws.contains("kubernetes.io/aws-ebs"));
        assert!(no_aws.contains("kubernetes.io/gce-pd"));
        let px = d
            .clone()
            .with_feature_gates("CSIMigrationPortworx=true,CSIMigrationAzureFile=false")
            .unwrap();
        assert!(px.contains("kubernetes.io/portworx-volume"));
        assert!(!px.contains("kubernetes.io/azure-file"));
    }

    #[test]
    fn locked_gates_refuse_false_in_v1_26s_words_but_aws() {
        let err = MigratedPlugins::kubernetes_v1_26()
            .with_feature_gates("CSIMigrationGCE=false")
            .unwrap_err();
        assert!(
            err.to_string().contains(
                "cannot set feature gate CSIMigrationGCE to false, feature is locked to true"
            ),
            "{err}"
        );
        assert!(
            MigratedPlugins::kubernetes_v1_26()
                .with_feature_gates(
                    "CSIMigrationGCE=true,CSIMigrationvSphere=true,CSIMigration=true"
                )
                .is_ok()
        );
    }

    #[test]
    fn warnings_are_kcms_and_name_the_deviation() {
        let w = feature_gate_warnings("CSIMigrationAWS=true,CSIMigrationPortworx=true,Other=true");
        assert_eq!(
            w,
            vec![
                "Setting GA feature gate CSIMigrationAWS=true. It will be removed in a future release."
                    .to_string()
            ]
        );
        let w = feature_gate_warnings("CSIMigrationAWS=false");
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("CSIMigrationAWS=false") && w[0].contains("docs/design/migration.md"),
            "{w:?}"
        );
        assert!(feature_gate_warnings("").is_empty());
    }
}
