//! The recorder against the embedded API server.

use super::*;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::api::ListParams;

const NS: &str = "ns-1";
const CREATED: Recorded = Recorded::Created {
    after_failed_patch: false,
};

/// A server with namespace [`NS`] (`default` is there from the start, as in a cluster) and a
/// recorder for component "c".
struct Fixture {
    server: apiserver::RunningApiServer,
    client: Client,
    recorder: EventRecorder,
}

impl Fixture {
    async fn new() -> Self {
        apiserver::install_crypto_provider();
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let client = server.client();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        server.audit_clear();
        let recorder = EventRecorder::new(client.clone(), "c");
        Self {
            server,
            client,
            recorder,
        }
    }

    /// A Warning with `reason` and `message` on `involved`, in [`NS`].
    async fn warn(&self, involved: &ObjectReference, reason: &str, message: &str) -> Recorded {
        self.recorder
            .record(NS, involved.clone(), EventType::Warning, reason, message)
            .await
    }

    /// The Events in `namespace`, by name.
    async fn events(&self, namespace: &str) -> Vec<Event> {
        let mut list = Api::<Event>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        list.sort_by_key(|e| e.metadata.name.clone());
        list
    }

    /// The verbs of the Event writes the server saw, in order.
    fn event_writes(&self) -> Vec<String> {
        self.server
            .audit()
            .into_iter()
            .filter(|r| r.resource == "events" && r.verb != "list")
            .map(|r| r.verb.to_string())
            .collect()
    }
}

fn pod(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(NS.into()),
        name: Some(name.into()),
        uid: uid.map(str::to_string),
        ..Default::default()
    }
}

#[tokio::test]
async fn creates_an_event_as_client_go_does() {
    let f = Fixture::new().await;
    let involved = pod("web-0", Some("uid-1"));

    assert_eq!(f.warn(&involved, "FailedThing", "it broke").await, CREATED);

    let list = f.events(NS).await;
    assert_eq!(list.len(), 1, "{list:?}");
    let e = &list[0];
    let name = e.metadata.name.as_deref().unwrap();
    assert!(name.starts_with("web-0."), "{name}");
    assert_eq!(e.involved_object, involved);
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reason.as_deref(), Some("FailedThing"));
    assert_eq!(e.message.as_deref(), Some("it broke"));
    assert_eq!(e.count, Some(1));
    assert!(e.first_timestamp.is_some());
    assert_eq!(e.first_timestamp, e.last_timestamp);
    let source = e.source.as_ref().unwrap();
    assert_eq!(source.component.as_deref(), Some("c"));
    assert_eq!(source.host, None);
    assert_eq!(e.reporting_component.as_deref(), Some("c"));
    assert_eq!(e.reporting_instance.as_deref(), Some("c"));
    assert_eq!(f.event_writes(), ["create"]);
}

#[tokio::test]
async fn a_repeat_bumps_count_and_last_timestamp_of_the_first_event() {
    let f = Fixture::new().await;
    let involved = pod("web-0", Some("uid-1"));
    let normal = || {
        f.recorder
            .record(NS, involved.clone(), EventType::Normal, "R", "same")
    };

    assert_eq!(normal().await, CREATED);
    let first = f.events(NS).await.remove(0);
    assert_eq!(first.type_.as_deref(), Some("Normal"));
    // Event times have a resolution of a second on the wire: make the bump visible.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(normal().await, Recorded::Patched);
    assert_eq!(normal().await, Recorded::Patched);

    let list = f.events(NS).await;
    assert_eq!(list.len(), 1, "{list:?}");
    let e = &list[0];
    assert_eq!(e.metadata.name, first.metadata.name);
    assert_eq!(e.count, Some(3));
    assert_eq!(e.first_timestamp, first.first_timestamp);
    assert!(
        e.last_timestamp > first.last_timestamp,
        "{:?} after {:?}",
        e.last_timestamp,
        first.last_timestamp
    );
    assert_eq!(f.event_writes(), ["create", "patch", "patch"]);
}

#[tokio::test]
async fn another_reason_message_or_object_is_another_event() {
    let f = Fixture::new().await;
    let web0 = pod("web-0", Some("uid-0"));
    let web1 = pod("web-1", Some("uid-1"));
    for (involved, reason, message) in [
        (&web0, "R", "m"),
        (&web0, "R", "other message"),
        (&web0, "Other", "m"),
        (&web1, "R", "m"),
    ] {
        let got = f.warn(involved, reason, message).await;
        assert_eq!(got, CREATED, "{reason} {message}");
    }
    let list = f.events(NS).await;
    assert_eq!(list.len(), 4, "{list:?}");
    assert!(list.iter().all(|e| e.count == Some(1)), "{list:?}");
}

