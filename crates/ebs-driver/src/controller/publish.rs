//! ControllerPublish / ControllerUnpublish: attach and detach, reconciled per (volume, node).
//!
//! Each (volume, node) pair with work under way has one worker task and one *desired* state,
//! attached or detached. A call sets the desired state and waits for the worker:
//!
//! - the same desired state while a worker runs: Aborted (CSI: an operation is in flight);
//! - the other desired state ("Kubernetes can change its mind" in the EBS driver design,
//!   docs/design/ebs-driver.md): the new call replaces the goal, the earlier caller gets Aborted,
//!   and the worker turns around at its next step. So Unpublish during a Publish and Publish during
//!   an Unpublish both end in the state the *last* call asked for;
//! - the worker keeps going after its caller gave up (gRPC deadline), so a retry finds the work
//!   done, as the EBS driver design's "Timeouts" example expects.
//!
//! Each step looks at the world first (DescribeVolumes, batched), so a restarted driver
//! continues where the old one stopped. Force-detach is never used: the EBS driver design explains
//! it can corrupt data and lose the device name.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebs_cloud::{AttachmentState, Cloud, CloudError};
use tokio::sync::oneshot;

use crate::{Error, Result};

/// Timing of the attach/detach waits.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// How long an attachment may stay `attaching` before it is undone (stuck attach).
    pub attach_timeout: Duration,
    /// How long a worker waits for a detach before it reports DeadlineExceeded (the CO retries;
    /// nothing is forced).
    pub detach_timeout: Duration,
    /// First poll delay; grows by 1.5x up to `poll_max`.
    pub poll_initial: Duration,
    pub poll_max: Duration,
    /// Attached EBS volumes a node may have (`--volume-attach-limit`); `None` leaves the
    /// limit to EC2.
    pub attach_limit: Option<usize>,
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            attach_timeout: Duration::from_secs(90),
            detach_timeout: Duration::from_secs(120),
            poll_initial: Duration::from_millis(200),
            poll_max: Duration::from_secs(2),
            attach_limit: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Attached,
    Detached,
}

impl Want {
    fn call(self) -> &'static str {
        match self {
            Want::Attached => "ControllerPublishVolume",
            Want::Detached => "ControllerUnpublishVolume",
        }
    }
}

type Key = (String, String);
type Reply = oneshot::Sender<Result<Option<String>>>;

struct Entry {
    want: Want,
    generation: u64,
    waiter: Option<Reply>,
}

enum Step {
    Done(Result<Option<String>>),
    /// The desired state changed meanwhile: start over with the new one.
    Superseded,
}

/// The attach/detach side of the controller. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Attacher {
    cloud: Arc<dyn Cloud>,
    config: PublishConfig,
    entries: Arc<Mutex<HashMap<Key, Entry>>>,
    /// Per node, the volumes whose AttachVolume this process has sent (or is about to send) and
    /// whose worker is still running. DescribeInstances lags behind AttachVolume, so without
    /// these, concurrent publishes would all see the same count and overshoot
    /// `--volume-attach-limit`.
    reserved: Arc<Mutex<HashMap<String, HashSet<String>>>>,
}

