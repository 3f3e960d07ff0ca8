//! The resource types this server serves: the single source of truth for discovery, routing,
//! selectors and tables.

/// One served resource type (group, version, plural) and the facts clients learn from discovery.
#[derive(Debug)]
pub(crate) struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Has a `/status` subresource: main writes keep status, status writes keep the rest.
    pub status: bool,
    /// Field selector labels beyond `metadata.name` and `metadata.namespace` (as the real server).
    pub field_labels: &'static [&'static str],
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `volumeattachments.storage.k8s.io` or `pods`, as the real server names resources in errors.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `VolumeAttachment.storage.k8s.io` or `Pod`, as the real server names kinds in 422s.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
}

// A positional constructor keeps the resource table below one readable line per fact.
#[allow(clippy::too_many_arguments)]
const fn def(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status: bool,
    field_labels: &'static [&'static str],
) -> ResourceDef {
    ResourceDef {
        group,
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        categories: &[],
        status,
        field_labels,
    }
}

const CORE: &str = "";
const APPS: &str = "apps";
const RBAC: &str = "rbac.authorization.k8s.io";
const STORAGE: &str = "storage.k8s.io";
const COORDINATION: &str = "coordination.k8s.io";
const EVENTS: &str = "events.k8s.io";

pub(crate) static RESOURCES: &[ResourceDef] = &[
    def(
        CORE,
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        true,
        &["status.phase"],
    ),
    def(
        CORE,
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        true,
        &["spec.unschedulable"],
    ),
    ResourceDef {
        categories: &["all"],
        ..def(
            CORE,
            "pods",
            "pod",
            "Pod",
            true,
            &["po"],
            true,
            &[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
            ],
        )
    },
    def(
        CORE,
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        true,
        &[],
    ),
    def(
        CORE,
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
        &[],
    ),
    def(
        CORE,
        "secrets",
        "secret",
        "Secret",
        true,
        &[],
        false,
        &["type"],
    ),
    def(
        CORE,
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
        &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    ),
    def(
        CORE,
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        false,
        &[],
    ),
    def(
        CORE,
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        false,
        &[],
    ),
    ResourceDef {
        categories: &["all"],
        ..def(
            APPS,
            "deployments",
            "deployment",
            "Deployment",
            true,
            &["deploy"],
            true,
            &[],
        )
    },
    ResourceDef {
        categories: &["all"],
        ..def(
            APPS,
            "daemonsets",
            "daemonset",
            "DaemonSet",
            true,
            &["ds"],
            true,
            &[],
        )
    },
    // The hostpath driver's deployment (deploy/kubernetes/overlays/hostpath) is a StatefulSet.
    ResourceDef {
        categories: &["all"],
        ..def(
            APPS,
            "statefulsets",
            "statefulset",
            "StatefulSet",
            true,
            &["sts"],
            true,
            &[],
        )
    },
    def(
        RBAC,
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        &[],
        false,
        &[],
    ),
    def(
        RBAC,
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
        false,
        &[],
    ),
    def(RBAC, "roles", "role", "Role", true, &[], false, &[]),
    def(
        RBAC,
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        &[],
        false,
        &[],
    ),
    def(
        STORAGE,
        "csidrivers",
        "csidriver",
        "CSIDriver",
        false,
        &[],
        false,
        &[],
    ),
    def(
        STORAGE,
        "csinodes",
        "csinode",
        "CSINode",
        false,
        &[],
        false,
        &[],
    ),
    def(
        STORAGE,
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
        &["sc"],
        false,
        &[],
    ),
    def(
        STORAGE,
        "volumeattachments",
        "volumeattachment",
        "VolumeAttachment",
        false,
        &[],
        true,
        &[],
    ),
    def(
        COORDINATION,
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        false,
        &[],
    ),
    def(
        EVENTS,
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
        &[],
    ),
];

/// Index of a resource in [`RESOURCES`]; the store keys objects by it.
pub(crate) type ResourceId = usize;

pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

pub(crate) fn get(id: ResourceId) -> &'static ResourceDef {
    &RESOURCES[id]
}

/// The API groups (other than core) in the order `/apis` lists them.
pub(crate) fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

/// Whether `def` has a scale subresource here.
pub(crate) fn has_scale(def: &ResourceDef) -> bool {
    def.group == "apps" && matches!(def.plural, "deployments" | "statefulsets")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_names() {
        let va = get(find(STORAGE, "v1", "volumeattachments").unwrap());
        assert_eq!(va.kind, "VolumeAttachment");
        assert_eq!(va.qualified_resource(), "volumeattachments.storage.k8s.io");
        assert_eq!(va.api_version(), "storage.k8s.io/v1");
        let pod = get(find("", "v1", "pods").unwrap());
        assert_eq!(pod.qualified_kind(), "Pod");
        assert!(find("", "v1", "deployments").is_none());
        let deploy = get(find(APPS, "v1", "deployments").unwrap());
        assert_eq!(deploy.qualified_kind(), "Deployment.apps");
        assert_eq!(deploy.short_names, &["deploy"]);
        assert_eq!(
            groups(),
            vec![APPS, RBAC, STORAGE, COORDINATION, EVENTS],
            "the order /apis lists them in"
        );
    }
}
