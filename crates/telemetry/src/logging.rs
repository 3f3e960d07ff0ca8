//! Logging: klog's `-v` levels mapped onto tracing, to stderr like the Go sidecars.
//!
//! `-v` raises the level of this project's crates only. A Go sidecar's `-v=4` makes the
//! sidecar chatty, not client-go's HTTP/2 transport or Go's TLS stack; the same here: kube,
//! hyper, h2, rustls, tonic, tower and the AWS SDK stay at info whatever `-v` says (before,
//! `csi-attacher -v=4` printed ~100 lines of h2 frames and TLS handshakes in 7 idle seconds).
//! `RUST_LOG` (any `EnvFilter` directives) replaces the whole filter, for library debugging.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::util::SubscriberInitExt;

/// The tracing targets (crate names as module paths, binaries included) that `-v` raises.
/// A target matches its module and everything below it (`attacher` covers
/// `attacher::controller::watch`).
pub const OUR_TARGETS: &[&str] = &[
    // libraries
    "apiserver",
    "attach_detach",
    "attacher",
    "cluster",
    "component_runtime",
    "csi_bench",
    "csi_mock",
    "csi_spec",
    "csi_translation",
    "e2e",
    "ebs_cloud",
    "ebs_cloud_aws",
    "ebs_driver",
    "ec2_conformance",
    "ec2_sim",
    "ephemeral_volume",
    "hostpath_driver",
    "k8s_harness",
    "mount_utils",
    "node_agent",
    "provisioner",
    "pv_controller",
    "registrar",
    "scheduler",
    "statefulset",
    "telemetry",
    "test_support",
    "volume_plugins",
    // binaries whose name differs from their crate's
    "csi_attacher",
    "csi_cluster",
    "csi_mock_driver",
    "csictl",
    "ebs_csi_driver",
];

/// What libraries log at, whatever `-v` says.
const LIBRARY_LEVEL: tracing::Level = tracing::Level::INFO;

/// The tracing level a klog verbosity maps to: 0-3 info, 4 debug, 5 and above trace.
/// (klog's V(4) is where the Go sidecars log per-object detail, V(5) per-request detail.)
pub fn level_for_verbosity(verbosity: u8) -> tracing::Level {
    match verbosity {
        0..=3 => tracing::Level::INFO,
        4 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    }
}

/// How log lines are written: klog's `--logging-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event (spans as `name{field=value}:`).
    #[default]
    Text,
    /// One JSON object per line (`"level":"INFO"`, `"fields"`, `"spans"`), for log collectors.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "logging format {other:?} is not one of: text, json"
            )),
        }
    }
}

/// Installs a tracing subscriber writing text to stderr: our crates ([`OUR_TARGETS`]) at the
/// level [`level_for_verbosity`] gives, libraries at info. `RUST_LOG`, when set and valid,
/// replaces that filter. Calling it again (tests, a library user who installed its own
/// subscriber) does nothing.
pub fn init_logging(verbosity: u8) {
    init_logging_with(verbosity, LogFormat::Text, &[]);
}

/// [`init_logging`] in `format`, with `extra` filter directives (`target=level`, e.g.
/// `aws_sdk_ec2=debug` for a driver's `--aws-sdk-debug-log`) added to the `-v` ones;
/// `RUST_LOG` still replaces the whole filter. Colours only when stderr is a terminal (a pod's
/// log is a file) and `NO_COLOR` is unset.
pub fn init_logging_with(verbosity: u8, format: LogFormat, extra: &[&str]) {
    let filter = filter_for(verbosity, extra, std::env::var("RUST_LOG").ok().as_deref());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = subscriber(filter, format, std::io::stderr, ansi).try_init();
}

/// The subscriber [`init_logging_with`] installs, writing to `writer`.
fn subscriber<W>(
    filter: EnvFilter,
    format: LogFormat,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(builder.json().finish()),
    }
}

/// The filter directives for `verbosity` and `extra` without `RUST_LOG`.
fn directives_for(verbosity: u8, extra: &[&str]) -> String {
    let ours = level_for_verbosity(verbosity);
    let mut directives = LIBRARY_LEVEL.as_str().to_ascii_lowercase();
    if ours != LIBRARY_LEVEL {
        let ours = ours.as_str().to_ascii_lowercase();
        for target in OUR_TARGETS {
            directives.push(',');
            directives.push_str(target);
            directives.push('=');
            directives.push_str(&ours);
        }
    }
    for directive in extra {
        directives.push(',');
        directives.push_str(directive);
    }
    directives
}