impl std::fmt::Debug for Attacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attacher")
            .field("config", &self.config)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Attacher {
    pub(crate) fn new(cloud: Arc<dyn Cloud>, config: PublishConfig) -> Self {
        Self {
            cloud,
            config,
            entries: Arc::new(Mutex::new(HashMap::new())),
            reserved: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Attaches; returns the device name.
    pub(crate) async fn publish(&self, volume_id: &str, node_id: &str) -> Result<String> {
        // Quick answers that need no worker: unknown node or volume.
        match self.cloud.get_instance(node_id).await {
            Err(CloudError::NotFound { .. }) => {
                return Err(Error::NotFound {
                    kind: "node",
                    id: node_id.to_string(),
                });
            }
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let device = self.request(volume_id, node_id, Want::Attached).await?;
        device.ok_or_else(|| Error::Internal("attach finished without a device name".into()))
    }

    /// Detaches; success when the volume or node does not exist or it is not attached.
    pub(crate) async fn unpublish(&self, volume_id: &str, node_id: &str) -> Result<()> {
        self.request(volume_id, node_id, Want::Detached).await?;
        Ok(())
    }

    async fn request(&self, volume_id: &str, node_id: &str, want: Want) -> Result<Option<String>> {
        let key = (volume_id.to_string(), node_id.to_string());
        let (tx, rx) = oneshot::channel();
        let spawn = {
            let mut entries = lock(&self.entries);
            match entries.get_mut(&key) {
                Some(e) if e.want == want => {
                    return Err(Error::OperationInFlight(format!(
                        "{volume_id} ({} to node {node_id})",
                        want.call()
                    )));
                }
                Some(e) => {
                    if let Some(earlier) = e.waiter.take() {
                        let _ = earlier.send(Err(Error::Superseded {
                            call: e.want.call(),
                            volume_id: volume_id.to_string(),
                            node_id: node_id.to_string(),
                            by: want.call(),
                        }));
                    }
                    tracing::info!(
                        volume_id,
                        node_id,
                        now = want.call(),
                        "goal changed while in flight"
                    );
                    e.want = want;
                    e.generation += 1;
                    e.waiter = Some(tx);
                    false
                }
                None => {
                    entries.insert(
                        key.clone(),
                        Entry {
                            want,
                            generation: 0,
                            waiter: Some(tx),
                        },
                    );
                    true
                }
            }
        };
        if spawn {
            let this = self.clone();
            tokio::spawn(async move { this.work(key).await });
        }
        rx.await
            .unwrap_or_else(|_| Err(Error::Internal("the attach worker stopped".into())))
    }

    fn current(&self, key: &Key) -> Option<(Want, u64)> {
        lock(&self.entries).get(key).map(|e| (e.want, e.generation))
    }

    fn changed(&self, key: &Key, generation: u64) -> bool {
        self.current(key).is_none_or(|(_, g)| g != generation)
    }

    async fn work(self, key: Key) {
        let (volume_id, node_id) = (&key.0, &key.1);
        loop {
            let Some((want, generation)) = self.current(&key) else {
                return;
            };
            let step = match want {
                Want::Attached => self.attach(&key, generation).await,
                Want::Detached => self.detach(&key, generation).await,
            };
            let Step::Done(result) = step else {
                continue;
            };
            let mut entries = lock(&self.entries);
            if entries
                .get(&key)
                .is_some_and(|e| e.generation != generation)
            {
                // The goal changed just as this one finished: go for the new one.
                continue;
            }
            if let Some(e) = entries.remove(&key) {
                self.release(volume_id, node_id);
                if let Err(err) = &result {
                    tracing::warn!(volume_id, node_id, call = want.call(), error = %err, "failed");
                }
                if let Some(w) = e.waiter {
                    // The caller may have gone (deadline); the work is done regardless.
                    let _ = w.send(result);
                }
            }
            return;
        }
    }

    async fn sleep(&self, delay: &mut Duration) {
        tokio::time::sleep(*delay).await;
        *delay = delay.mul_f64(1.5).min(self.config.poll_max);
    }

    async fn attach(&self, key: &Key, generation: u64) -> Step {
        let (volume_id, node_id) = (key.0.as_str(), key.1.as_str());
        let mut delay = self.config.poll_initial;
        let mut attaching_since: Option<Instant> = None;
        let mut attach_sent: Option<Instant> = None;
        loop {
            if self.changed(key, generation) {
                return Step::Superseded;
            }
            let disk = match self.cloud.get_disk_by_id(volume_id).await {
                Ok(d) => d,
                Err(CloudError::NotFound { .. }) => {
                    return Step::Done(Err(Error::NotFound {
                        kind: "volume",
                        id: volume_id.to_string(),
                    }));
                }
                Err(e) if retryable(&e) => {
                    self.sleep(&mut delay).await;
                    continue;
                }
                Err(e) => return Step::Done(Err(e.into())),
            };
            match disk.attachment_to(node_id) {
                Some(a) if a.state == AttachmentState::Attached => {
                    return Step::Done(Ok(Some(a.device.clone())));
                }
                Some(a) if a.state == AttachmentState::Attaching => {
                    let since = *attaching_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > self.config.attach_timeout {
                        return Step::Done(Err(self
                            .undo_stuck(volume_id, node_id, &a.device)
                            .await));
                    }
                }
                // Detaching (a Publish after an Unpublish): wait until it is gone, then attach.
                Some(_) => {}
                None => {
                    if let Some(other) = disk
                        .attachments
                        .iter()
                        .find(|a| a.instance_id != node_id)
                        .filter(|_| !disk.multi_attach)
                    {
                        return Step::Done(Err(Error::AttachedElsewhere {
                            volume_id: volume_id.to_string(),
                            node_id: node_id.to_string(),
                            other: other.instance_id.clone(),
                        }));
                    }
                    // EC2's describe calls lag a little behind AttachVolume: do not attach
                    // twice within that window.
                    let recently =
                        attach_sent.is_some_and(|t| t.elapsed() < Duration::from_secs(15));
                    if disk.state != "creating" && !recently {
                        if let Err(e) = self.reserve_slot(volume_id, node_id).await {
                            return Step::Done(Err(e));
                        }
                        match self.cloud.attach_disk(volume_id, node_id).await {
                            Ok(device) => {
                                tracing::info!(volume_id, node_id, device, "attach requested");
                                attach_sent = Some(Instant::now());
                                attaching_since = Some(Instant::now());
                            }
                            Err(e) if retryable(&e) => {}
                            Err(e) => return Step::Done(Err(publish_error(e, volume_id, node_id))),
                        }
                    }
                }
            }
            self.sleep(&mut delay).await;
        }
    }

    /// Checks `--volume-attach-limit` and holds a slot for `volume_id` until its worker ends.
    /// The count is EC2's view (DescribeInstances, never memory alone) joined with the
    /// attaches this process has in flight, in one critical section, so concurrent publishes
    /// to one node cannot all take the last slot.
    async fn reserve_slot(&self, volume_id: &str, node_id: &str) -> Result<()> {
        let Some(limit) = self.config.attach_limit else {
            return Ok(());
        };
        let instance = self.cloud.get_instance(node_id).await?;
        let mut reserved = lock(&self.reserved);
        let mine = reserved.entry(node_id.to_string()).or_default();
        let mut used: HashSet<&str> = instance
            .devices
            .iter()
            .filter(|d| Some(&d.device) != instance.root_device.as_ref())
            .map(|d| d.volume_id.as_str())
            .collect();
        used.extend(mine.iter().map(String::as_str));
        used.remove(volume_id);
        if used.len() >= limit {
            return Err(Error::AttachLimit {
                node_id: node_id.to_string(),
                reason: format!(
                    "{} volumes are attached or being attached; --volume-attach-limit is {limit}",
                    used.len()
                ),
            });
        }
        mine.insert(volume_id.to_string());
        Ok(())
    }

    fn release(&self, volume_id: &str, node_id: &str) {
        let mut reserved = lock(&self.reserved);
        if let Some(mine) = reserved.get_mut(node_id) {
            mine.remove(volume_id);
            if mine.is_empty() {
                reserved.remove(node_id);
            }
        }
    }

    /// An attachment stayed `attaching` too long: detach it (never forced), put the device
    /// name aside, and fail so the CO retries with a fresh attempt.
    async fn undo_stuck(&self, volume_id: &str, node_id: &str, device: &str) -> Error {
        tracing::warn!(
            volume_id,
            node_id,
            device,
            "attach stuck; detaching it again"
        );
        self.cloud.device_failed(node_id, device);
        if let Err(e) = self.cloud.detach_disk(volume_id, node_id).await {
            tracing::warn!(volume_id, node_id, error = %e, "detach of the stuck attachment failed");
        }
        let waited = self
            .cloud
            .wait_for_attachment_state(
                volume_id,
                node_id,
                AttachmentState::Detached,
                self.config.detach_timeout,
            )
            .await;
        Error::StuckAttaching {
            volume_id: volume_id.to_string(),
            node_id: node_id.to_string(),
            device: device.to_string(),
            waited: self.config.attach_timeout,
            undone: waited.is_ok(),
        }
    }

    async fn detach(&self, key: &Key, generation: u64) -> Step {
        let (volume_id, node_id) = (key.0.as_str(), key.1.as_str());
        let started = Instant::now();
        let mut delay = self.config.poll_initial;
        let mut detach_sent = false;
        loop {
            if self.changed(key, generation) {
                return Step::Superseded;
            }
            let disk = match self.cloud.get_disk_by_id(volume_id).await {
                Ok(d) => d,
                Err(CloudError::NotFound { .. }) => return Step::Done(Ok(None)),
                Err(e) if retryable(&e) => {
                    self.sleep(&mut delay).await;
                    continue;
                }
                Err(e) => return Step::Done(Err(e.into())),
            };
            let Some(a) = disk.attachment_to(node_id) else {
                return Step::Done(Ok(None));
            };
            match a.state {
                // The EBS driver design: cancelling an attach means waiting for it, then detaching.
                // A stuck attach is detached once it has been attaching for the attach timeout.
                AttachmentState::Attaching if started.elapsed() < self.config.attach_timeout => {}
                AttachmentState::Detaching => {}
                _ if !detach_sent => match self.cloud.detach_disk(volume_id, node_id).await {
                    Ok(_) => detach_sent = true,
                    Err(e) if retryable(&e) => {}
                    Err(e) => return Step::Done(Err(e.into())),
                },
                _ => {}
            }
            if started.elapsed() > self.config.detach_timeout {
                return Step::Done(Err(Error::DeadlineExceeded(format!(
                    "volume {volume_id} is still {} on node {node_id} after {:?}; the detach goes on (it is never forced), retry later",
                    a.state.as_str(),
                    started.elapsed()
                ))));
            }
            self.sleep(&mut delay).await;
        }
    }
}

/// Throttling that outlived the SDK-level retries, or a timeout: keep polling.
fn retryable(e: &CloudError) -> bool {
    matches!(e, CloudError::Throttled { .. } | CloudError::Timeout { .. })
}

fn publish_error(e: CloudError, volume_id: &str, node_id: &str) -> Error {
    match e {
        CloudError::AttachmentLimit { message, .. } => Error::AttachLimit {
            node_id: node_id.to_string(),
            reason: message,
        },
        CloudError::NotFound {
            kind: "instance", ..
        } => Error::NotFound {
            kind: "node",
            id: node_id.to_string(),
        },
        CloudError::NotFound { .. } => Error::NotFound {
            kind: "volume",
            id: volume_id.to_string(),
        },
        CloudError::VolumeInUse { message, .. } => Error::FailedPrecondition(format!(
            "volume {volume_id} cannot be attached to {node_id}: {message}"
        )),
        CloudError::Other { code, message, .. } if code == "InvalidVolume.ZoneMismatch" => {
            Error::FailedPrecondition(format!(
                "volume {volume_id} is in another availability zone than node {node_id}: {message}"
            ))
        }
        other => other.into(),
    }
}
