//! Percentiles of latency samples (nearest rank), the same for every scenario.

use std::time::Duration;

use serde::Serialize;

/// p50 / p99 / max (and min, mean) of a set of durations, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub min_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
    pub mean_s: f64,
}

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    sorted.get(index).copied()
}

pub fn summarize(samples: &[Duration]) -> Summary {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let secs = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64());
    let total: f64 = sorted.iter().map(Duration::as_secs_f64).sum();
    Summary {
        count: sorted.len(),
        min_s: secs(sorted.first().copied()),
        p50_s: secs(percentile(&sorted, 50.0)),
        p90_s: secs(percentile(&sorted, 90.0)),
        p99_s: secs(percentile(&sorted, 99.0)),
        max_s: secs(sorted.last().copied()),
        mean_s: if sorted.is_empty() {
            0.0
        } else {
            total / sorted.len() as f64
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn nearest_rank() {
        let s = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&s, 50.0).unwrap(), Duration::from_millis(50));
        assert_eq!(percentile(&s, 99.0).unwrap(), Duration::from_millis(99));
        assert_eq!(percentile(&s, 100.0).unwrap(), Duration::from_millis(100));
        assert_eq!(
            percentile(&ms(&[7]), 99.0).unwrap(),
            Duration::from_millis(7)
        );
        assert!(percentile(&[], 50.0).is_none());
    }

    #[test]
    fn summary_sorts_first() {
        let s = summarize(&ms(&[300, 100, 200]));
        assert_eq!(s.count, 3);
        assert!((s.p50_s - 0.2).abs() < 1e-9);
        assert!((s.max_s - 0.3).abs() < 1e-9);
        assert!((s.min_s - 0.1).abs() < 1e-9);
        assert!((s.mean_s - 0.2).abs() < 1e-9);
        assert_eq!(summarize(&[]).count, 0);
    }
}
