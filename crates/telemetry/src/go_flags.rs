//! Go's flag syntax (pflag/klog, as the Go sidecars and drivers parse their command lines)
//! rewritten into what clap parses, so existing manifests' argument lists start our binaries
//! unchanged. Here rather than in `sidecar` so that the EBS driver, which must not pull in a
//! Kubernetes client, uses the same rewriting.

use std::ffi::OsString;

/// Rewrites Go-style arguments into the form clap accepts.
///
/// - A single-dash flag whose name is longer than one letter (`-csi-address=/x`,
///   `-leader-election`, `-timeout 15s`) gets a second dash.
/// - `-v` (klog's verbosity, a single letter) becomes `--v`, so `-v 5`, `-v=5` and `--v=5` all
///   reach the `--v` flag (`sidecar::CommonFlags::v`). Other single letters (`-h`, `-V`) stay clap short flags.
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
}
