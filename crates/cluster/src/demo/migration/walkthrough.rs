//! The migration design's upgrade (docs/design/migration.md; controller migrated first, then
//! the node drained and migrated) and downgrade (the node drained and un-migrated first, then the
//! controller), one volume and one file through every step: which path served each operation, where
//! the volume is attached and mounted, and the file read back whenever a pod has the volume
//! mounted. The demo prints it; the migration test runs it and checks the records.

use std::time::Duration;

use ebs_cloud::Cloud as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::observe::{self, AWS_EBS_PLUGIN};
use super::paths::{self, Counts, Op, Path, Served};
use crate::demo::narrator::Narrator;
use crate::kube_ops;
use crate::{Error, RunningCluster};

/// The file written at the start and read back at every step that has it mounted.
pub const FILE: &str = "migration-demo.txt";

/// What one step observed.
#[derive(Debug, Clone)]
pub struct StepRecord {
    pub title: String,
    /// Who did each operation during the step.
    pub served: Vec<Served>,
    /// How node status lists the volume at the end (`Neither`: not attached).
    pub attached_as: Path,
    /// VolumeAttachments of the volume at the end.
    pub volume_attachments: usize,
    /// Which plugin's directory the pod's volume is mounted at (`Neither`: no pod).
    pub mounted_as: Path,
    /// Whether the file was read back intact in this step (no pod: not readable).
    pub data_checked: bool,
}

impl StepRecord {
    pub fn path(&self, op: Op) -> Path {
        paths::path_of(&self.served, op)
    }
}

/// Everything a step needs.
struct Walk<'a> {
    cluster: &'a RunningCluster,
    client: Client,
    ec2: ebs_cloud_aws::AwsCloud,
    node: &'a str,
    prefix: &'a str,
    patience: Duration,
    content: String,
    pv: String,
    volume_id: String,
    steps: Vec<StepRecord>,
}

/// Runs the walkthrough on `node` with objects named `<prefix>-...`. The cluster must start
/// with migration off on the controller side and on `node`; it ends the same way, with the
/// volume deleted. Each step's paths are checked: a wrong one is an error naming the step.
pub async fn upgrade_and_downgrade(
    cluster: &RunningCluster,
    node: &str,
    prefix: &str,
    n: &mut Narrator,
    patience: Duration,
) -> Result<Vec<StepRecord>, Error> {
    let gates = cluster.migration();
    let index = cluster
        .node_names()
        .iter()
        .position(|x| x == node)
        .ok_or_else(|| Error::Config(format!("no node named {node:?}")))?;
    if gates.controller || gates.node(index) {
        return Err(Error::Check(format!(
            "the upgrade walkthrough starts with migration off everywhere; controller {}, {node} {}",
            gates.controller,
            gates.node(index)
        )));
    }
    let mut w = Walk {
        cluster,
        client: cluster.client()?,
        ec2: cluster.ec2_client().await?,
        node,
        prefix,
        patience,
        content: String::new(),
        pv: String::new(),
        volume_id: String::new(),
        steps: Vec::new(),
    };
    w.upgrade(n).await?;
    w.downgrade(n).await?;
    Ok(w.steps)
}

