//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's rules and two
//! improvements the Go sidecars' operators ask for.
//!
//! Rules (client-go `leaderelection` with a `LeaseLock`):
//! - A candidate takes the Lease when it has no holder, or its holder has not renewed for the
//!   lease duration. Writes are PUTs carrying the observed `resourceVersion`, so of two
//!   candidates exactly one wins (the other gets 409 Conflict).
//! - The leader renews every `retry_period`; if no renewal succeeds for `renew_deadline` it has
//!   lost the lease. Seeing another holder on the Lease also means it has lost it.
//! - On shutdown the leader releases the Lease (client-go's `ReleaseOnCancel`): holder cleared,
//!   duration 1 s, so any candidate may take it at once.
//!
//! Improvements:
//! - Candidates **watch** the Lease between attempts instead of only polling every
//!   `retry_period`, so a released Lease is taken within a round trip, not up to 5 s later.
//! - A Lease whose `renewTime + leaseDurationSeconds` lies in the past is taken at once, even by
//!   a candidate that just started (client-go first waits a full lease duration from its own
//!   first observation). A holder whose record has not changed for the lease duration, by this
//!   process's monotonic clock, is expired as well, which covers a holder with a clock behind
//!   ours.
//!
//! kube-lease-manager was not used: it writes Leases with server-side apply and strategic merge
//! patches, which our components never do, and does not release on shutdown the way client-go
//! does.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Error;
use telemetry::Health;

/// Where and as whom to elect.
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// Name of the Lease (see [`lease_name`]).
    pub lease_name: String,
    /// Namespace of the Lease (see [`default_namespace`]).
    pub namespace: String,
    /// This candidate's identity, written to `holderIdentity` (see [`default_identity`]).
    pub identity: String,
    /// How long a holder's claim lasts without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up.
    pub renew_deadline: Duration,
    /// Pause between renewals, and between a candidate's attempts when nothing changes.
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// client-go's checks: lease duration > renew deadline > retry period > 0.
    fn validate(&self) -> Result<(), Error> {
        let fail = |m: String| Err(Error::LeaderConfig(m));
        if self.lease_name.is_empty() {
            return fail("the lease name is empty".to_owned());
        }
        if self.namespace.is_empty() {
            return fail("the lease namespace is empty".to_owned());
        }
        if self.identity.is_empty() {
            return fail("the identity is empty".to_owned());
        }
        if self.retry_period.is_zero() {
            return fail("--leader-election-retry-period must be greater than zero".to_owned());
        }
        if self.renew_deadline <= self.retry_period {
            return fail(format!(
                "--leader-election-renew-deadline ({:?}) must be greater than --leader-election-retry-period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return fail(format!(
                "--leader-election-lease-duration ({:?}) must be greater than --leader-election-renew-deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.lease_duration.as_secs() > i32::MAX as u64 {
            return fail("--leader-election-lease-duration is too long".to_owned());
        }
        Ok(())
    }

    /// `leaseDurationSeconds`: whole seconds, at least 1.
    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// Go's `SanitizeDriverName`: every character outside `[a-zA-Z0-9-]` becomes `-`, and a
/// trailing `-` (or an empty name) gets an `X` appended, since a qualified name must end
/// alphanumeric. Lease names and the attacher's finalizer are built from it.
pub fn sanitize_driver_name(driver: &str) -> String {
    let mut name: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.is_empty() || name.ends_with('-') {
        name.push('X');
    }
    name
}

/// The Lease name the Go sidecars use: `prefix-<sanitized driver>`.
/// `("external-attacher-leader", "ebs.csi.aws.com")` → `external-attacher-leader-ebs-csi-aws-com`.
pub fn lease_name(prefix: &str, driver_name: &str) -> String {
    sanitize_driver_name(&format!("{prefix}-{driver_name}"))
}

/// `hostname_suffix`: the host (the pod name in Kubernetes) plus a short random suffix, so two
/// processes on one host never share an identity.
pub fn default_identity() -> String {
    use rand::Rng;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "unknown-host".to_owned());
    let suffix: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(5)
        .map(|b| char::from(b).to_ascii_lowercase())
        .collect();
    format!("{host}_{suffix}")
}

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The namespace the Go sidecars default to: `$POD_NAMESPACE`, else the service account's
/// namespace file, else `default`.
pub fn default_namespace() -> String {
    namespace_from(
        std::env::var("POD_NAMESPACE").ok(),
        std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok(),
    )
}

fn namespace_from(env: Option<String>, file: Option<String>) -> String {
    env.map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .or_else(|| file.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()))
        .unwrap_or_else(|| "default".to_owned())
}