/// The filter: `rust_log` when set and valid, else [`directives_for`] `verbosity` and `extra`.
fn filter_for(verbosity: u8, extra: &[&str], rust_log: Option<&str>) -> EnvFilter {
    rust_log
        .filter(|v| !v.is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(directives_for(verbosity, extra)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    /// Every workspace crate is one of ours: `-v` must raise its logs (a new crate that is
    /// not listed would log at info whatever `-v` says).
    #[test]
    fn every_workspace_crate_is_a_target() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(&crates).unwrap() {
            let manifest = entry.unwrap().path().join("Cargo.toml");
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let name = text
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|l| l.strip_suffix('"'))
                .unwrap()
                .replace('-', "_");
            if !OUR_TARGETS.contains(&name.as_str()) {
                missing.push(name);
            }
        }
        assert!(missing.is_empty(), "not in OUR_TARGETS: {missing:?}");
    }

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
        assert_eq!(filter_for(0, &[], None).to_string(), "info");
        assert_eq!(filter_for(0, &[], Some("")).to_string(), "info");
        assert_eq!(
            filter_for(0, &[], Some("component_runtime=trace")).to_string(),
            "component_runtime=trace"
        );
        // An unusable RUST_LOG falls back to -v rather than silencing the sidecar.
        assert!(
            filter_for(5, &[], Some("=[bad"))
                .to_string()
                .contains("attacher=trace")
        );
    }

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// What the subscriber for `verbosity`, `format` and `extra` prints for debug and trace
    /// events of our crates and of libraries.
    fn printed_as(verbosity: u8, format: LogFormat, extra: &[&str]) -> String {
        let out = Captured::default();
        let subscriber = subscriber(
            filter_for(verbosity, extra, None),
            format,
            out.clone(),
            false,
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "attacher::controller", "ours-debug");
            tracing::trace!(target: "component_runtime::leader", "ours-trace");
            tracing::debug!(target: "h2::codec", "h2-debug");
            tracing::debug!(target: "rustls::client", "rustls-debug");
            tracing::debug!(target: "kube_client::client", "kube-debug");
            tracing::debug!(target: "aws_sdk_ec2::operation", "aws-debug");
            tracing::info!(target: "kube_runtime::watcher", "kube-info");
            tracing::warn!(target: "hyper_util::client", "hyper-warn");
        });
        let text = out.0.lock().unwrap().clone();
        String::from_utf8(text).unwrap()
    }

    fn printed(verbosity: u8) -> String {
        printed_as(verbosity, LogFormat::Text, &[])
    }

    #[test]
    fn json_format_writes_one_object_per_line() {
        let json = printed_as(0, LogFormat::Json, &[]);
        let lines: Vec<&str> = json.lines().collect();
        assert_eq!(lines.len(), 2, "{json}");
        for line in lines {
            assert!(
                line.starts_with('{') && line.ends_with('}') && line.contains("\"level\":"),
                "{line}"
            );
        }
        assert!(
            json.contains("\"level\":\"INFO\"") && json.contains("kube-info"),
            "{json}"
        );
        let text = printed(0);
        assert!(
            text.contains("kube-info") && !text.starts_with('{'),
            "{text}"
        );
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("xml".parse::<LogFormat>().unwrap_err().contains("xml"));
    }

    #[test]
    fn extra_directives_raise_named_libraries_only() {
        let out = printed_as(0, LogFormat::Text, &["aws_sdk_ec2=debug"]);
        assert!(out.contains("aws-debug"), "{out}");
        assert!(
            !out.contains("ours-debug") && !out.contains("h2-debug"),
            "{out}"
        );
        assert!(!printed(0).contains("aws-debug"));
        // With -v raising our crates, the extra directive still applies.
        let out = printed_as(4, LogFormat::Text, &["aws_sdk_ec2=debug"]);
        assert!(
            out.contains("aws-debug") && out.contains("ours-debug"),
            "{out}"
        );
    }

    #[test]
    fn verbosity_raises_our_crates_only() {
        let v0 = printed(0);
        assert!(!v0.contains("ours-debug"), "{v0}");
        assert!(
            v0.contains("kube-info") && v0.contains("hyper-warn"),
            "{v0}"
        );

        let v4 = printed(4);
        assert!(v4.contains("ours-debug"), "{v4}");
        assert!(!v4.contains("ours-trace"), "{v4}");
        for library in ["h2-debug", "rustls-debug", "kube-debug"] {
            assert!(!v4.contains(library), "-v=4 let {library} through: {v4}");
        }
        assert!(v4.contains("kube-info"), "{v4}");

        let v5 = printed(5);
        assert!(
            v5.contains("ours-debug") && v5.contains("ours-trace"),
            "{v5}"
        );
        assert!(!v5.contains("h2-debug"), "{v5}");
    }
}
