//! One pod volume → what to mount and how: the kubelet's `CreateVolumeSpec` plus the plugin
//! lookup and the decision of the migration design (docs/design/migration.md), with the same inputs
//! and the same [`volume_plugins::decide`] as the attach/detach controller, so both pick one
//! backend.
//!
//! - `persistentVolumeClaim` → the bound PV (not bound yet: pending);
//! - a CSI PV → the CSI plugin;
//! - an in-tree `awsElasticBlockStore` PV or inline volume → CSI after translation when this
//!   node migrated the plugin, otherwise the in-tree aws-ebs plugin;
//! - `volumes[].ephemeral` (a generic ephemeral volume) → the claim `<pod>-<volume>` the
//!   ephemeral-volume controller made for this pod (one the pod does not control is refused);
//! - `volumes[].csi` → a CSI ephemeral inline volume (NodePublish only), for a driver whose
//!   CSIDriver lists `Ephemeral` in `volumeLifecycleModes`;
//! - a claim being deleted is not mounted into a pod that does not have it yet;
//! - everything else (configMap, emptyDir, ...) is not a storage volume this agent serves.

use std::collections::BTreeMap;
use std::sync::Arc;

use component_runtime::ObjectCache;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, Pod, SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::CSIDriver;
use sha2::{Digest, Sha256};
use volume_plugins::claims::ClaimProblem;
use volume_plugins::names::{aws_ebs_unique_volume_name, csi_unique_volume_name};
use volume_plugins::{Backend, MigratedPlugins, NodeMigrationInfo, decide};

/// The volume context key the kubelet sets on ephemeral inline volumes.
pub const EPHEMERAL_CONTEXT_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// How the volume is presented to the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeSingleWriter,
    MultiNodeReaderOnly,
    MultiNodeMultiWriter,
}

impl AccessMode {
    /// The kubelet's mapping of the PV's first access mode.
    fn from_pv(modes: &[String]) -> Self {
        match modes.first().map(String::as_str) {
            Some("ReadOnlyMany") => Self::MultiNodeReaderOnly,
            Some("ReadWriteMany") => Self::MultiNodeMultiWriter,
            Some("ReadWriteOncePod") => Self::SingleNodeSingleWriter,
            _ => Self::SingleNodeWriter,
        }
    }
}

/// A secret reference resolved at mount time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl SecretRef {
    fn from_ref(r: &SecretReference) -> Option<Self> {
        let name = r.name.clone().filter(|n| !n.is_empty())?;
        Some(Self {
            namespace: r.namespace.clone().unwrap_or_else(|| "default".into()),
            name,
        })
    }
}

/// A CSI volume to stage and publish.
#[derive(Debug, Clone, PartialEq)]
pub struct CsiMount {
    pub driver: String,
    pub handle: String,
    pub volume_context: BTreeMap<String, String>,
    pub fs_type: String,
    pub mount_options: Vec<String>,
    pub access_mode: AccessMode,
    /// `volumeMode: Block`: staged and published as a raw block device.
    pub block: bool,
    pub stage_secret: Option<SecretRef>,
    pub publish_secret: Option<SecretRef>,
    /// A CSI ephemeral inline volume: NodePublish only, never staged, never attached.
    pub ephemeral: bool,
    /// An in-tree volume served by its CSI driver after translation.
    pub migrated: bool,
}

/// How a volume is mounted.
#[derive(Debug, Clone, PartialEq)]
pub enum MountKind {
    Csi(CsiMount),
    /// The in-tree `kubernetes.io/aws-ebs` plugin.
    AwsEbs {
        volume_id: String,
        fs_type: String,
        mount_options: Vec<String>,
    },
}

/// One volume of one pod, to be mounted.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeToMount {
    /// The name in `node.status.volumesInUse` / `volumesAttached`.
    pub unique_name: String,
    /// The PV name, or the pod's volume name for an inline volume: the `<spec>` of paths.
    pub spec_name: String,
    /// The pod's volume name (`spec.volumes[].name`).
    pub outer_name: String,
    pub read_only: bool,
    pub kind: MountKind,
}