impl Walk<'_> {
    fn claim(&self) -> String {
        format!("{}-data", self.prefix)
    }

    fn pod(&self, i: usize) -> String {
        format!("{}-app-{i}", self.prefix)
    }

    async fn upgrade(&mut self, n: &mut Narrator) -> Result<(), Error> {
        let (node, claim) = (self.node, self.claim());
        n.step(&format!(
            "upgrade 1/5: in-tree everywhere; a gp2 claim (kubernetes.io/aws-ebs) and a pod on {node}"
        ));
        let before = Counts::of(self.cluster);
        kube_ops::create_claim(&self.client, &claim, Some("gp2"), None).await?;
        let pod = self.start_pod(1).await?;
        let pv = kube_ops::bound_volume(&self.client, &claim, self.patience).await?;
        self.pv = pv.metadata.name.clone().unwrap_or_default();
        self.volume_id = observe::volume_id(&pv)?;
        let path = kube_ops::data_path(&pod)?.join(FILE);
        self.content = format!(
            "written on {node} while nothing was migrated (volume {})\n",
            self.volume_id
        );
        std::fs::write(&path, &self.content).map_err(|e| Error::io("writing", &path, e))?;
        n.show(format!(
            "claim {claim} bound to {} = EBS {}; wrote {}",
            self.pv,
            self.volume_id,
            path.display()
        ));
        self.record(
            n,
            "in-tree everywhere",
            &before,
            Some(&pod),
            &[
                (Op::Provision, Path::InTree),
                (Op::Attach, Path::InTree),
                (Op::Mount, Path::InTree),
            ],
        )
        .await?;
        n.proves("with CSIMigrationAWS off everywhere the in-tree plugin provisions, attaches (no VolumeAttachment) and mounts; the driver is not called");

        n.step("upgrade 2/5: migrate the controller side (PV controller and attach/detach controller restarted with CSIMigrationAWS=true)");
        let before = Counts::of(self.cluster);
        self.cluster.set_controller_migration(true).await?;
        observe::wait_csinode(&self.client, node, false, self.patience).await?;
        // Give the restarted attach/detach controller time to sync: a wrong decision would
        // show as a detach or a VolumeAttachment now.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pod = kube_ops::wait_pod_ready(&self.client, &self.pod(1), self.patience).await?;
        n.show(format!(
            "CSINode {node}: {} does not list {AWS_EBS_PLUGIN}",
            observe::MIGRATED_PLUGINS
        ));
        self.record(n, "controller migrated", &before, Some(&pod), &[])
            .await?;
        n.proves("the migrated attach/detach controller keeps serving this node in-tree: its CSINode does not say the node migrated (the migration design, docs/design/migration.md, upgrade step 3)");

        n.step(&format!(
            "upgrade 3/5: drain {node} (cordon, delete the pod): unmounted and detached in-tree"
        ));
        let before = Counts::of(self.cluster);
        self.cordon(n, true).await?;
        self.drain(1).await?;
        self.record(
            n,
            "node drained",
            &before,
            None,
            &[(Op::Unmount, Path::InTree), (Op::Detach, Path::InTree)],
        )
        .await?;
        n.proves(
            "a volume attached in-tree is detached in-tree, even with the controller migrated",
        );

        n.step(&format!(
            "upgrade 4/5: migrate {node} (node agent restarted with CSIMigrationAWS=true), then uncordon it"
        ));
        let before = Counts::of(self.cluster);
        self.cluster.set_node_migration(node, true).await?;
        observe::wait_csinode(&self.client, node, true, self.patience).await?;
        n.show(format!(
            "CSINode {node}: {} lists {AWS_EBS_PLUGIN}",
            observe::MIGRATED_PLUGINS
        ));
        self.cordon(n, false).await?;
        self.record(n, "node migrated", &before, None, &[]).await?;
        n.proves("the node agent announces its migration in its CSINode before it serves a pod");

        n.step(&format!(
            "upgrade 5/5: the pod back on {node}: CSI end to end"
        ));
        let before = Counts::of(self.cluster);
        let pod = self.start_pod(2).await?;
        self.record(
            n,
            "CSI everywhere",
            &before,
            Some(&pod),
            &[(Op::Attach, Path::Csi), (Op::Mount, Path::Csi)],
        )
        .await?;
        n.proves("the same in-tree PV is now attached through a VolumeAttachment and ControllerPublishVolume, and staged by the driver; the file written in-tree is there");
        Ok(())
    }

    async fn downgrade(&mut self, n: &mut Narrator) -> Result<(), Error> {
        let node = self.node;
        n.step(&format!(
            "downgrade 1/4: drain {node} (cordon, delete the pod): unmounted and detached through CSI"
        ));
        let before = Counts::of(self.cluster);
        self.cordon(n, true).await?;
        self.drain(2).await?;
        self.record(
            n,
            "node drained (CSI)",
            &before,
            None,
            &[(Op::Unmount, Path::Csi), (Op::Detach, Path::Csi)],
        )
        .await?;
        n.proves(
            "a volume attached through CSI is detached through CSI; its VolumeAttachment is gone",
        );

        n.step(&format!(
            "downgrade 2/4: un-migrate {node} (node agent restarted without the gate), then uncordon it"
        ));
        let before = Counts::of(self.cluster);
        self.cluster.set_node_migration(node, false).await?;
        observe::wait_csinode(&self.client, node, false, self.patience).await?;
        n.show(format!(
            "CSINode {node}: {} no longer lists {AWS_EBS_PLUGIN}",
            observe::MIGRATED_PLUGINS
        ));
        self.cordon(n, false).await?;
        self.record(n, "node un-migrated", &before, None, &[])
            .await?;
        n.proves("the node agent takes the plugin out of its CSINode annotation itself");

        n.step(&format!(
            "downgrade 3/4: the pod back on {node}; the controller is still migrated"
        ));
        let before = Counts::of(self.cluster);
        let pod = self.start_pod(3).await?;
        self.record(
            n,
            "in-tree again (controller still migrated)",
            &before,
            Some(&pod),
            &[(Op::Attach, Path::InTree), (Op::Mount, Path::InTree)],
        )
        .await?;
        n.proves("the migrated attach/detach controller follows the node's CSINode back to in-tree; the file is still there");

        n.step("downgrade 4/4: un-migrate the controller side, then clean up (pod, claim, volume)");
        let before = Counts::of(self.cluster);
        self.cluster.set_controller_migration(false).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pod = kube_ops::wait_pod_ready(&self.client, &self.pod(3), self.patience).await?;
        self.record(n, "controller un-migrated", &before, Some(&pod), &[])
            .await?;
        let before = Counts::of(self.cluster);
        self.drain(3).await?;
        kube_ops::delete_claim(&self.client, &self.claim(), self.patience).await?;
        observe::wait_volume_gone(&self.ec2, &self.volume_id, self.patience).await?;
        self.record(
            n,
            "cleaned up",
            &before,
            None,
            &[
                (Op::Unmount, Path::InTree),
                (Op::Detach, Path::InTree),
                (Op::Delete, Path::InTree),
            ],
        )
        .await?;
        n.proves("back to where the upgrade began: everything in-tree, and the volume deleted by the in-tree plugin");
        Ok(())
    }

    /// The migration design drains a node made unschedulable and makes it schedulable again once
    /// its agent announced the new gate.
    async fn cordon(&self, n: &Narrator, unschedulable: bool) -> Result<(), Error> {
        let node = self.node;
        Api::<Node>::all(self.client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
            )
            .await
            .map_err(|e| Error::kube(format!("setting node {node}'s spec.unschedulable"), e))?;
        n.show(if unschedulable {
            format!("{node} cordoned (spec.unschedulable: true)")
        } else {
            format!("{node} uncordoned")
        });
        Ok(())
    }

    async fn start_pod(&self, i: usize) -> Result<Pod, Error> {
        let name = self.pod(i);
        kube_ops::create_pod(&self.client, &name, &self.claim(), self.node).await?;
        kube_ops::wait_pod_ready(&self.client, &name, self.patience).await
    }

    async fn drain(&self, i: usize) -> Result<(), Error> {
        kube_ops::delete_pod(&self.client, &self.pod(i), self.patience).await?;
        observe::wait_detached(
            &self.client,
            &self.ec2,
            self.node,
            &self.pv,
            &self.volume_id,
            self.patience,
        )
        .await
    }

    /// Prints and records what the step did, and fails when a path differs from `want`
    /// (operations not listed: nobody).
    async fn record(
        &mut self,
        n: &Narrator,
        title: &str,
        before: &Counts,
        pod: Option<&Pod>,
        want: &[(Op, Path)],
    ) -> Result<(), Error> {
        let served = Counts::of(self.cluster).all_since(before);
        for line in paths::describe(&served) {
            n.show(line);
        }
        if paths::describe(&served).is_empty() {
            n.show("no volume operation by either path");
        }
        let listed = observe::volumes_attached(&self.client, self.node).await?;
        let attached_as = listed
            .iter()
            .find(|name| name.ends_with(&self.volume_id))
            .map_or(Path::Neither, |name| paths::attached_name_kind(name));
        let vas = kube_ops::attachments_of(&self.client, &self.pv).await?;
        n.show(format!(
            "node {} volumesAttached: {}; VolumeAttachments: {}",
            self.node,
            if listed.is_empty() {
                "none".to_string()
            } else {
                listed.join(", ")
            },
            kube_ops::describe_attachments(&vas)
        ));
        let (mounted_as, data_checked) = match pod {
            Some(pod) => {
                let dir = kube_ops::data_path(pod)?;
                let path = dir.join(FILE);
                let found =
                    std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
                if found != self.content {
                    return Err(Error::Check(format!(
                        "step {title:?}: {} holds {found:?}, not {:?}",
                        path.display(),
                        self.content
                    )));
                }
                let kind = paths::mount_path_kind(&dir);
                n.show(format!(
                    "data intact: {} ({} bytes, mounted {kind})",
                    path.display(),
                    found.len()
                ));
                (kind, true)
            }
            None => {
                // Nothing to read without a pod; show the volume is still there (or, at the
                // end, deleted).
                let state = match self.ec2.get_disk_by_id(&self.volume_id).await {
                    Ok(d) => d.state,
                    Err(e) if e.is_not_found() => "deleted".into(),
                    Err(e) => {
                        return Err(Error::start(
                            format!("reading EBS volume {}", self.volume_id),
                            e,
                        ));
                    }
                };
                n.show(format!(
                    "data: no pod mounts the volume now; EC2 says {} is {state}",
                    self.volume_id
                ));
                (Path::Neither, false)
            }
        };
        let rec = StepRecord {
            title: title.to_string(),
            served,
            attached_as,
            volume_attachments: vas.len(),
            mounted_as,
            data_checked,
        };
        let mut wrong = Vec::new();
        for op in Op::ALL {
            let expected = want
                .iter()
                .find(|(o, _)| *o == op)
                .map_or(Path::Neither, |(_, p)| *p);
            if rec.path(op) != expected {
                wrong.push(format!("{op}: {} (expected {expected})", rec.path(op)));
            }
        }
        // Where the volume is at the end must agree with who attached it.
        let attach_path = want.iter().find(|(o, _)| *o == Op::Attach).map(|(_, p)| *p);
        if attach_path == Some(Path::InTree) && rec.volume_attachments > 0 {
            wrong.push(format!(
                "attached in-tree, yet {} VolumeAttachment(s)",
                rec.volume_attachments
            ));
        }
        if let Some(p) = attach_path
            && rec.attached_as != p
        {
            wrong.push(format!("node status lists it as {}", rec.attached_as));
        }
        if let Some(p) = want.iter().find(|(o, _)| *o == Op::Mount).map(|(_, p)| *p)
            && rec.mounted_as != p
        {
            wrong.push(format!("the pod's volume is mounted {}", rec.mounted_as));
        }
        self.steps.push(rec);
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(Error::Check(format!(
                "migration design step {title:?} on {}: {}",
                self.node,
                wrong.join("; ")
            )))
        }
    }
}
