//! The Go sidecar's flags, parsed with clap after `telemetry::normalize_go_args`.

use std::path::PathBuf;
use std::time::Duration;

use telemetry::parse_go_duration;

/// What the binary does.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Register the driver with the kubelet and keep serving the registration socket.
    Registration,
    /// Exit 0 if the registration socket exists, else 1 (for a liveness probe's exec).
    KubeletRegistrationProbe,
}

/// `csi-node-driver-registrar`'s command line.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "csi-node-driver-registrar",
    about = "Registers a CSI driver with the kubelet (plugin registration API v1)"
)]
pub struct Config {
    /// Address of the CSI driver socket in this container: a plain path or a unix:// URL.
    #[arg(long, default_value = "/run/csi/socket", value_name = "ADDRESS")]
    pub csi_address: String,

    /// The driver socket's path on the node, as the kubelet sees it (PluginInfo.endpoint).
    #[arg(long, value_name = "PATH", value_parser = any_string)]
    pub kubelet_registration_path: String,

    /// The kubelet's plugin registry directory as mounted here; the registration socket
    /// `<driver>-reg.sock` is created in it.
    #[arg(long, default_value = "/registration", value_name = "DIR")]
    pub plugin_registration_path: PathBuf,

    /// Timeout of the GetPluginInfo call (and of the probe's whole check).
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// host:port (":9809" listens on all interfaces) for /healthz. Empty: no HTTP server.
    #[arg(long, value_name = "ADDRESS", value_parser = any_string)]
    pub http_endpoint: Option<String>,

    /// `registration`, or `kubelet-registration-probe` to check the socket and exit.
    #[arg(long, value_enum, default_value = "registration", value_name = "MODE")]
    pub mode: Mode,

    /// Log verbosity (klog levels): 0-3 info, 4 debug, 5 and above trace. RUST_LOG overrides.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub v: u8,
}

impl Config {
    /// `--http-endpoint`, with an empty value as unset.
    pub fn http_endpoint_addr(&self) -> Option<&str> {
        self.http_endpoint.as_deref().filter(|s| !s.is_empty())
    }
}

/// Accepts any string, including the empty one Go manifests pass for "unset".
fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        let args = std::iter::once("csi-node-driver-registrar")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Config::try_parse_from(telemetry::normalize_go_args(args))
    }

    #[test]
    fn go_style_flags_and_defaults() {
        let c = parse(&[
            "-kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock",
            "-v=5",
        ])
        .unwrap();
        assert_eq!(c.csi_address, "/run/csi/socket");
        assert_eq!(c.plugin_registration_path, PathBuf::from("/registration"));
        assert_eq!(c.timeout, Duration::from_secs(1));
        assert_eq!(c.mode, Mode::Registration);
        assert_eq!(c.v, 5);
        assert_eq!(c.http_endpoint_addr(), None);

        let c = parse(&[
            "--csi-address",
            "/csi/csi.sock",
            "--kubelet-registration-path=/k/csi.sock",
            "-timeout=1m30s",
            "--http-endpoint=:9809",
            "--mode=kubelet-registration-probe",
        ])
        .unwrap();
        assert_eq!(c.csi_address, "/csi/csi.sock");
        assert_eq!(c.timeout, Duration::from_secs(90));
        assert_eq!(c.http_endpoint_addr(), Some(":9809"));
        assert_eq!(c.mode, Mode::KubeletRegistrationProbe);
    }

    #[test]
    fn kubelet_registration_path_is_required_and_mode_checked() {
        assert!(parse(&[]).is_err());
        let err = parse(&["--kubelet-registration-path=/k", "--mode=bogus"]).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }
}
