use super::*;
use serde_json::json;

fn node(ready: bool, taint: bool) -> Node {
    let taints = if taint {
        json!([{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "n"},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    }))
    .expect("node")
}

#[test]
fn forced_detach_rules() {
    let ready = node(true, false);
    let not_ready = node(false, false);
    let tainted = node(true, true);
    // (node, waited out, disabled) → force
    let rows: [(Option<&Node>, bool, bool, bool); 8] = [
        (Some(&ready), false, false, false),
        (Some(&ready), true, false, false),
        (Some(&not_ready), false, false, false),
        (Some(&not_ready), true, false, true),
        (Some(&not_ready), true, true, false),
        (None, true, false, true),
        (Some(&tainted), false, false, true),
        (Some(&tainted), false, true, true),
    ];
    for (i, (n, waited, disabled, want)) in rows.into_iter().enumerate() {
        assert_eq!(force_detach(n, waited, disabled), want, "row {i}");
    }
}

#[test]
fn detach_waits_for_the_node_and_is_verified_unless_forced() {
    let ready = node(true, false);
    let not_ready = node(false, false);
    let tainted = node(true, true);
    let normal = Some(DetachMode {
        forced: false,
        verify_safe: true,
    });
    let forced = Some(DetachMode {
        forced: true,
        verify_safe: false,
    });
    // Not mounted, force allowed: no in-use check (the detach would go ahead anyway).
    let unchecked = Some(DetachMode {
        forced: false,
        verify_safe: false,
    });
    // (mounted per cache, node, waited out, disabled) → mode
    type Row<'a> = (bool, Option<&'a Node>, bool, bool, Option<DetachMode>);
    let rows: [Row; 12] = [
        (true, Some(&ready), false, false, None),
        (true, Some(&ready), true, false, None),
        (false, Some(&ready), false, false, normal),
        // A Ready node's volume is checked against the API server also after the wait
        // (Kubernetes v1.26 skips the check once the wait is over).
        (false, Some(&ready), true, false, normal),
        (true, Some(&not_ready), false, false, None),
        (true, Some(&not_ready), true, false, forced),
        (true, Some(&not_ready), true, true, None),
        (false, Some(&not_ready), true, true, normal),
        (false, Some(&not_ready), true, false, unchecked),
        (true, None, true, false, forced),
        (true, Some(&tainted), false, true, forced),
        (false, Some(&tainted), false, false, unchecked),
    ];
    for (i, (mounted, n, waited, disabled, want)) in rows.into_iter().enumerate() {
        assert_eq!(detach_mode(mounted, n, waited, disabled), want, "row {i}");
    }
}

/// Whole passes over a fixed cluster, acting through [`Fake`]: the reads come from caches built
/// from objects, the writes are recorded. The client in the context points nowhere; nothing in
/// a pass may use it (a pass that did would fail these tests by hanging on no reply, or by an
/// error the fake never sees).
mod passes {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use component_runtime::ObjectCache;
    use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
    use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
    use prometheus_client::registry::Registry;
    use serde_json::{Value, json};
    use volume_plugins::names::volume_attachment_name;
    use volume_plugins::{CsiPlugin, SkipAttachMode};

    use super::super::{Effects, Reconciler};
    use crate::Error;
    use crate::cache::{Attachment, DetachHow, PodRef, VolumeToAttach};
    use crate::config::Options;
    use crate::context::{Caches, Ctx};
    use crate::events::{EventRecorder, FAILED_ATTACH, FORCED_DETACH};
    use crate::in_tree::InTree;
    use crate::metrics::Metrics;
    use crate::statusupdater::Reported;

    const DRIVER: &str = "hostpath.csi.k8s.io";
    const VOLUME: &str = "kubernetes.io/csi/hostpath.csi.k8s.io^h1";