impl VolumeToMount {
    pub fn csi(&self) -> Option<&CsiMount> {
        match &self.kind {
            MountKind::Csi(c) => Some(c),
            MountKind::AwsEbs { .. } => None,
        }
    }
}

/// What became of one pod volume.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecOutcome {
    Mount(Box<VolumeToMount>),
    /// Not a volume this agent serves (configMap, emptyDir, ...).
    NotOurs,
    /// Not resolvable yet (PVC unbound, PV not in the cache): the reason, for Events.
    Pending(String),
    /// Cannot be mounted as written: the reason, for Events.
    Failed(String),
    /// Resolved, but not to be mounted into a pod that does not have it yet (its claim is
    /// being deleted): kept where it is mounted, refused elsewhere with the reason.
    KeepOnly(Box<VolumeToMount>, String),
}

/// The caches and settings a spec is resolved against.
pub struct SpecContext<'a> {
    pub pvcs: &'a ObjectCache<PersistentVolumeClaim>,
    pub pvs: &'a ObjectCache<PersistentVolume>,
    pub csidrivers: &'a ObjectCache<CSIDriver>,
    pub migrated: &'a MigratedPlugins,
    /// When each pod (by UID) was first seen: its claims and their volumes are used only as
    /// read from the API server since then ([`unread_claim`]). `None`: the caches are taken
    /// as they are (unit tests over fixed caches).
    pub first_seen: Option<&'a std::collections::HashMap<String, std::time::Instant>>,
}

impl SpecContext<'_> {
    /// Why `driver` may not serve a volume of lifecycle `mode` ("Persistent" or
    /// "Ephemeral"), if it may not: its CSIDriver's `volumeLifecycleModes`, Persistent only
    /// when it has no CSIDriver or lists none. Kubernetes' gate against pod authors handing
    /// volume attributes to a node plugin that never asked for inline volumes.
    fn lifecycle_refused(&self, driver: &str, mode: &str) -> Option<String> {
        let modes = self
            .csidrivers
            .get(driver)
            .and_then(|d| d.spec.volume_lifecycle_modes.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| vec!["Persistent".to_string()]);
        (!modes.iter().any(|m| m == mode)).then(|| {
            format!(
                "volume mode \"{mode}\" not supported by driver {driver} (only supports {modes:?})"
            )
        })
    }

    /// The kubelet decides by its own gates; the CSINode annotation it publishes says the
    /// same (the node stays NotReady until it does), which is what the ADC reads.
    fn backend(&self, in_tree_plugin: &str) -> Backend {
        let own = NodeMigrationInfo::from_annotation(Some(&self.migrated.annotation_value()));
        decide(in_tree_plugin, self.migrated, &own)
    }
}

/// The kubelet's handle of an ephemeral inline volume: `csi-` + sha256(pod UID + volume name).
pub fn ephemeral_volume_handle(pod_uid: &str, volume_name: &str) -> String {
    let mut h = Sha256::new();
    h.update(pod_uid.as_bytes());
    h.update(volume_name.as_bytes());
    format!("csi-{}", hex::encode(h.finalize()))
}

