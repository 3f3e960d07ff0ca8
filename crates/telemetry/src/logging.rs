//! Logging: klog's `-v` levels mapped onto tracing, to stderr like the Go sidecars.

use tracing_subscriber::EnvFilter;

/// The tracing level a klog verbosity maps to: 0-3 info, 4 debug, 5 and above trace.
/// (klog's V(4) is where the Go sidecars log per-object detail, V(5) per-request detail.)
pub fn level_for_verbosity(verbosity: u8) -> tracing::Level {
    match verbosity {
        0..=3 => tracing::Level::INFO,
        4 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    }
}

/// Installs a tracing subscriber writing to stderr at the level [`level_for_verbosity`] gives.
/// `RUST_LOG`, when set and valid, overrides it. Calling it again (tests, a library user who
/// installed its own subscriber) does nothing.
pub fn init_logging(verbosity: u8) {
    let filter = filter_for(verbosity, std::env::var("RUST_LOG").ok().as_deref());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The filter: `rust_log` when set and valid, else the level for `verbosity`.
fn filter_for(verbosity: u8, rust_log: Option<&str>) -> EnvFilter {
    rust_log
        .filter(|v| !v.is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(level_for_verbosity(verbosity).as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_levels() {
        assert_eq!(level_for_verbosity(0), tracing::Level::INFO);
        assert_eq!(level_for_verbosity(3), tracing::Level::INFO);
        assert_eq!(level_for_verbosity(4), tracing::Level::DEBUG);
        assert_eq!(level_for_verbosity(5), tracing::Level::TRACE);
        assert_eq!(level_for_verbosity(10), tracing::Level::TRACE);
    }

    #[test]
    fn rust_log_overrides_verbosity() {
        assert_eq!(filter_for(4, None).to_string(), "debug");
        assert_eq!(filter_for(0, Some("")).to_string(), "info");
        assert_eq!(
            filter_for(0, Some("sidecar=trace")).to_string(),
            "sidecar=trace"
        );
        // An unusable RUST_LOG falls back to -v rather than silencing the sidecar.
        assert_eq!(filter_for(5, Some("=[bad")).to_string(), "trace");
    }
}