    /// What the pass asked of the world, in order.
    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Attach { node: String },
        Detach { node: String, verify_safe: bool },
        Status { node: String, volumes: Vec<String> },
        PodWarning { pod: String, reason: String },
        NodeWarning { node: String, reason: String },
    }

    /// Records every call; refuses the status write of the nodes in `refuse`.
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<Call>>,
        refuse: Mutex<BTreeSet<String>>,
    }

    impl Fake {
        fn push(&self, c: Call) {
            self.calls.lock().unwrap().push(c);
        }

        fn take(&self) -> Vec<Call> {
            std::mem::take(&mut self.calls.lock().unwrap())
        }
    }

    impl Effects for Fake {
        fn start_attach(&mut self, _volume: VolumeToAttach, node: String, _pods: Vec<PodRef>) {
            self.push(Call::Attach { node });
        }

        fn start_detach(&mut self, _v: String, node: String, _a: Attachment, verify_safe: bool) {
            self.push(Call::Detach { node, verify_safe });
        }

        async fn patch_status(&self, node: &str, reported: &Reported) -> Result<Node, Error> {
            self.push(Call::Status {
                node: node.into(),
                volumes: reported.iter().map(|(v, _)| v.clone()).collect(),
            });
            if self.refuse.lock().unwrap().contains(node) {
                return Err(Error::Config("refused by the test".into()));
            }
            Ok(serde_json::from_value(
                json!({"metadata": {"name": node, "uid": format!("uid-{node}")}}),
            )
            .unwrap())
        }

        async fn pod_warning(&self, pod: &PodRef, reason: &str, _message: &str) {
            self.push(Call::PodWarning {
                pod: pod.name.clone(),
                reason: reason.into(),
            });
        }

        async fn node_warning(&self, node: &str, _uid: Option<String>, reason: &str, _m: &str) {
            self.push(Call::NodeWarning {
                node: node.into(),
                reason: reason.into(),
            });
        }

        fn success_events(&mut self, _events: Vec<(Vec<PodRef>, String)>) {}
    }

    /// A managed node; `in_use`: its `status.volumesInUse` holds the volume.
    fn node(name: &str, ready: bool, in_use: bool) -> Node {
        let in_use: Vec<&str> = if in_use { vec![VOLUME] } else { vec![] };
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                "annotations": {crate::CONTROLLER_MANAGED_ANNOTATION: "true"}},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "volumesInUse": in_use
            }
        }))
        .unwrap()
    }

    fn pod(name: &str, node: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c1"}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    fn object<K: serde::de::DeserializeOwned>(v: Value) -> K {
        serde_json::from_value(v).unwrap()
    }

    /// A cluster of `nodes` and `pods` with one RWO CSI volume (claim c1, handle h1),
    /// VolumeAttachments attached on `attached_on`, and the context of a controller whose
    /// actual state has the volume attached there.
    fn cluster(nodes: Vec<Node>, pods: Vec<Pod>, attached_on: &[&str], options: Options) -> Ctx {
        let vas: Vec<VolumeAttachment> = attached_on
            .iter()
            .map(|n| {
                object(json!({
                    "metadata": {"name": volume_attachment_name("h1", DRIVER, n)},
                    "spec": {"attacher": DRIVER, "nodeName": n, "source": {"persistentVolumeName": "pv1"}},
                    "status": {"attached": true}
                }))
            })
            .collect();
        let caches = Caches {
            pods: ObjectCache::from_objects(pods),
            nodes: ObjectCache::from_objects(nodes),
            pvs: ObjectCache::from_objects([object::<PersistentVolume>(json!({
                "metadata": {"name": "pv1"},
                "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                    "csi": {"driver": DRIVER, "volumeHandle": "h1"},
                    "claimRef": {"namespace": "default", "name": "c1", "uid": "uid-c1"}},
                "status": {"phase": "Bound"}
            }))]),
            pvcs: ObjectCache::from_objects([object::<PersistentVolumeClaim>(json!({
                "metadata": {"name": "c1", "namespace": "default", "uid": "uid-c1"},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv1",
                    "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Bound"}
            }))]),
            csidrivers: ObjectCache::from_objects([object::<CSIDriver>(json!({
                "metadata": {"name": DRIVER}, "spec": {"attachRequired": true}
            }))]),
            csinodes: ObjectCache::from_objects([]),
            vas: ObjectCache::from_objects(vas),
        };
        // Nothing listens there: a pass that wrote through the client instead of the effects
        // would fail.
        component_runtime::install_crypto_provider();
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let metrics = Arc::new(Metrics::register(&mut Registry::default()));
        let csi = CsiPlugin::new(
            client.clone(),
            caches.csidrivers.clone(),
            caches.vas.clone(),
            SkipAttachMode::default(),
        );
        let ctx = Ctx::new(
            EventRecorder::new(client.clone(), metrics.clone()),
            client,
            caches,
            csi,
            InTree::new(None),
            options,
            metrics,
        );
        for n in attached_on {
            let how = DetachHow::Csi {
                driver: DRIVER.into(),
                handle: "h1".into(),
            };
            ctx.state()
                .asw
                .mark_attached(VOLUME, n, Attachment::new(how, String::new(), true));
        }
        ctx
    }

    /// `--max-wait-for-unmount` over at once: only the node's state decides a detach.
    fn no_wait() -> Options {
        Options {
            max_wait_for_unmount: Duration::ZERO,
            ..Options::default()
        }
    }

    async fn passes(ctx: &Ctx, fake: &mut Fake, n: usize) -> Vec<Call> {
        let mut r = Reconciler::new(ctx);
        for _ in 0..n {
            r.pass(ctx, fake).await;
        }
        fake.take()
    }

    #[tokio::test]
    async fn a_wanted_volume_is_attached_once_while_its_attach_runs() {
        let ctx = cluster(
            vec![node("a", true, false)],
            vec![pod("p1", "a")],
            &[],
            no_wait(),
        );
        let calls = passes(&ctx, &mut Fake::default(), 3).await;
        assert_eq!(calls, vec![Call::Attach { node: "a".into() }]);
    }

    #[tokio::test]
    async fn a_volume_a_ready_node_still_uses_is_never_detached() {
        // No pod wants it any more, the wait for unmount is over, but the node is Ready and
        // lists it in volumesInUse: it stays (Kubernetes 1.26+ never force-detaches from a
        // healthy node).
        let ctx = cluster(vec![node("a", true, true)], vec![], &["a"], no_wait());
        let calls = passes(&ctx, &mut Fake::default(), 5).await;
        assert!(
            !calls.iter().any(|c| matches!(c, Call::Detach { .. })),
            "{calls:?}"
        );
        assert!(ctx.state().asw.get(VOLUME, "a").is_some());
    }

    #[tokio::test]
    async fn a_volume_no_longer_used_is_detached_after_the_status_without_it() {
        let ctx = cluster(vec![node("a", true, false)], vec![], &["a"], no_wait());
        let calls = passes(&ctx, &mut Fake::default(), 1).await;
        assert_eq!(
            calls,
            vec![
                Call::Status {
                    node: "a".into(),
                    volumes: vec![]
                },
                Call::Detach {
                    node: "a".into(),
                    verify_safe: true
                },
            ]
        );
    }

    #[tokio::test]
    async fn no_detach_starts_while_the_node_status_cannot_be_written() {
        let ctx = cluster(vec![node("a", true, false)], vec![], &["a"], no_wait());
        let mut fake = Fake::default();
        fake.refuse.lock().unwrap().insert("a".into());
        let mut r = Reconciler::new(&ctx);
        for _ in 0..3 {
            r.pass(&ctx, &mut fake).await;
        }
        let calls = fake.take();
        assert!(
            !calls.iter().any(|c| matches!(c, Call::Detach { .. })),
            "{calls:?}"
        );
        assert!(calls.iter().any(|c| matches!(c, Call::Status { .. })));
        // The volume is still attached, reported again, and nothing is left running.
        {
            let state = ctx.state();
            let a = state.asw.get(VOLUME, "a").expect("still attached");
            assert!(a.report);
            assert!(!state.ops.busy(VOLUME, "a", false));
        }
        // Once the write goes through, the detach follows it.
        fake.refuse.lock().unwrap().clear();
        r.pass(&ctx, &mut fake).await;
        let calls = fake.take();
        let status = calls.iter().position(|c| matches!(c, Call::Status { .. }));
        let detach = calls.iter().position(|c| {
            *c == Call::Detach {
                node: "a".into(),
                verify_safe: true,
            }
        });
        assert!(
            status.is_some() && detach.is_some() && status < detach,
            "{calls:?}"
        );
    }

    #[tokio::test]
    async fn a_not_ready_node_loses_the_volume_it_uses_after_the_wait_with_a_warning() {
        let ctx = cluster(vec![node("a", false, true)], vec![], &["a"], no_wait());
        let calls = passes(&ctx, &mut Fake::default(), 1).await;
        assert!(calls.contains(&Call::NodeWarning {
            node: "a".into(),
            reason: FORCED_DETACH.into()
        }));
        assert!(calls.contains(&Call::Detach {
            node: "a".into(),
            verify_safe: false
        }));
        // With the wait not over, the same node keeps it.
        let ctx = cluster(
            vec![node("a", false, true)],
            vec![],
            &["a"],
            Options::default(),
        );
        let calls = passes(&ctx, &mut Fake::default(), 3).await;
        assert!(
            !calls.iter().any(|c| matches!(c, Call::Detach { .. })),
            "{calls:?}"
        );
    }

    #[tokio::test]
    async fn a_second_node_is_refused_a_single_node_volume_and_told_once() {
        // In use on a (its pod is going), wanted on b: not attached to b, one Warning.
        let ctx = cluster(
            vec![node("a", true, true), node("b", true, false)],
            vec![pod("p2", "b")],
            &["a"],
            no_wait(),
        );
        let calls = passes(&ctx, &mut Fake::default(), 4).await;
        assert!(
            !calls.iter().any(|c| matches!(c, Call::Attach { .. })),
            "{calls:?}"
        );
        let warnings: Vec<&Call> = calls
            .iter()
            .filter(|c| matches!(c, Call::PodWarning { .. }))
            .collect();
        assert_eq!(
            warnings,
            vec![&Call::PodWarning {
                pod: "p2".into(),
                reason: FAILED_ATTACH.into()
            }]
        );
    }
}