pub fn volume_to_mount(ctx: &SpecContext<'_>, pod: &Pod, volume: &Volume) -> SpecOutcome {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(csi) = &volume.csi {
        if let Some(why) = ctx.lifecycle_refused(&csi.driver, "Ephemeral") {
            return SpecOutcome::Failed(why);
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let handle = ephemeral_volume_handle(uid, &volume.name);
        // `csi.storage.k8s.io/ephemeral` goes with the pod's info at publish, when the
        // CSIDriver asks for it (podInfoOnMount).
        let context: BTreeMap<String, String> = csi.volume_attributes.clone().unwrap_or_default();
        let read_only = csi.read_only.unwrap_or(false);
        return SpecOutcome::Mount(Box::new(VolumeToMount {
            unique_name: csi_unique_volume_name(&csi.driver, &handle),
            spec_name: volume.name.clone(),
            outer_name: volume.name.clone(),
            read_only,
            kind: MountKind::Csi(CsiMount {
                driver: csi.driver.clone(),
                handle,
                volume_context: context,
                fs_type: csi.fs_type.clone().unwrap_or_default(),
                mount_options: Vec::new(),
                access_mode: AccessMode::SingleNodeWriter,
                block: false,
                stage_secret: None,
                publish_secret: csi
                    .node_publish_secret_ref
                    .as_ref()
                    .filter(|r| !r.name.is_empty())
                    .map(|r| SecretRef {
                        namespace: namespace.to_string(),
                        name: r.name.clone(),
                    }),
                ephemeral: true,
                migrated: false,
            }),
        }));
    }
    if let Some(claim) = &volume.persistent_volume_claim {
        if let Some(wait) = unread_claim(ctx, pod, namespace, &claim.claim_name) {
            return wait;
        }
        return from_claim(
            ctx,
            namespace,
            &claim.claim_name,
            volume,
            claim.read_only.unwrap_or(false),
        );
    }
    if volume.ephemeral.is_some() {
        // A generic ephemeral volume is the claim `<pod>-<volume>` made for this pod.
        let claim = volume_plugins::claims::ephemeral_claim_name(pod, volume);
        if let Some(wait) = unread_claim(ctx, pod, namespace, &claim) {
            return wait;
        }
        return match volume_plugins::claims::ephemeral_claim(ctx.pvcs, pod, volume) {
            Ok(claim) => from_claim(ctx, namespace, &claim, volume, false),
            Err(ClaimProblem::Pending(why)) => {
                let claim = volume_plugins::claims::ephemeral_claim_name(pod, volume);
                ctx.pvcs.hot(Some(namespace), &claim);
                SpecOutcome::Pending(why)
            }
            Err(ClaimProblem::NotOwned(why) | ClaimProblem::Mismatch { reason: why, .. }) => {
                SpecOutcome::Failed(why)
            }
        };
    }
    if volume.aws_elastic_block_store.is_some() {
        return from_inline_ebs(ctx, volume, namespace);
    }
    SpecOutcome::NotOurs
}

/// Why the pod's claim `claim` cannot be used yet: it, or the volume it is bound to, has not
/// been read from the API server since the pod was first seen. The kubelet reads a new pod's
/// claim and volume with GETs; a copy cached from before could be of a claim deleted and
/// recreated under the same name since (every StatefulSet does that), and would hand the new
/// pod the old claim's volume (`csi-cluster chaos` caught exactly that). The read takes one
/// round trip; meanwhile the volume waits, and what the pod already has mounted stays.
fn unread_claim(
    ctx: &SpecContext<'_>,
    pod: &Pod,
    namespace: &str,
    claim: &str,
) -> Option<SpecOutcome> {
    let first_seen = ctx.first_seen?;
    // A pod the caller has not stamped yet is read against now: it waits for the next pass.
    let since = pod
        .metadata
        .uid
        .as_deref()
        .and_then(|uid| first_seen.get(uid))
        .copied()
        .unwrap_or_else(std::time::Instant::now);
    let reading =
        |what: String| SpecOutcome::Pending(format!("reading {what} from the API server"));
    let Some(pvc) = ctx.pvcs.fresh_since(Some(namespace), claim, since) else {
        return Some(reading(format!("PVC {namespace}/{claim}")));
    };
    let pv = pvc
        .and_then(|c| c.spec.as_ref()?.volume_name.clone())
        .filter(|name| !name.is_empty())?;
    ctx.pvs
        .fresh_since(None, &pv, since)
        .is_none()
        .then(|| reading(format!("PV {pv}")))
}

