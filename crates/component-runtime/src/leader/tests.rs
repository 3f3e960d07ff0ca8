//! Leader election against the embedded API server.

use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::mpsc;

fn config(
    identity: &str,
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_name: "external-attacher-leader-test-csi-rs".to_owned(),
        namespace: "kube-system".to_owned(),
        identity: identity.to_owned(),
        lease_duration: lease,
        renew_deadline: renew,
        retry_period: retry,
    }
}

/// The Go sidecars' defaults: with these, only a watch (not the 5 s poll) and a release (not
/// the 15 s expiry) give a sub-2-second handover.
fn go_defaults(identity: &str) -> LeaderElectionConfig {
    config(
        identity,
        Duration::from_secs(15),
        Duration::from_secs(10),
        Duration::from_secs(5),
    )
}

fn fast(identity: &str) -> LeaderElectionConfig {
    config(
        identity,
        Duration::from_secs(4),
        Duration::from_secs(3),
        Duration::from_millis(300),
    )
}

async fn server() -> apiserver::RunningApiServer {
    apiserver::install_crypto_provider();
    apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap()
}

/// One candidate running in a task: reports (identity, Instant) when its work starts.
struct Candidate {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), Error>>,
    health: Health,
    work_cancelled: Arc<AtomicBool>,
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.task.abort();
    }
}

fn spawn_candidate(
    client: kube::Client,
    cfg: LeaderElectionConfig,
    started: mpsc::UnboundedSender<(String, Instant)>,
    leaders: Arc<AtomicUsize>,
    max_leaders: Arc<AtomicUsize>,
) -> Candidate {
    let shutdown = CancellationToken::new();
    let health = Health::default();
    let work_cancelled = Arc::new(AtomicBool::new(false));
    let identity = cfg.identity.clone();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        let health = health.clone();
        let work_cancelled = Arc::clone(&work_cancelled);
        async move {
            run_as_leader_with_health(client, cfg, health, shutdown, move |token| async move {
                let now = leaders.fetch_add(1, Ordering::SeqCst) + 1;
                max_leaders.fetch_max(now, Ordering::SeqCst);
                let _ = started.send((identity, Instant::now()));
                token.cancelled().await;
                work_cancelled.store(true, Ordering::SeqCst);
                leaders.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), String>(())
            })
            .await
        }
    });
    Candidate {
        shutdown,
        task,
        health,
        work_cancelled,
    }
}

async fn holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    leases
        .get("external-attacher-leader-test-csi-rs")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
}

async fn next_leader(rx: &mut mpsc::UnboundedReceiver<(String, Instant)>) -> (String, Instant) {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("a candidate becomes leader")
        .expect("candidates alive")
}

