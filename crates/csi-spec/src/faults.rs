//! A fault-injecting CSI proxy: it serves a unix socket, forwards every call to a driver's
//! socket unchanged, and fails the calls its [`FaultPlan`] names.
//!
//! A fault fires either *before* the call reaches the driver (the driver never saw it: a
//! refused connection, a full queue) or *after* the driver answered (the driver did the work
//! and the caller still sees an error: a deadline that ran out while the mount finished). The
//! second kind is what leaves Kubernetes' volume manager and the sidecars with an *uncertain*
//! operation, and it cannot be produced from outside a driver without such a proxy. The proxy
//! knows nothing of CSI beyond the method name in the gRPC path, so it works in front of any
//! driver. `csi-cluster chaos` puts one in front of every driver socket.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response, Uri};
use tonic::service::Routes;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tower::{Layer, Service, ServiceExt};

use crate::{Error, UnixSocket, connect_unix_lazy};

/// When a fault fires relative to the driver's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// The call never reaches the driver.
    Before,
    /// The driver runs the call to its end; its answer is dropped and the error returned.
    After,
}

impl When {
    pub fn as_str(self) -> &'static str {
        match self {
            When::Before => "before",
            When::After => "after",
        }
    }
}

/// One rule: fail the next `count` calls of `method` with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The CSI method (`NodeStageVolume`) or `*` for every method.
    pub method: String,
    pub code: Code,
    pub when: When,
    /// How many more matching calls fail; the rule goes when it reaches 0.
    pub count: u32,
}

/// What the proxies fail; clones share the plan, so a test or `csi-cluster chaos` changes it
/// while the proxies run. A plan that names nothing forwards every call untouched.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    state: Arc<Mutex<PlanState>>,
}

#[derive(Debug, Default)]
struct PlanState {
    faults: Vec<Fault>,
    /// Added latency per method (`*`: every method), before the call is forwarded.
    delays: BTreeMap<String, Duration>,
    forwarded: u64,
    /// Calls seen per method, so a test can tell when one has started.
    per_method: BTreeMap<String, u64>,
    injected: u64,
}

impl FaultPlan {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PlanState> {
        // A panic while holding the lock leaves plain counters and lists behind; they are
        // still consistent, so poisoning is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a rule (after the existing ones; the first matching rule fires).
    pub fn add(&self, fault: Fault) {
        if fault.count > 0 {
            self.state().faults.push(fault);
        }
    }

    /// Delays every call of `method` (`*`: every method) by `delay`; `Duration::ZERO` removes it.
    pub fn set_delay(&self, method: &str, delay: Duration) {
        let mut s = self.state();
        if delay.is_zero() {
            s.delays.remove(method);
        } else {
            s.delays.insert(method.to_string(), delay);
        }
    }

    /// Forgets every rule and delay.
    pub fn clear(&self) {
        let mut s = self.state();
        s.faults.clear();
        s.delays.clear();
    }

    /// Rules that have not fired all their calls yet.
    pub fn pending(&self) -> Vec<Fault> {
        self.state().faults.clone()
    }

    /// Calls failed so far.
    pub fn injected(&self) -> u64 {
        self.state().injected
    }

    /// Calls seen so far (failed or not).
    pub fn calls(&self) -> u64 {
        self.state().forwarded
    }

    /// Calls of `method` seen so far (failed, delayed or not), counted when they arrive.
    pub fn calls_of(&self, method: &str) -> u64 {
        self.state().per_method.get(method).copied().unwrap_or(0)
    }

    /// The delay and the fault for one call of `method`, counting the fault down.
    fn take(&self, method: &str) -> (Option<Duration>, Option<(Code, When)>) {
        let mut s = self.state();
        s.forwarded += 1;
        *s.per_method.entry(method.to_string()).or_default() += 1;
        let delay = s.delays.get(method).or_else(|| s.delays.get("*")).copied();
        let Some(i) = s
            .faults
            .iter()
            .position(|f| f.method == method || f.method == "*")
        else {
            return (delay, None);
        };
        let f = &mut s.faults[i];
        f.count -= 1;
        let fired = (f.code, f.when);
        if f.count == 0 {
            s.faults.remove(i);
        }
        s.injected += 1;
        (delay, Some(fired))
    }
}

/// Serves `listen`, forwarding every call to the driver at `target` (connected on first use,
/// reconnected after a driver restart) under `plan`, until `shutdown` resolves.
pub async fn serve_proxy(
    listen: UnixSocket,
    target: &str,
    plan: FaultPlan,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let channel = connect_unix_lazy(target)?;
    let layer = ForwardLayer {
        channel,
        plan,
        target: Arc::from(target),
    };
    // The routes are never reached: the layer answers every call itself.
    let router = Server::builder().layer(layer).add_routes(Routes::default());
    listen.serve(router, shutdown).await
}

#[derive(Clone)]
struct ForwardLayer {
    channel: Channel,
    plan: FaultPlan,
    target: Arc<str>,
}

impl<S> Layer<S> for ForwardLayer {
    type Service = Forward;

