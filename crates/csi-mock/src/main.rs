//! `csi-mock-driver`: the mock CSI driver as a process, to run any sidecar against.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use csi_mock::MockConfig;

/// A mock CSI driver (Identity + Controller publish/unpublish/list) on a unix socket. It keeps
/// published volumes in memory and answers the way the CSI spec asks.
#[derive(Debug, Parser)]
#[command(name = "csi-mock-driver", version)]
struct Flags {
    /// Where to serve: unix:///path/csi.sock or a plain path.
    #[arg(long, default_value = "unix:///run/csi/socket")]
    endpoint: String,

    /// The driver name GetPluginInfo answers.
    #[arg(long, default_value = "mock.csi.rs")]
    name: String,

    /// Do not advertise PUBLISH_UNPUBLISH_VOLUME (an attacher then uses its trivial handler).
    #[arg(long)]
    no_publish_unpublish: bool,

    /// Do not advertise PUBLISH_READONLY.
    #[arg(long)]
    no_publish_readonly: bool,

    /// Do not advertise LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES.
    #[arg(long)]
    no_list_published_nodes: bool,

    /// Do not advertise the CONTROLLER_SERVICE plugin capability.
    #[arg(long)]
    no_controller_service: bool,

    /// Added to every Publish and Unpublish, e.g. 10ms, 1.5s, 1m.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    delay: Duration,
}

/// A number and a unit (ns, us, µs, ms, s, m, h), repeated: "10ms", "1m30s", "0".
fn parse_duration(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err("empty duration (expected e.g. 10ms)".into());
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?}: a unit is missing (ns, us, ms, s, m, h)"))?;
        let value: f64 = rest[..num_end]
            .parse()
            .map_err(|_| format!("{s:?}: expected a number before the unit"))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => {
                return Err(format!(
                    "{s:?}: unknown unit {other:?} (ns, us, ms, s, m, h)"
                ));
            }
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("{s:?}: {e}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let f = Flags::parse();
    let config = MockConfig {
        name: f.name,
        publish_unpublish: !f.no_publish_unpublish,
        publish_readonly: !f.no_publish_readonly,
        list_published_nodes: !f.no_list_published_nodes,
        controller_service: !f.no_controller_service,
        delay: f.delay,
    };
    let driver = csi_mock::start_at(&f.endpoint, config)
        .await
        .with_context(|| format!("csi-mock-driver: starting on {}", f.endpoint))?;
    shutdown_signal().await?;
    tracing::info!("shutting down");
    driver.shutdown().await;
    Ok(())
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("watching SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("watching SIGINT")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("10").unwrap_err().contains("unit"));
        assert!(parse_duration("10parsecs").unwrap_err().contains("parsecs"));
        assert!(parse_duration("").is_err());
    }
}
