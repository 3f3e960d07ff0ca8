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

/// Parses a Go duration such as `2s`, `1m30s` or `500ms` (what
/// `--modify-volume-request-handler-timeout` and `--log-flush-frequency` take).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let invalid = || format!("invalid duration '{s}' (Go syntax, e.g. 2s, 1m30s, 500ms)");
    if s == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let n: f64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    Ok(std::time::Duration::from_secs_f64(total))
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
        assert_eq!(parse_duration("2s").unwrap().as_millis(), 2000);
        assert_eq!(parse_duration("1m30s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert!(parse_duration("2 s").is_err());
        assert!(parse_duration("").is_err());
    }
}
