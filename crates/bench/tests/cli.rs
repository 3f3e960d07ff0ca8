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
fn node_scenarios_are_a_comma_list_or_the_flag_repeated() {
    // Each name is checked (the first bad one is named) before anything starts.
    for args in [
        &["node", "--scenario=hostpath-bypass,nope"][..],
        &[
            "node",
            "--scenario",
            "hostpath-bypass",
            "--scenario",
            "nope",
        ][..],
    ] {
        let (ok, _, err) = run(args);
        assert!(!ok, "{args:?}");
        assert!(err.contains("unknown scenario \"nope\""), "{args:?}: {err}");
    }
    let (ok, help, _) = run(&["node", "--help"]);
    assert!(ok);
    assert!(help.contains("--scenario <SCENARIO[,...]>"), "{help}");
}
