//! The `csi-bench` binary: one command, a subcommand per benchmark, errors on stderr with a
//! non-zero exit.

#![allow(clippy::unwrap_used)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_csi-bench");

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_lists_every_benchmark_and_each_has_its_own_help() {
    let (ok, out, _) = run(&["--help"]);
    assert!(ok);
    for sub in ["attacher", "adc", "node", "provision"] {
        assert!(out.contains(&format!("  {sub} ")), "{sub} missing:\n{out}");
        let (ok, help, err) = run(&[sub, "--help"]);
        assert!(ok, "{sub} --help: {err}");
        assert!(
            help.contains(&format!("Usage: csi-bench {sub} [OPTIONS]")),
            "{help}"
        );
        // The long help is the benchmark's own description, examples included.
        assert!(help.contains(&format!("csi-bench {sub} --")), "{help}");
    }
}

#[test]
fn a_bad_configuration_fails_with_the_reason() {
    let (ok, _, err) = run(&["attacher", "--attacher-bin", "/bin/true", "--count", "0"]);
    assert!(!ok);
    assert!(
        err.contains("csi-bench attacher") && err.contains("must be at least 1"),
        "{err}"
    );
    let (ok, _, err) = run(&["adc", "--adc-bin", "/bin/true"]);
    assert!(!ok);
    assert!(err.contains("--attacher-bin"), "{err}");
}

#[test]
fn go_style_single_dash_flags_are_accepted() {
    // `-runs=x` is `--runs=x` (as the Go components take flags), so the error is about its value.
    let (ok, _, err) = run(&["provision", "-runs=x"]);
    assert!(!ok);
    assert!(err.contains("invalid value 'x' for '--runs"), "{err}");
    let (ok, _, err) = run(&[
        "node",
        "--pods=1",
        "--nodes",
        "0",
        "-v=2",
        "--scenario=nope",
    ]);
    assert!(!ok);
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn scenarios_are_a_comma_list_or_the_flag_repeated() {
    // Every benchmark checks each name (the first bad one is named, with the choices) before
    // anything starts.
    for (bench, known, required) in [
        ("node", "hostpath-bypass", None),
        ("adc", "through-adc", Some("--adc-bin=/bin/true")),
        ("provision", "hostpath", None),
        ("stack", "ebs", None),
    ] {
        let list = format!("--scenario={known},nope");
        let comma = [bench, list.as_str()];
        let repeated = [bench, "--scenario", known, "--scenario", "nope"];
        for args in [&comma[..], &repeated[..]] {
            let args: Vec<&str> = args.iter().copied().chain(required).collect();
            let (ok, _, err) = run(&args);
            assert!(!ok, "{args:?}");
            let refused = err
                .lines()
                .find(|l| l.contains("--scenario \"nope\": want one of"));
            assert!(
                refused.is_some_and(|l| l.contains(known)),
                "{args:?}: {err}"
            );
        }
        let (ok, help, _) = run(&[bench, "--help"]);
        assert!(ok);
        assert!(
            help.contains("--scenario <SCENARIO[,...]>"),
            "{bench}: {help}"
        );
    }
}
