//! Per-key exponential backoff of the work queue.

use std::time::Duration;

/// Per-key exponential backoff: `start`, `2*start`, `4*start`, ... capped at `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The wait after the first failure (`--retry-interval-start`).
    pub start: Duration,
    /// The longest wait (`--retry-interval-max`).
    pub max: Duration,
}

impl Backoff {
    /// The wait after the `failures`-th consecutive failure (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(62);
        let factor = 1u64 << exp;
        let nanos = self.start.as_nanos().saturating_mul(u128::from(factor));
        let capped = nanos.min(self.max.as_nanos());
        Duration::from_nanos(u64::try_from(capped).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_start_and_caps_at_max() {
        let b = Backoff {
            start: Duration::from_secs(1),
            max: Duration::from_secs(300),
        };
        let delays: Vec<u64> = (1..=11).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }
}