/// Waits to lead, then runs `work` until shutdown or lost leadership.
///
/// - `shutdown` before leading: returns `Ok(())` without running `work`.
/// - `shutdown` while leading: cancels `work`'s token, keeps renewing until `work` returns,
///   then releases the Lease and returns `Ok(())` (or `work`'s error as [`Error::Work`]).
/// - Leadership lost: cancels the token, waits for `work`, returns [`Error::LostLeadership`].
///   Like the Go sidecars, a caller should then exit: its caches may be stale.
/// - `work` returning by itself: the Lease is released and its result returned.
pub async fn run_as_leader<F, Fut, E>(
    client: kube::Client,
    cfg: LeaderElectionConfig,
    shutdown: CancellationToken,
    work: F,
) -> Result<(), Error>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    run_as_leader_with_health(client, cfg, Health::default(), shutdown, work).await
}

/// [`run_as_leader`], reporting leadership and renewals to `health` (for
/// `/healthz/leader-election` and the `leader_election_master_status` gauge).
pub async fn run_as_leader_with_health<F, Fut, E>(
    client: kube::Client,
    cfg: LeaderElectionConfig,
    health: Health,
    shutdown: CancellationToken,
    work: F,
) -> Result<(), Error>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    cfg.validate()?;
    health.set_lease_duration(cfg.lease_duration);
    let mut elector = Elector::new(client, cfg);
    tracing::info!(
        lease = %elector.cfg.lease_name,
        namespace = %elector.cfg.namespace,
        identity = %elector.cfg.identity,
        "waiting to acquire the leader lease"
    );
    if !elector.acquire(&shutdown).await {
        return Ok(());
    }
    tracing::info!(lease = %elector.cfg.lease_name, identity = %elector.cfg.identity, "became leader");
    health.set_leader(true);

    let token = CancellationToken::new();
    let work_future = work(token.clone());
    tokio::pin!(work_future);
    let outcome = {
        let renewer = elector.keep_renewing(&health);
        tokio::pin!(renewer);
        loop {
            tokio::select! {
                result = &mut work_future => break Outcome::WorkDone(result),
                reason = &mut renewer => break Outcome::Lost(reason),
                () = shutdown.cancelled(), if !token.is_cancelled() => {
                    tracing::info!("shutting down: stopping the work, then releasing the lease");
                    token.cancel();
                }
            }
        }
    };
    match outcome {
        Outcome::Lost(reason) => {
            health.set_leader(false);
            token.cancel();
            tracing::error!(lease = %elector.cfg.lease_name, %reason, "lost leadership; stopping the work");
            let _ = work_future.await;
            Err(Error::LostLeadership {
                namespace: elector.cfg.namespace.clone(),
                name: elector.cfg.lease_name.clone(),
                identity: elector.cfg.identity.clone(),
                reason,
            })
        }
        Outcome::WorkDone(result) => {
            token.cancel();
            elector.release().await;
            health.set_leader(false);
            result.map_err(|e| Error::Work(e.to_string()))
        }
    }
}

enum Outcome<E> {
    WorkDone(Result<(), E>),
    Lost(String),
}

/// What one acquisition attempt found.
enum Attempt {
    /// We hold the Lease now.
    Acquired,
    /// Someone else holds it (or won a race); try again after a change or `wait`.
    Held {
        holder: String,
        resource_version: String,
        wait: Duration,
    },
}

struct Elector {
    api: Api<Lease>,
    cfg: LeaderElectionConfig,
    /// The Lease as last written by us (while leading) or read (while waiting).
    current: Option<Lease>,
    /// Holder and renew time last seen, and when (our clock) they last changed.
    observed: Option<(Option<String>, Option<Timestamp>)>,
    observed_at: Instant,
}

