//! Resource IDs, request IDs, jitter and timestamps.
//!
//! A small splitmix64 generator is enough: IDs only need to be unique and AWS-shaped, not
//! unpredictable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static STATE: AtomicU64 = AtomicU64::new(0);

fn seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15
}

/// Next pseudo-random 64-bit value (splitmix64 over a shared atomic counter).
pub(crate) fn next_u64() -> u64 {
    if STATE.load(Ordering::Relaxed) == 0 {
        // Racing initialisations are harmless: both seeds are fine.
        let _ = STATE.compare_exchange(0, seed(), Ordering::Relaxed, Ordering::Relaxed);
    }
    let mut z = STATE
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform sample in 0..1.
pub(crate) fn next_f64() -> f64 {
    (next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// `prefix-` followed by 17 lowercase hex digits, as AWS's long IDs.
pub(crate) fn resource_id(prefix: &str) -> String {
    let hi = next_u64() & 0xF;
    let lo = next_u64();
    format!("{prefix}-{hi:x}{lo:016x}")
}

/// A UUID-shaped request ID.
pub(crate) fn request_id() -> String {
    let a = next_u64();
    let b = next_u64();
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFFF,
        b >> 48,
        b & 0xFFFF_FFFF_FFFF
    )
}

/// True when `id` is `prefix-` followed by 8 or 17 lowercase hex digits (AWS's short and long
/// ID formats).
pub(crate) fn is_valid_id(id: &str, prefix: &str) -> bool {
    let Some(rest) = id.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    (rest.len() == 8 || rest.len() == 17)
        && rest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// ISO 8601 UTC with milliseconds, as EC2 prints timestamps: `2024-05-01T12:34:56.789Z`.
pub(crate) fn iso8601(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        ms % 1000
    )
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_aws_shaped_and_distinct() {
        let a = resource_id("vol");
        let b = resource_id("vol");
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 17);
        assert!(is_valid_id(&a, "vol"), "{a}");
        assert!(is_valid_id("i-0123456789abcdef0", "i"));
        assert!(is_valid_id("vol-1234abcd", "vol"));
        assert!(!is_valid_id("vol-0123456789ABCDEF0", "vol"));
        assert!(!is_valid_id("vol-123", "vol"));
        assert!(!is_valid_id("snap-0123456789abcdef0", "vol"));
    }

    #[test]
    fn iso8601_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso8601(1_700_000_000_000), "2023-11-14T22:13:20.000Z");
    }

    #[test]
    fn f64_in_unit_interval() {
        for _ in 0..1000 {
            let x = next_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
