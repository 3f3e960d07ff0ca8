//! The Go driver's command-line syntax, rewritten into what clap parses, so that the upstream
//! Helm chart's and kustomize manifests' arguments start this driver unchanged.
//!
//! The Go `aws-ebs-csi-driver` takes its mode as a first positional word (`controller`, `node`,
//! `all`, or `pre-stop-hook`) and parses flags with pflag/klog, where `-v=2`, `--v=2` and
//! `-v 2` are the same flag. The flag rewriting is `telemetry`'s, shared with the sidecars.

use std::ffi::OsString;

/// The first-argument words of the Go driver, as our `--mode` values.
const MODES: &[&str] = &["controller", "node", "all", "pre-stop-hook"];

/// Rewrites Go-style arguments for clap:
///
/// - a leading mode word (`controller ...`) becomes `--mode=controller`;
/// - a single-dash flag with a long name (`-endpoint=x`, `-logging-format json`) or klog's
///   `-v` gets a second dash; other single letters (`-h`, `-V`) stay clap short flags;
/// - values, double-dash flags and everything after `--` are left alone.
pub fn normalize<I: IntoIterator<Item = OsString>>(args: I) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    if args
        .get(1)
        .and_then(|a| a.to_str())
        .is_some_and(|first| MODES.contains(&first))
    {
        let mode = args.remove(1);
        let mut flag = OsString::from("--mode=");
        flag.push(mode);
        args.insert(1, flag);
    }
    telemetry::normalize_go_args(args)
}

/// Parses pflag's `mapStringString` syntax, `k1=v1,k2=v2` (what `--extra-tags` takes).
pub fn parse_map(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("'{pair}' is not key=value (expected k1=v1,k2=v2)"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(args: &[&str]) -> Vec<String> {
        normalize(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn mode_word_and_single_dash_flags() {
        assert_eq!(
            norm(&[
                "d",
                "controller",
                "-endpoint=unix:/csi/csi.sock",
                "-v=2",
                "-v",
                "5",
                "--batching=true",
                "-h"
            ]),
            [
                "d",
                "--mode=controller",
                "--endpoint=unix:/csi/csi.sock",
                "--v=2",
                "--v",
                "5",
                "--batching=true",
                "-h"
            ]
        );
        assert_eq!(
            norm(&["d", "node", "--", "-x"]),
            ["d", "--mode=node", "--", "-x"]
        );
        // Only the first word is a mode; a later one is left for clap to refuse.
        assert_eq!(norm(&["d", "--v=1", "node"]), ["d", "--v=1", "node"]);
        assert_eq!(
            norm(&["d", "--volume-attach-limit", "-1"]),
            ["d", "--volume-attach-limit", "-1"]
        );
    }

    #[test]
    fn maps_and_durations() {
        assert_eq!(
            parse_map("a=b, c=d,e=").unwrap(),
            vec![
                ("a".to_string(), "b".to_string()),
                ("c".to_string(), "d".to_string()),
                ("e".to_string(), String::new())
            ]
        );
        assert!(parse_map("a").unwrap_err().contains("'a'"));
        assert_eq!(
            telemetry::parse_go_duration("2s").unwrap().as_millis(),
            2000
        );
        assert_eq!(telemetry::parse_go_duration("1m30s").unwrap().as_secs(), 90);
        assert_eq!(
            telemetry::parse_go_duration("500ms").unwrap().as_millis(),
            500
        );
        assert!(telemetry::parse_go_duration("2 s").is_err());
        assert!(telemetry::parse_go_duration("").is_err());
    }
}