impl Elector {
    fn new(client: kube::Client, cfg: LeaderElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            current: None,
            observed: None,
            observed_at: Instant::now(),
        }
    }

    /// Loops until we hold the Lease (true) or shutdown (false).
    async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        loop {
            if shutdown.is_cancelled() {
                return false;
            }
            let attempt = tokio::select! {
                a = self.try_acquire_or_renew() => a,
                () = shutdown.cancelled() => return false,
            };
            match attempt {
                Ok(Attempt::Acquired) => return true,
                Ok(Attempt::Held {
                    holder,
                    resource_version,
                    wait,
                }) => {
                    tracing::debug!(%holder, ?wait, "the lease is held by another candidate");
                    tokio::select! {
                        () = self.wait_for_change(&resource_version, wait) => {}
                        () = shutdown.cancelled() => return false,
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.cfg.lease_name, error = %e, "cannot acquire the leader lease; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(self.cfg.retry_period) => {}
                        () = shutdown.cancelled() => return false,
                    }
                }
            }
        }
    }

    /// client-go's `tryAcquireOrRenew`: read, decide, write with the read resourceVersion.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, Error> {
        let name = self.cfg.lease_name.clone();
        let existing = self
            .api
            .get_opt(&name)
            .await
            .map_err(|e| self.kube_err("reading", e))?;
        let Some(lease) = existing else {
            let created = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.claim(None)),
            };
            return match self.api.create(&PostParams::default(), &created).await {
                Ok(lease) => {
                    self.current = Some(lease);
                    Ok(Attempt::Acquired)
                }
                // Another candidate created it first: read it again at once.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Held {
                    holder: String::new(),
                    resource_version: String::new(),
                    wait: Duration::ZERO,
                }),
                Err(e) => Err(self.kube_err("creating", e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        self.observe(&spec);
        if !holder.is_empty() && holder != self.cfg.identity {
            let remaining = self.remaining_validity(&spec);
            if !remaining.is_zero() {
                return Ok(Attempt::Held {
                    holder,
                    resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
                    wait: remaining.min(self.cfg.retry_period),
                });
            }
            tracing::info!(%holder, "the leader lease expired; taking it over");
        }
        let mut claimed = lease;
        claimed.spec = Some(self.claim(Some(&spec)));
        match self
            .api
            .replace(&name, &PostParams::default(), &claimed)
            .await
        {
            Ok(lease) => {
                self.current = Some(lease);
                Ok(Attempt::Acquired)
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(Attempt::Held {
                holder,
                resource_version: String::new(),
                wait: Duration::ZERO,
            }),
            Err(e) => Err(self.kube_err("updating", e)),
        }
    }

    /// The spec that claims (or renews) the Lease for us, given the current one.
    fn claim(&self, old: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let ours = old.is_some_and(|s| s.holder_identity.as_deref() == Some(&self.cfg.identity));
        let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(self.cfg.lease_seconds()),
            acquire_time: if ours {
                old.and_then(|s| s.acquire_time.clone())
                    .or_else(|| Some(now.clone()))
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(match old {
                // A new Lease starts at 0; a change of holder counts one transition.
                None => 0,
                Some(_) if ours => transitions,
                Some(_) => transitions.saturating_add(1),
            }),
            ..old.cloned().unwrap_or_default()
        }
    }

    /// Remembers when the holder's record last changed, by our monotonic clock.
    fn observe(&mut self, spec: &LeaseSpec) {
        let record = (
            spec.holder_identity.clone(),
            spec.renew_time.as_ref().map(|t| t.0),
        );
        if self.observed.as_ref() != Some(&record) {
            self.observed = Some(record);
            self.observed_at = Instant::now();
        }
    }

    /// How long the current holder's claim still stands (zero: expired). Expired when either
    /// `renewTime + leaseDurationSeconds` is past by the wall clock, or the record has not
    /// changed for the lease duration by our own clock.
    fn remaining_validity(&self, spec: &LeaseSpec) -> Duration {
        let local = self
            .cfg
            .lease_duration
            .saturating_sub(self.observed_at.elapsed());
        let seconds = spec
            .lease_duration_seconds
            .map_or(self.cfg.lease_duration.as_secs() as i64, i64::from);
        let wall = match &spec.renew_time {
            Some(renewed) => {
                let left = renewed
                    .0
                    .duration_since(Timestamp::now())
                    .saturating_add(SignedDuration::from_secs(seconds));
                Duration::try_from(left).unwrap_or(Duration::ZERO)
            }
            None => Duration::ZERO,
        };
        local.min(wall)
    }

    /// Waits until the Lease changes (watch from `resource_version`) or `max` passes.
    async fn wait_for_change(&self, resource_version: &str, max: Duration) {
        if max.is_zero() {
            return;
        }
        let deadline = Instant::now() + max;
        let watch = async {
            if !resource_version.is_empty() {
                let params = WatchParams::default()
                    .fields(&format!("metadata.name={}", self.cfg.lease_name))
                    .timeout(u32::try_from(max.as_secs().clamp(1, 290)).unwrap_or(290));
                match self.api.watch(&params, resource_version).await {
                    Ok(stream) => {
                        let mut stream = std::pin::pin!(stream);
                        while let Some(event) = stream.next().await {
                            match event {
                                Ok(WatchEvent::Bookmark(_)) => continue,
                                Ok(_) => return,
                                Err(e) => {
                                    tracing::debug!(error = %e, "lease watch failed; polling");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot watch the lease; polling"),
                }
            }
            tokio::time::sleep_until(deadline).await;
        };
        let _ = tokio::time::timeout_at(deadline, watch).await;
    }

    /// Renews every `retry_period`; returns why leadership was lost. Never returns otherwise.
    async fn keep_renewing(&mut self, health: &Health) -> String {
        let mut last_renew = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.retry_period).await;
            let deadline = last_renew + self.cfg.renew_deadline;
            let result = tokio::time::timeout_at(deadline, self.renew()).await;
            match result {
                Ok(Ok(())) => {
                    last_renew = Instant::now();
                    health.lease_renewed();
                    tracing::trace!(lease = %self.cfg.lease_name, "renewed the leader lease");
                }
                Ok(Err(RenewError::Taken(holder))) => {
                    return format!("the lease is now held by {holder:?}");
                }
                Ok(Err(RenewError::Failed(e))) => {
                    tracing::warn!(lease = %self.cfg.lease_name, error = %e, "cannot renew the leader lease");
                }
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                return format!(
                    "no successful renewal within the renew deadline ({:?})",
                    self.cfg.renew_deadline
                );
            }
        }
    }

    /// One renewal: PUT our last written Lease with a fresh renewTime; on a conflict read it
    /// again and renew only if we are still the holder.
    async fn renew(&mut self) -> Result<(), RenewError> {
        if let Some(mut lease) = self.current.clone() {
            let old = lease.spec.clone();
            lease.spec = Some(self.claim(old.as_ref()));
            match self
                .api
                .replace(&self.cfg.lease_name, &PostParams::default(), &lease)
                .await
            {
                Ok(lease) => {
                    self.current = Some(lease);
                    return Ok(());
                }
                // Someone else wrote the Lease (or deleted it): look at it below.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                Err(e) => return Err(RenewError::Failed(self.kube_err("renewing", e))),
            }
        }
        // Like client-go: a Lease that is ours (or free) is renewed, another holder wins.
        match self.try_acquire_or_renew().await {
            Ok(Attempt::Acquired) => Ok(()),
            Ok(Attempt::Held { holder, .. }) if !holder.is_empty() => {
                Err(RenewError::Taken(holder))
            }
            Ok(Attempt::Held { .. }) => Err(RenewError::Failed(Error::LeaderConfig(
                "the lease changed under us; retrying".to_owned(),
            ))),
            Err(e) => Err(RenewError::Failed(e)),
        }
    }

    /// client-go's release: holder cleared, duration 1 s, so anyone may take it now. Only if
    /// we still hold it; failures are logged (the Lease then expires normally).
    async fn release(&mut self) {
        let Some(mut lease) = self.current.take() else {
            return;
        };
        let now = MicroTime(Timestamp::now());
        let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: transitions,
            ..lease.spec.clone().unwrap_or_default()
        });
        let attempt = tokio::time::timeout(
            self.cfg.renew_deadline,
            self.api
                .replace(&self.cfg.lease_name, &PostParams::default(), &lease),
        )
        .await;
        match attempt {
            Ok(Ok(_)) => tracing::info!(lease = %self.cfg.lease_name, "released the leader lease"),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 || s.code == 404 => {
                tracing::info!(lease = %self.cfg.lease_name, "the lease changed hands already; nothing to release");
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.cfg.lease_name, error = %e, "cannot release the leader lease; it will expire");
            }
            Err(_) => {
                tracing::warn!(lease = %self.cfg.lease_name, "releasing the leader lease timed out; it will expire");
            }
        }
    }

    fn kube_err(&self, verb: &str, source: kube::Error) -> Error {
        Error::Kube {
            what: format!(
                "{verb} Lease {}/{}",
                self.cfg.namespace, self.cfg.lease_name
            ),
            source,
        }
    }
}

enum RenewError {
    Taken(String),
    Failed(Error),
}

#[cfg(test)]
mod tests;