/// The volume of claim `claim`, kept only where it is mounted when the claim is being deleted
/// (the kubelet: "can't start pod because PVC ... is being deleted").
fn from_claim(
    ctx: &SpecContext<'_>,
    namespace: &str,
    claim: &str,
    volume: &Volume,
    read_only: bool,
) -> SpecOutcome {
    let pv = match bound_pv(ctx, namespace, claim) {
        Ok(pv) => pv,
        Err(outcome) => return *outcome,
    };
    let outcome = from_pv(ctx, &pv, volume, read_only);
    let deleting = ctx
        .pvcs
        .get_namespaced(namespace, claim)
        .is_some_and(|c| c.metadata.deletion_timestamp.is_some());
    match outcome {
        SpecOutcome::Mount(v) if deleting => SpecOutcome::KeepOnly(
            v,
            format!("can't start pod because PVC {namespace}/{claim} is being deleted"),
        ),
        other => other,
    }
}

/// The PV bound to the claim, or why there is none (shared with the attach/detach controller).
fn bound_pv(
    ctx: &SpecContext<'_>,
    namespace: &str,
    claim: &str,
) -> Result<Arc<PersistentVolume>, Box<SpecOutcome>> {
    volume_plugins::claims::bound_pv(ctx.pvcs, ctx.pvs, namespace, claim).map_err(|p| {
        if let ClaimProblem::Pending(_) = p {
            // Waiting for the claim to be bound or its volume to appear: the scoped caches
            // look again soon instead of backing off.
            ctx.pvcs.hot(Some(namespace), claim);
            if let Some(pv) = ctx
                .pvcs
                .get_namespaced(namespace, claim)
                .and_then(|c| c.spec.as_ref()?.volume_name.clone())
            {
                ctx.pvs.hot(None, &pv);
            }
        }
        Box::new(match p {
            ClaimProblem::Pending(why) => SpecOutcome::Pending(why),
            ClaimProblem::Mismatch { reason, .. } | ClaimProblem::NotOwned(reason) => {
                SpecOutcome::Failed(reason)
            }
        })
    })
}

fn csi_from_pv_spec(
    spec: &PersistentVolumeSpec,
    name: &str,
    outer: &Volume,
    claim_read_only: bool,
    migrated: bool,
) -> SpecOutcome {
    let Some(csi) = &spec.csi else {
        return SpecOutcome::Failed(format!("PV {name} has no spec.csi"));
    };
    if csi.driver.is_empty() || csi.volume_handle.is_empty() {
        return SpecOutcome::Failed(format!(
            "PV {name}: spec.csi needs both driver and volumeHandle, got driver {:?} and volumeHandle {:?}",
            csi.driver, csi.volume_handle
        ));
    }
    let modes = spec.access_modes.clone().unwrap_or_default();
    SpecOutcome::Mount(Box::new(VolumeToMount {
        unique_name: csi_unique_volume_name(&csi.driver, &csi.volume_handle),
        spec_name: name.to_string(),
        outer_name: outer.name.clone(),
        read_only: claim_read_only || csi.read_only.unwrap_or(false),
        kind: MountKind::Csi(CsiMount {
            driver: csi.driver.clone(),
            handle: csi.volume_handle.clone(),
            volume_context: csi.volume_attributes.clone().unwrap_or_default(),
            fs_type: csi.fs_type.clone().unwrap_or_default(),
            mount_options: spec.mount_options.clone().unwrap_or_default(),
            access_mode: AccessMode::from_pv(&modes),
            block: spec.volume_mode.as_deref() == Some("Block"),
            stage_secret: csi
                .node_stage_secret_ref
                .as_ref()
                .and_then(SecretRef::from_ref),
            publish_secret: csi
                .node_publish_secret_ref
                .as_ref()
                .and_then(SecretRef::from_ref),
            ephemeral: false,
            migrated,
        }),
    }))
}