#[tokio::test]
async fn the_event_goes_to_the_namespace_asked_for() {
    let f = Fixture::new().await;
    // A cluster-scoped object: its Events go to `default`, as client-go puts them.
    let node = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some("node-1".into()),
        uid: Some("node-uid".into()),
        ..Default::default()
    };
    for _ in 0..2 {
        f.recorder
            .record("default", node.clone(), EventType::Warning, "R", "m")
            .await;
    }
    let list = f.events("default").await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].count, Some(2));
    assert_eq!(list[0].involved_object, node);
    assert!(f.events(NS).await.is_empty());
}

#[tokio::test]
async fn forget_makes_the_next_repeat_a_new_event() {
    let f = Fixture::new().await;
    let web0 = pod("web-0", Some("uid-0"));
    let web1 = pod("web-1", Some("uid-1"));
    f.warn(&web0, "R", "m").await;
    f.warn(&web1, "R", "m").await;
    f.recorder.forget("uid-0");
    assert_eq!(f.warn(&web0, "R", "m").await, CREATED);
    // Only the forgotten object's memory is gone.
    assert_eq!(f.warn(&web1, "R", "m").await, Recorded::Patched);
    assert_eq!(f.events(NS).await.len(), 3);
}

#[tokio::test]
async fn objects_without_uid_are_remembered_by_name_and_retain_forgets_them() {
    let f = Fixture::new().await;
    let no_uid = pod("web-0", None);
    let with_uid = pod("web-1", Some("uid-1"));
    f.warn(&no_uid, "R", "m").await;
    f.warn(&with_uid, "R", "m").await;
    assert_eq!(f.warn(&no_uid, "R", "m").await, Recorded::Patched);

    // The UID, or the name without one, is what `retain` sees.
    let mut asked = Vec::new();
    f.recorder.retain(|id| {
        asked.push(id.to_string());
        id == "uid-1"
    });
    asked.sort();
    assert_eq!(asked, ["uid-1", "web-0"]);
    assert_eq!(f.warn(&no_uid, "R", "m").await, CREATED);
    assert_eq!(f.warn(&with_uid, "R", "m").await, Recorded::Patched);
}

#[tokio::test]
async fn a_deleted_event_is_created_again() {
    let f = Fixture::new().await;
    let web0 = pod("web-0", Some("uid-0"));
    f.warn(&web0, "R", "m").await;
    let first = f.events(NS).await.remove(0);
    Api::<Event>::namespaced(f.client.clone(), NS)
        .delete(first.metadata.name.as_deref().unwrap(), &Default::default())
        .await
        .unwrap();
    f.server.audit_clear();

    let got = f.warn(&web0, "R", "m").await;
    assert_eq!(
        got,
        Recorded::Created {
            after_failed_patch: true
        }
    );
    assert_eq!(f.event_writes(), got.writes());
    let list = f.events(NS).await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].count, Some(1));
    // The new Event is the one repeats bump from now on.
    assert_eq!(f.warn(&web0, "R", "m").await, Recorded::Patched);
    assert_eq!(f.events(NS).await[0].count, Some(2));
}

#[tokio::test]
async fn failures_are_reported_not_returned_as_errors() {
    let Fixture {
        server, recorder, ..
    } = Fixture::new().await;
    let web0 = pod("web-0", Some("uid-0"));
    let web1 = pod("web-1", Some("uid-1"));
    let warn = |involved: &ObjectReference| {
        recorder.record(NS, involved.clone(), EventType::Warning, "R", "m")
    };
    warn(&web0).await;
    server.shutdown().await.unwrap();

    // A remembered Event: the patch fails, then the create.
    assert_eq!(
        warn(&web0).await,
        Recorded::Failed {
            after_failed_patch: true
        }
    );
    // A failed create is not remembered: the next try creates again.
    for _ in 0..2 {
        assert_eq!(
            warn(&web1).await,
            Recorded::Failed {
                after_failed_patch: false
            }
        );
    }
}

#[test]
fn writes_name_the_requests_in_order() {
    assert_eq!(Recorded::Patched.writes(), ["patch"]);
    for after_failed_patch in [false, true] {
        let want: &[&str] = if after_failed_patch {
            &["patch", "create"]
        } else {
            &["create"]
        };
        assert_eq!(Recorded::Created { after_failed_patch }.writes(), want);
        assert_eq!(Recorded::Failed { after_failed_patch }.writes(), want);
    }
}
