//! The agreement of the migration design (docs/design/migration.md) between the attach/detach
//! controller and the node agent: the agent writes its `CSIMigrationAWS` gate into the CSINode
//! `migrated-plugins` annotation and stays NotReady until the annotation says so; for every
//! combination of the agent's and the controller's gate, the backend the agent mounts an in-tree
//! aws-ebs volume with is the one the controller attaches it with (read from the real CSINode the
//! agent wrote), or the controller refuses to attach at all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Env, PATIENCE};
use component_runtime::ObjectCache;
use k8s_openapi::api::core::v1::{AWSElasticBlockStoreVolumeSource, Pod, PodSpec, Volume};
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::api::{Patch, PatchParams};
use node_agent::volumemanager::volume_spec::{
    MountKind, SpecContext, SpecOutcome, volume_to_mount,
};
use serde_json::json;
use volume_plugins::{Backend, MigratedPlugins, NodeMigrationInfo, SkipAttachMode, decide};

const EBS: &str = "kubernetes.io/aws-ebs";
const ANNOTATION: &str = "storage.alpha.kubernetes.io/migrated-plugins";

fn gates(on: bool) -> MigratedPlugins {
    MigratedPlugins::from_feature_gates(&format!("CSIMigrationAWS={on}")).unwrap()
}

async fn node_ready(env: &Env, node: &str) -> Option<(bool, String)> {
    let n = env.nodes_api().get_opt(node).await.ok()??;
    let c = n
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status == "True", c.message.unwrap_or_default()))
}

/// What the agent mounts an inline in-tree EBS volume with, under its gates.
fn agent_backend(own: &MigratedPlugins) -> &'static str {
    let volume = Volume {
        name: "ebs".into(),
        aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
            volume_id: "vol-0123456789abcdef0".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = Pod {
        spec: Some(PodSpec {
            volumes: Some(vec![volume.clone()]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (pvcs, pvs) = (ObjectCache::from_objects([]), ObjectCache::from_objects([]));
    let csidrivers = ObjectCache::from_objects([]);
    let ctx = SpecContext {
        pvcs: &pvcs,
        pvs: &pvs,
        csidrivers: &csidrivers,
        migrated: own,
        first_seen: None,
    };
    match volume_to_mount(&ctx, &pod, &volume) {
        SpecOutcome::Mount(v) => match v.kind {
            MountKind::AwsEbs { .. } => "in-tree",
            MountKind::Csi(c) if c.migrated && c.driver == "ebs.csi.aws.com" => "csi",
            MountKind::Csi(_) => "csi, not marked migrated",
        },
        other => panic!("the agent must mount it: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_and_controller_pick_one_backend_for_every_row() {
    if !common::can_mount() {
        return;
    }
    for agent_on in [false, true] {
        let mut env = Env::new().await;
        let n = env.add_node("node-a").await;
        let mut options = env.agent_options(n, SkipAttachMode::BypassAdc);
        options.migrated = gates(agent_on);
        env.start_agent(n, options);
        let csinodes: Api<CSINode> = Api::all(env.kube.clone());
        let csinode =
            test_support::eventually("the CSINode with the annotation", PATIENCE, || async {
                let c = csinodes.get_opt("node-a").await.ok()??;
                let value = c.metadata.annotations.clone()?.get(ANNOTATION).cloned()?;
                Some((c, value))
            })
            .await;
        assert_eq!(
            csinode.1.contains(EBS),
            agent_on,
            "annotation {:?}",
            csinode.1
        );
        test_support::eventually("node Ready", PATIENCE, || async {
            node_ready(&env, "node-a").await?.0.then_some(())
        })
        .await;
        // The driver's registration rewrites the annotation too (as the kubelet's does): the
        // tampering below must come after it.
        test_support::eventually("the driver on the CSINode", PATIENCE, || async {
            let c = csinodes.get_opt("node-a").await.ok()??;
            c.spec
                .drivers
                .iter()
                .any(|d| d.name == common::DRIVER)
                .then_some(())
        })
        .await;

        for adc_on in [false, true] {
            let adc = decide(
                EBS,
                &gates(adc_on),
                &NodeMigrationInfo::from_csinode(Some(&csinode.0)),
            );
            let agent = agent_backend(&gates(agent_on));
            match (adc, agent) {
                (Backend::InTree, "in-tree") | (Backend::Csi { .. }, "csi") => {}
                // The controller attaches nothing (and says why); the agent never mounts
                // what the controller attached through the other path.
                (Backend::Refused { reason }, "csi") => {
                    assert!(!adc_on && agent_on, "refused only for ADC off, node on");
                    assert!(reason.contains("CSIMigrationAWS=true"), "{reason}");
                }
                (adc, agent) => panic!(
                    "agent gate {agent_on}, controller gate {adc_on}: the controller picks {adc:?}, the agent {agent}"
                ),
            }
        }

        // A CSINode that says otherwise than the gates makes the node NotReady until it is
        // right again.
        let wrong = if agent_on { "" } else { EBS };
        csinodes
            .patch(
                "node-a",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {ANNOTATION: wrong}}})),
            )
            .await
            .unwrap();
        let (_, message) = test_support::eventually("node NotReady", PATIENCE, || async {
            let (ready, message) = node_ready(&env, "node-a").await?;
            (!ready).then_some(((), message))
        })
        .await;
        assert!(message.contains(ANNOTATION), "{message}");
        csinodes
            .patch(
                "node-a",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {ANNOTATION: csinode.1}}})),
            )
            .await
            .unwrap();
        test_support::eventually("node Ready again", PATIENCE, || async {
            node_ready(&env, "node-a").await?.0.then_some(())
        })
        .await;
        env.shutdown().await;
    }
}
