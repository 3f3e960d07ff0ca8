//! Periodic work: the resync and the reconciler run on it.

use tokio_util::sync::CancellationToken;

/// Runs `tick` every `period` (not at once: the caches were just filled) until `stop`; a zero
/// period turns it off. A tick that overruns delays the next one rather than bunching them.
pub(crate) async fn every<F, Fut>(
    period: std::time::Duration,
    stop: &CancellationToken,
    mut tick: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if period.is_zero() {
        return;
    }
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = interval.tick() => {}
        }
        tick().await;
    }
}