fn from_pv(
    ctx: &SpecContext<'_>,
    pv: &PersistentVolume,
    outer: &Volume,
    claim_read_only: bool,
) -> SpecOutcome {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let Some(spec) = pv.spec.as_ref() else {
        return SpecOutcome::Failed(format!("PV {name} has no spec"));
    };
    if let Some(csi) = &spec.csi {
        if let Some(why) = ctx.lifecycle_refused(&csi.driver, "Persistent") {
            return SpecOutcome::Failed(format!("PV {name}: {why}"));
        }
        return csi_from_pv_spec(spec, &name, outer, claim_read_only, false);
    }
    let Some(ebs) = &spec.aws_elastic_block_store else {
        // Another in-tree plugin: Kubernetes removed them; this agent has none.
        return SpecOutcome::NotOurs;
    };
    match ctx.backend(volume_plugins::names::AWS_EBS_PLUGIN_NAME) {
        Backend::Csi { .. } => match csi_translation::translate_in_tree_pv_to_csi(pv) {
            Ok(translated) => match translated.spec.as_ref() {
                Some(s) => csi_from_pv_spec(s, &name, outer, claim_read_only, true),
                None => {
                    SpecOutcome::Failed(format!("PV {name}: the translation to CSI gave no spec"))
                }
            },
            Err(e) => SpecOutcome::Failed(format!("PV {name}: translating to CSI: {e}")),
        },
        Backend::Refused { reason } => SpecOutcome::Failed(reason),
        Backend::InTree => in_tree_ebs(
            &name,
            outer,
            &ebs.volume_id,
            ebs.fs_type.clone().unwrap_or_default(),
            spec.mount_options.clone().unwrap_or_default(),
            claim_read_only || ebs.read_only.unwrap_or(false),
        ),
    }
}

fn from_inline_ebs(ctx: &SpecContext<'_>, volume: &Volume, namespace: &str) -> SpecOutcome {
    let Some(ebs) = &volume.aws_elastic_block_store else {
        return SpecOutcome::NotOurs;
    };
    match ctx.backend(volume_plugins::names::AWS_EBS_PLUGIN_NAME) {
        Backend::Csi { .. } => {
            match csi_translation::translate_in_tree_inline_volume_to_csi(volume, namespace) {
                Ok(pv) => match pv.spec.as_ref() {
                    Some(s) => csi_from_pv_spec(s, &volume.name, volume, false, true),
                    None => SpecOutcome::Failed(format!(
                        "volume {}: the translation to CSI gave no spec",
                        volume.name
                    )),
                },
                Err(e) => {
                    SpecOutcome::Failed(format!("volume {}: translating to CSI: {e}", volume.name))
                }
            }
        }
        Backend::Refused { reason } => SpecOutcome::Failed(reason),
        Backend::InTree => in_tree_ebs(
            &volume.name,
            volume,
            &ebs.volume_id,
            ebs.fs_type.clone().unwrap_or_default(),
            Vec::new(),
            ebs.read_only.unwrap_or(false),
        ),
    }
}

fn in_tree_ebs(
    spec_name: &str,
    outer: &Volume,
    volume_id: &str,
    fs_type: String,
    mount_options: Vec<String>,
    read_only: bool,
) -> SpecOutcome {
    if volume_id.trim().is_empty() {
        return SpecOutcome::Failed(format!(
            "volume {spec_name}: awsElasticBlockStore.volumeID is empty"
        ));
    }
    SpecOutcome::Mount(Box::new(VolumeToMount {
        unique_name: aws_ebs_unique_volume_name(volume_id),
        spec_name: spec_name.to_string(),
        outer_name: outer.name.clone(),
        read_only,
        kind: MountKind::AwsEbs {
            volume_id: volume_id.to_string(),
            fs_type,
            mount_options,
        },
    }))
}

#[cfg(test)]
mod tests;
