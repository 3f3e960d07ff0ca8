//! Go's flag syntax (pflag/klog, as the Go sidecars and drivers parse their command lines)
//! rewritten into what clap parses, so existing manifests' argument lists start our binaries
//! unchanged, and the value syntax of Go's flags (durations, booleans). Here rather than in
//! `component-runtime` so that the EBS driver, which must not pull in a Kubernetes client, shares it.

use std::ffi::OsString;
use std::time::Duration;

/// Rewrites Go-style arguments into the form clap accepts.
///
/// - A single-dash flag whose name is longer than one letter (`-csi-address=/x`,
///   `-leader-election`, `-timeout 15s`) gets a second dash.
/// - `-v` (klog's verbosity, a single letter) becomes `--v`, so `-v 5`, `-v=5` and `--v=5` all
///   reach the `--v` flag (`component_runtime::CommonFlags::v`). Other single letters (`-h`, `-V`) stay clap short flags.
/// - Anything else is left alone: double-dash flags, values (a path, `-1` for
///   `--kube-api-qps`, a lone `-`), and everything after a `--` terminator.
///
/// Limitation: a flag's separate value that itself looks like a long flag (`-kubeconfig
/// -weird`) would be rewritten; pass such values as `-kubeconfig=-weird`.
pub fn normalize_go_args<I: IntoIterator<Item = OsString>>(args: I) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut iter = args.into_iter();
    // The program name is not a flag.
    if let Some(program) = iter.next() {
        out.push(program);
    }
    let mut terminated = false;
    for arg in iter {
        if terminated {
            out.push(arg);
            continue;
        }
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            terminated = true;
            out.push(arg);
            continue;
        }
        match single_dash_flag_name(text) {
            Some(name) if name.len() > 1 || name == "v" => {
                let mut rewritten = OsString::from("-");
                rewritten.push(&arg);
                out.push(rewritten);
            }
            _ => out.push(arg),
        }
    }
    out
}

/// The flag name of `-name` / `-name=value`, if `text` is a single-dash flag whose name starts
/// with a letter (so `-1`, `-` and `--x` are not).
fn single_dash_flag_name(text: &str) -> Option<&str> {
    let rest = text.strip_prefix('-')?;
    if rest.starts_with('-') {
        return None;
    }
    let name = rest.split_once('=').map_or(rest, |(name, _)| name);
    name.chars()
        .next()
        .filter(char::is_ascii_alphabetic)
        .map(|_| name)
}

/// Parses a Go duration (`time.ParseDuration`): a sequence of decimal numbers, each with an
/// optional fraction and a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), such as `300ms`,
/// `1.5h` or `1h2m3.5s`; a bare `0` is zero. Negative durations are refused: no sidecar flag
/// means anything by them.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let invalid =
        |why: &str| format!("invalid duration {s:?}: {why} (Go syntax, e.g. 15s, 1m30s, 300ms)");
    let mut rest = s;
    let mut negative = false;
    if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    } else if let Some(r) = rest.strip_prefix('-') {
        rest = r;
        negative = true;
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid("empty"));
    }
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(r) = rest.strip_prefix('.') {
            let frac_len = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            frac_part = &r[..frac_len];
            rest = &r[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid("expected a number"));
        }
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "" => return Err(invalid("missing unit")),
            _ => return Err(invalid(&format!("unknown unit {unit:?}"))),
        };
        let int_value: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid("number too large"))?
        };
        let mut nanos = int_value
            .checked_mul(unit_nanos)
            .ok_or_else(|| invalid("overflow"))?;
        // The fraction scaled by the unit, truncated to whole nanoseconds as Go does.
        let mut scale = unit_nanos;
        for digit in frac_part.bytes().take(30) {
            scale /= 10;
            if scale == 0 {
                break;
            }
            nanos += u128::from(digit - b'0') * scale;
        }
        total_nanos = total_nanos
            .checked_add(nanos)
            .ok_or_else(|| invalid("overflow"))?;
    }
    if negative && total_nanos > 0 {
        return Err(invalid("negative durations are not allowed"));
    }
    // Go's Duration is an int64 of nanoseconds.
    if total_nanos > i64::MAX as u128 {
        return Err(invalid("overflow"));
    }
    let secs = (total_nanos / 1_000_000_000) as u64;
    let sub = (total_nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

/// Parses a boolean the way Go's `strconv.ParseBool` does: `1 t T TRUE true True` and
/// `0 f F FALSE false False`.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "invalid boolean {s:?}: expected true or false (or 1, t, T, TRUE, True, 0, f, F, FALSE, False)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn normalize_rewrites_single_dash_long_flags_only() {
        let got = normalize_go_args(os(&[
            "prog",
            "-csi-address=/x",
            "-csi-address",
            "/y",
            "--csi-address=/z",
            "-v",
            "5",
            "-v=5",
            "--v=5",
            "-leader-election",
            "--leader-election=false",
            "-dummy",
            "-h",
            "-kube-api-qps",
            "-1",
            "-",
            "--",
            "-after-terminator",
        ]));
        assert_eq!(
            got,
            os(&[
                "prog",
                "--csi-address=/x",
                "--csi-address",
                "/y",
                "--csi-address=/z",
                "--v",
                "5",
                "--v=5",
                "--v=5",
                "--leader-election",
                "--leader-election=false",
                "--dummy",
                "-h",
                "--kube-api-qps",
                "-1",
                "-",
                "--",
                "-after-terminator",
            ])
        );
    }

    #[test]
    fn normalize_leaves_the_program_name_alone() {
        assert_eq!(
            normalize_go_args(os(&["-weird-prog"])),
            os(&["-weird-prog"])
        );
        assert!(normalize_go_args(Vec::<OsString>::new()).is_empty());
    }

    #[test]
    fn go_durations() {
        let ok = [
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("-0s", Duration::ZERO),
            ("+5s", Duration::from_secs(5)),
            ("15s", Duration::from_secs(15)),
            ("1m", Duration::from_secs(60)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("300ms", Duration::from_millis(300)),
            ("100us", Duration::from_micros(100)),
            ("100µs", Duration::from_micros(100)),
            ("100μs", Duration::from_micros(100)),
            ("7ns", Duration::from_nanos(7)),
            ("1h2m3.5s", Duration::from_millis(3_723_500)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("0s", Duration::ZERO),
            ("1.0000000001s", Duration::from_secs(1)),
            ("2h45m", Duration::from_secs(2 * 3600 + 45 * 60)),
        ];
        for (s, want) in ok {
            assert_eq!(parse_go_duration(s), Ok(want), "{s}");
        }
        for bad in [
            "",
            "1",
            "s",
            "1x",
            "1d",
            ".s",
            "-1s",
            "1s2",
            "1.2.3s",
            "abc",
            "9999999999h",
        ] {
            let err = parse_go_duration(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", "2", "on"] {
            assert!(parse_go_bool(bad).is_err(), "{bad}");
        }
    }
}