#[tokio::test]
async fn one_leader_at_a_time_and_release_hands_over_within_two_seconds() {
    let server = server().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let leaders = Arc::new(AtomicUsize::new(0));
    let max_leaders = Arc::new(AtomicUsize::new(0));
    let mut candidates: Vec<Option<Candidate>> = ["a", "b", "c"]
        .into_iter()
        .map(|id| {
            Some(spawn_candidate(
                server.client(),
                go_defaults(id),
                tx.clone(),
                Arc::clone(&leaders),
                Arc::clone(&max_leaders),
            ))
        })
        .collect();
    let index = |id: &str| ["a", "b", "c"].iter().position(|x| *x == id).unwrap();

    let mut seen = Vec::new();
    let (first, _) = next_leader(&mut rx).await;
    assert_eq!(
        holder(&server.client()).await.as_deref(),
        Some(first.as_str())
    );
    assert!(
        candidates[index(&first)]
            .as_ref()
            .unwrap()
            .health
            .is_leader()
    );
    seen.push(first.clone());

    // Two handovers: each time the leader shuts down, another one leads within 2 s.
    let mut leader = first;
    for _ in 0..2 {
        let mut candidate = candidates[index(&leader)].take().unwrap();
        let stopped_at = Instant::now();
        candidate.shutdown.cancel();
        let (next, started_at) = next_leader(&mut rx).await;
        let handover = started_at.duration_since(stopped_at);
        assert_ne!(next, leader);
        assert!(
            handover < Duration::from_secs(2),
            "{next} took over {handover:?} after {leader} shut down (Go defaults: 5 s retry, 15 s lease)"
        );
        let result = (&mut candidate.task).await.unwrap();
        assert!(result.is_ok(), "{result:?}");
        assert!(candidate.work_cancelled.load(Ordering::SeqCst));
        assert!(!candidate.health.is_leader());
        seen.push(next.clone());
        leader = next;
    }
    assert_eq!(
        max_leaders.load(Ordering::SeqCst),
        1,
        "never two leaders at once"
    );
    seen.sort();
    assert_eq!(seen, ["a", "b", "c"]);

    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let spec = leases
        .get("external-attacher-leader-test-csi-rs")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(leader.as_str()));
    assert_eq!(spec.lease_transitions, Some(2));
    assert_eq!(spec.lease_duration_seconds, Some(15));

    // The last one releases on shutdown: the Lease is free for anyone.
    let mut last = candidates[index(&leader)].take().unwrap();
    last.shutdown.cancel();
    assert!((&mut last.task).await.unwrap().is_ok());
    let spec = leases
        .get("external-attacher-leader-test-csi-rs")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.holder_identity, None);
    assert_eq!(spec.lease_duration_seconds, Some(1));
    drop(candidates);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_loses_and_its_work_is_cancelled() {
    let server = server().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let leaders = Arc::new(AtomicUsize::new(0));
    let mut a = spawn_candidate(
        server.client(),
        fast("a"),
        tx,
        Arc::clone(&leaders),
        Arc::new(AtomicUsize::new(0)),
    );
    next_leader(&mut rx).await;

    // Someone else writes the Lease: a fresh claim by "thief" (retried if a renewal of the
    // leader slips in between our read and write).
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    loop {
        let mut lease = leases
            .get("external-attacher-leader-test-csi-rs")
            .await
            .unwrap();
        lease.spec = Some(LeaseSpec {
            holder_identity: Some("thief".to_owned()),
            lease_duration_seconds: Some(60),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..lease.spec.clone().unwrap()
        });
        match leases
            .replace(
                "external-attacher-leader-test-csi-rs",
                &PostParams::default(),
                &lease,
            )
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("{e}"),
        }
    }

    let result = tokio::time::timeout(Duration::from_secs(60), &mut a.task)
        .await
        .expect("the leader notices")
        .unwrap();
    match result {
        Err(Error::LostLeadership {
            identity, reason, ..
        }) => {
            assert_eq!(identity, "a");
            assert!(reason.contains("thief"), "{reason}");
        }
        other => panic!("expected LostLeadership, got {other:?}"),
    }
    assert!(
        a.work_cancelled.load(Ordering::SeqCst),
        "the work token was cancelled"
    );
    assert_eq!(leaders.load(Ordering::SeqCst), 0);
    assert!(!a.health.is_leader());
    // A lost leader does not release someone else's Lease.
    assert_eq!(holder(&server.client()).await.as_deref(), Some("thief"));
    drop(a);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_without_waiting_a_lease_duration() {
    let server = server().await;
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let long_ago = Timestamp::now()
        .checked_sub(SignedDuration::from_secs(600))
        .unwrap();
    let ghost = Lease {
        metadata: ObjectMeta {
            name: Some("external-attacher-leader-test-csi-rs".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("ghost".to_owned()),
            lease_duration_seconds: Some(60),
            acquire_time: Some(MicroTime(long_ago)),
            renew_time: Some(MicroTime(long_ago)),
            lease_transitions: Some(4),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &ghost).await.unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    // A 60 s lease: client-go would wait 60 s from its first look; the wall clock says the
    // ghost's claim ran out 9 minutes ago.
    let cfg = config(
        "a",
        Duration::from_secs(60),
        Duration::from_secs(40),
        Duration::from_secs(5),
    );
    let started = Instant::now();
    let a = spawn_candidate(
        server.client(),
        cfg,
        tx,
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (who, at) = next_leader(&mut rx).await;
    assert_eq!(who, "a");
    assert!(at.duration_since(started) < Duration::from_secs(30));
    let spec = leases
        .get("external-attacher-leader-test-csi-rs")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(5));
    drop(a);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_held_lease_is_not_taken_and_shutdown_while_waiting_skips_the_work() {
    let server = server().await;
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let held = Lease {
        metadata: ObjectMeta {
            name: Some("external-attacher-leader-test-csi-rs".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("other".to_owned()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &held).await.unwrap();
    let shutdown = CancellationToken::new();
    let ran = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        let ran = Arc::clone(&ran);
        let client = server.client();
        async move {
            run_as_leader(client, fast("a"), shutdown, move |_token| async move {
                ran.store(true, Ordering::SeqCst);
                Ok::<(), String>(())
            })
            .await
        }
    });
    // Let it try a few times (retry period 300 ms), then stop it.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        assert_eq!(holder(&server.client()).await.as_deref(), Some("other"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(holder(&server.client()).await.as_deref(), Some("other"));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn renewals_failing_past_the_deadline_lose_leadership() {
    let server = server().await;
    let client = server.client();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut a = spawn_candidate(
        client,
        fast("a"),
        tx,
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    next_leader(&mut rx).await;
    // The API server goes away: every renewal fails.
    server.shutdown().await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(60), &mut a.task)
        .await
        .expect("the leader gives up")
        .unwrap();
    match result {
        Err(Error::LostLeadership { reason, .. }) => {
            assert!(reason.contains("renew deadline"), "{reason}");
        }
        other => panic!("expected LostLeadership, got {other:?}"),
    }
    assert!(a.work_cancelled.load(Ordering::SeqCst));
}

#[tokio::test]
async fn work_errors_are_returned_and_the_lease_released() {
    let server = server().await;
    let result = run_as_leader(
        server.client(),
        fast("a"),
        CancellationToken::new(),
        |_token| async { Err::<(), _>("driver went away") },
    )
    .await;
    match result {
        Err(Error::Work(message)) => assert_eq!(message, "driver went away"),
        other => panic!("expected Work, got {other:?}"),
    }
    assert_eq!(holder(&server.client()).await, None, "released");
    server.shutdown().await.unwrap();
}

#[test]
fn inconsistent_durations_are_refused_with_the_flag_names() {
    let mut cfg = go_defaults("a");
    cfg.renew_deadline = Duration::from_secs(20);
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("--leader-election-lease-duration"), "{err}");
    let mut cfg = go_defaults("a");
    cfg.retry_period = Duration::from_secs(10);
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("--leader-election-retry-period"), "{err}");
    let mut cfg = go_defaults("a");
    cfg.identity.clear();
    assert!(cfg.validate().is_err());
    assert!(go_defaults("a").validate().is_ok());
}

#[test]
fn lease_names_as_the_go_sidecars_build_them() {
    assert_eq!(
        lease_name("external-attacher-leader", "ebs.csi.aws.com"),
        "external-attacher-leader-ebs-csi-aws-com"
    );
    assert_eq!(
        lease_name("external-attacher-leader", "example/driver_x"),
        "external-attacher-leader-example-driver-x"
    );
    assert_eq!(lease_name("p", "driver."), "p-driver-X");
}

#[test]
fn identities_are_unique_per_process_start() {
    let a = default_identity();
    let b = default_identity();
    assert_ne!(a, b);
    let (host, suffix) = a.rsplit_once('_').unwrap();
    assert!(!host.is_empty());
    assert_eq!(suffix.len(), 5);
}

#[test]
fn namespace_sources_in_order() {
    assert_eq!(
        namespace_from(Some("ns1".into()), Some("ns2\n".into())),
        "ns1"
    );
    assert_eq!(
        namespace_from(Some(String::new()), Some("ns2\n".into())),
        "ns2"
    );
    assert_eq!(namespace_from(None, Some("  ".into())), "default");
    assert_eq!(namespace_from(None, None), "default");
}
