//! `--feature-gates` as kube-controller-manager and the kubelet spell it
//! (`CSIMigrationAWS=true,CSIMigrationGCE=false`): which in-tree plugins this component serves
//! through their CSI driver.
//!
//! Today's Kubernetes has the per-plugin migration gates locked to true (GA); the seed's design
//! has them off by default and turns them on one by one. We follow the seed's switchable form,
//! defaulting every gate to off, because switching one plugin at a time is the whole point of
//! seed 003's upgrade and downgrade walkthroughs; a cluster that wants today's behaviour passes
//! the gates it wants on.

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

/// The in-tree plugins a component has migrated to CSI, by in-tree plugin name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigratedPlugins(BTreeSet<String>);

impl MigratedPlugins {
    /// None migrated (every gate off).
    pub fn none() -> Self {
        Self::default()
    }

    /// Parses a `--feature-gates` value. Gates that are not about migration are accepted and
    /// left alone (the flag carries every gate of the component); a migration gate with a value
    /// other than true/false is refused, as Kubernetes refuses it. The general `CSIMigration`
    /// gate, once required beside the per-plugin ones, is GA and accepted only as `true`.
    pub fn from_feature_gates(value: &str) -> Result<Self, Error> {
        let mut migrated = BTreeSet::new();
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
            if name == "CSIMigration" {
                if !on {
                    return Err(Error::FeatureGates(
                        "CSIMigration is GA and cannot be set to false".into(),
                    ));
                }
                continue;
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
            "CSIMigrationAWS=true, CSIMigrationGCE=false,CSIMigration=true,SomeOtherGate=false",
        )
        .unwrap();
        assert!(m.contains("kubernetes.io/aws-ebs"));
        assert!(!m.contains("kubernetes.io/gce-pd"));
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
        ] {
            let err = MigratedPlugins::from_feature_gates(bad).unwrap_err();
            assert!(err.to_string().contains("CSIMigration"), "{bad}: {err}");
        }
        assert_eq!(
            MigratedPlugins::from_feature_gates("").unwrap(),
            MigratedPlugins::none()
        );
    }
}