    fn layer(&self, _inner: S) -> Forward {
        Forward {
            channel: self.channel.clone(),
            plan: self.plan.clone(),
            target: Arc::clone(&self.target),
        }
    }
}

#[derive(Clone)]
struct Forward {
    channel: Channel,
    plan: FaultPlan,
    target: Arc<str>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<Request<Body>> for Forward {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let (channel, plan, target) = (
            self.channel.clone(),
            self.plan.clone(),
            Arc::clone(&self.target),
        );
        Box::pin(async move { Ok(forward(channel, plan, &target, req).await) })
    }
}

async fn forward(
    channel: Channel,
    plan: FaultPlan,
    target: &str,
    req: Request<Body>,
) -> Response<Body> {
    let method = req
        .uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let (delay, fault) = plan.take(&method);
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let injected = |code: Code, when: When| {
        tracing::info!(%method, ?code, when = when.as_str(), "CSI fault injected");
        Status::new(
            code,
            format!(
                "fault injected {} {method} reached the driver",
                when.as_str()
            ),
        )
        .into_http()
    };
    if let Some((code, When::Before)) = fault {
        return injected(code, When::Before);
    }
    let (mut parts, body) = req.into_parts();
    // The channel puts its own scheme and authority in front of the path.
    if let Some(pq) = parts.uri.path_and_query().cloned() {
        parts.uri = Uri::from(pq);
    }
    let answer = match channel.oneshot(Request::from_parts(parts, body)).await {
        Ok(answer) => answer,
        // What a caller dialing the driver itself would see.
        Err(e) => {
            return Status::unavailable(format!("forwarding {method} to {target}: {e}"))
                .into_http();
        }
    };
    match fault {
        Some((code, When::After)) => {
            // Wait for the driver's whole answer (its trailers say it finished), then drop it.
            let _ = answer.into_body().collect().await;
            injected(code, When::After)
        }
        _ => answer,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn fault(method: &str, count: u32) -> Fault {
        Fault {
            method: method.into(),
            code: Code::Unavailable,
            when: When::Before,
            count,
        }
    }

    #[test]
    fn rules_fire_their_count_then_go() {
        let plan = FaultPlan::new();
        plan.add(fault("NodeStageVolume", 2));
        plan.add(fault("*", 1));
        assert_eq!(
            plan.take("NodePublishVolume").1.map(|f| f.0),
            Some(Code::Unavailable)
        );
        assert_eq!(plan.take("NodePublishVolume").1, None);
        assert!(plan.take("NodeStageVolume").1.is_some());
        assert!(plan.take("NodeStageVolume").1.is_some());
        assert_eq!(plan.take("NodeStageVolume").1, None);
        assert_eq!((plan.injected(), plan.calls()), (3, 5));
        assert_eq!(
            (plan.calls_of("NodeStageVolume"), plan.calls_of("Probe")),
            (3, 0)
        );
        assert!(plan.pending().is_empty());
        plan.add(fault("X", 0));
        assert!(plan.pending().is_empty(), "a rule of 0 calls is no rule");
    }

    #[test]
    fn delays_apply_per_method_or_to_all() {
        let plan = FaultPlan::new();
        plan.set_delay("*", Duration::from_millis(5));
        plan.set_delay("NodeStageVolume", Duration::from_millis(50));
        assert_eq!(
            plan.take("NodeStageVolume").0,
            Some(Duration::from_millis(50))
        );
        assert_eq!(plan.take("Probe").0, Some(Duration::from_millis(5)));
        plan.set_delay("*", Duration::ZERO);
        assert_eq!(plan.take("Probe").0, None);
        plan.clear();
        assert_eq!(plan.take("NodeStageVolume").0, None);
    }
}
