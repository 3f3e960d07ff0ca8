//! Command-line flags, named and defaulted as the Go external-attacher's so existing manifests
//! work unchanged (`-flag=value`, `--flag value`: run the arguments through
//! `component_runtime::normalize_go_args` first).

use std::time::Duration;

use clap::Parser;
use component_runtime::{parse_go_bool, parse_go_duration};

/// csi-attacher: attaches and detaches CSI volumes for VolumeAttachment objects.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-attacher", version, about, long_about = None)]
#[command(mut_args = component_runtime::go_bools)]
pub struct Config {
    #[command(flatten)]
    pub common: component_runtime::CommonFlags,

    /// Timeout of every CSI call (ControllerPublish/Unpublish, ListVolumes).
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// Workers per queue (attach, detach and PV queues each get this many).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub worker_threads: usize,

    /// Backoff after the first failure of an object; it doubles with every further failure.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Longest backoff between retries of one object.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// How often every VolumeAttachment and PV is re-examined even without changes (0: never).
    #[arg(long, default_value = "10m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub resync: Duration,

    /// How often VolumeAttachments are compared with the driver's ListVolumes published nodes
    /// (drivers with LIST_VOLUMES_PUBLISHED_NODES only; 0: never).
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub reconcile_sync: Duration,

    /// Page size of ListVolumes in the reconciler (0: the driver decides).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_entries: i32,

    /// Filesystem for mount volumes whose PV has no spec.csi.fsType (empty: let the driver pick).
    #[arg(long, default_value = "", value_name = "FSTYPE")]
    pub default_fstype: String,

    /// Dummy mode: no CSI driver; mark VolumeAttachments of attacher "csi/dummy" (or
    /// "csi-dummy", which today's API servers accept) attached.
    #[arg(long, default_value_t = false, value_parser = parse_go_bool, value_name = "BOOL")]
    pub dummy: bool,
}

/// What the controller needs from the flags (tests build it directly).
#[derive(Debug, Clone)]
pub struct Options {
    pub timeout: Duration,
    pub workers: usize,
    pub retry_interval_start: Duration,
    pub retry_interval_max: Duration,
    pub resync: Duration,
    pub reconcile_sync: Duration,
    pub max_entries: i32,
    pub default_fstype: String,
}

impl Default for Options {
    /// The Go sidecar's defaults.
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(15),
            workers: 10,
            retry_interval_start: Duration::from_secs(1),
            retry_interval_max: Duration::from_secs(300),
            resync: Duration::from_secs(600),
            reconcile_sync: Duration::from_secs(60),
            max_entries: 0,
            default_fstype: String::new(),
        }
    }
}

impl Config {
    /// The controller's options, checked.
    pub fn options(&self) -> Result<Options, crate::Error> {
        if self.worker_threads == 0 {
            return Err(crate::Error::Config(
                "--worker-threads must be at least 1".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(crate::Error::Config(
                "--timeout must be longer than 0".into(),
            ));
        }
        if self.retry_interval_start.is_zero() {
            return Err(crate::Error::Config(
                "--retry-interval-start must be longer than 0".into(),
            ));
        }
        if self.retry_interval_max < self.retry_interval_start {
            return Err(crate::Error::Config(format!(
                "--retry-interval-max ({:?}) must not be shorter than --retry-interval-start ({:?})",
                self.retry_interval_max, self.retry_interval_start
            )));
        }
        if self.max_entries < 0 {
            return Err(crate::Error::Config(
                "--max-entries must not be negative".into(),
            ));
        }
        Ok(Options {
            timeout: self.timeout,
            workers: self.worker_threads,
            retry_interval_start: self.retry_interval_start,
            retry_interval_max: self.retry_interval_max,
            resync: self.resync,
            reconcile_sync: self.reconcile_sync,
            max_entries: self.max_entries,
            default_fstype: self.default_fstype.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Config {
        let argv = std::iter::once("csi-attacher")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Config::try_parse_from(component_runtime::normalize_go_args(argv)).expect("parses")
    }

    #[test]
    fn defaults_are_the_go_sidecars() {
        let c = parse(&[]);
        let o = c.options().expect("valid");
        assert_eq!(c.common.csi_address, "/run/csi/socket");
        assert_eq!(o.timeout, Duration::from_secs(15));
        assert_eq!(o.workers, 10);
        assert_eq!(o.retry_interval_start, Duration::from_secs(1));
        assert_eq!(o.retry_interval_max, Duration::from_secs(300));
        assert_eq!(o.resync, Duration::from_secs(600));
        assert_eq!(o.reconcile_sync, Duration::from_secs(60));
        assert_eq!(o.default_fstype, "");
        assert!(!c.dummy);
    }

    #[test]
    fn go_style_flags_parse() {
        let c = parse(&[
            "-timeout=1m30s",
            "--worker-threads",
            "3",
            "-retry-interval-start=50ms",
            "--retry-interval-max=2s",
            "-default-fstype",
            "xfs",
            "-dummy",
            "-csi-address=unix:///tmp/csi.sock",
            "-v=5",
        ]);
        let o = c.options().expect("valid");
        assert_eq!(o.timeout, Duration::from_secs(90));
        assert_eq!(o.workers, 3);
        assert_eq!(o.retry_interval_start, Duration::from_millis(50));
        assert_eq!(o.retry_interval_max, Duration::from_secs(2));
        assert_eq!(o.default_fstype, "xfs");
        assert!(c.dummy);
        assert_eq!(c.common.csi_address, "unix:///tmp/csi.sock");
        assert_eq!(c.common.v, 5);
        assert!(!parse(&["--dummy=false"]).dummy);
    }

    #[test]
    fn nonsense_is_refused_with_the_flag_named() {
        let e = parse(&["--worker-threads=0"])
            .options()
            .expect_err("refused");
        assert!(e.to_string().contains("--worker-threads"), "{e}");
        let e = parse(&["--retry-interval-start=10s", "--retry-interval-max=1s"])
            .options()
            .expect_err("refused");
        assert!(e.to_string().contains("--retry-interval-max"), "{e}");
    }
}
