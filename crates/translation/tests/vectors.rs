//! Every row of the upstream vector file (`tests/vectors/translation.jsonl`, recorded from
//! upstream's Go csi-translation-lib) must pass through the library's vectors runner: none may
//! fail, and no row of a public function may be skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use std::path::PathBuf;

use csi_translation::vectors::{self, Verdict};

/// The upstream vectors, kept in the repo (`tests/vectors/README.md` says where they came from).
fn vector_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/translation.jsonl")
}

#[test]
fn every_upstream_vector_passes() {
    let path = vector_file();
    let report = vectors::run_file(&path).expect("read vector file");
    let rendered = report.render();
    println!("{rendered}");
    assert_eq!(report.rows.len(), 189, "the shared file has 189 rows");
    assert_eq!(report.failed(), 0, "failed rows:\n{rendered}");
    for row in &report.rows {
        if let Verdict::Skip(why) = &row.verdict {
            assert!(
                row.function.starts_with(|c: char| c.is_lowercase()),
                "public function row skipped: {} {} {}: {why}",
                row.plugin,
                row.function,
                row.name
            );
        }
    }
    assert_eq!(
        report.skipped(),
        0,
        "every helper row has an equivalent here:\n{rendered}"
    );
}

#[test]
fn a_wrong_expectation_fails_and_the_closing_line_counts_it() {
    let good = r#"{"plugin":"aws-ebs","function":"KubernetesVolumeIDToEBSVolumeID","name":"ok","input":{"kubernetesID":"aws:///vol-1"},"expected":{"ebsVolumeID":"vol-1"},"expect_error":false,"compare":"ebsVolumeID (only when no error)"}"#;
    let bad = r#"{"plugin":"aws-ebs","function":"KubernetesVolumeIDToEBSVolumeID","name":"bad","input":{"kubernetesID":"aws:///vol-1"},"expected":{"ebsVolumeID":"vol-2"},"expect_error":false,"compare":"ebsVolumeID (only when no error)"}"#;
    let helper = r#"{"plugin":"aws-ebs","function":"someHelper","name":"h","input":{},"expected":null,"expect_error":false,"compare":"full"}"#;
    let public = r#"{"plugin":"aws-ebs","function":"SomethingPublic","name":"p","input":{},"expected":null,"expect_error":false,"compare":"full"}"#;
    let report = vectors::run_str(&[good, bad, helper, public].join("\n"));
    let text = report.render();
    assert!(
        text.contains("PASS aws-ebs KubernetesVolumeIDToEBSVolumeID ok"),
        "{text}"
    );
    assert!(
        text.contains("FAIL aws-ebs KubernetesVolumeIDToEBSVolumeID bad"),
        "{text}"
    );
    assert!(
        text.contains("vol-2"),
        "the diff shows the expected value: {text}"
    );
    assert!(text.contains("SKIP aws-ebs someHelper h"), "{text}");
    assert!(
        text.contains("FAIL aws-ebs SomethingPublic p"),
        "an unknown public function never skips: {text}"
    );
    assert!(
        text.trim_end().ends_with("1 passed, 2 failed, 1 skipped"),
        "{text}"
    );
}

fn extra_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/extra.jsonl")
}

/// Every public function of upstream's `CSITranslator`, each in the shapes upstream's
/// signatures suggest (`tests/vectors/extra.jsonl`): bare objects and objects under the Go
/// parameter names, nil arguments, errors, chained and multi-function rows, per-plugin rows.
#[test]
fn extra_rows_of_every_public_function_pass() {
    let report = vectors::run_file(&extra_file()).expect("read extra.jsonl");
    let rendered = report.render();
    println!("{rendered}");
    assert_eq!(report.rows.len(), 62, "{rendered}");
    assert_eq!(report.passed(), 62, "{rendered}");
    let text = std::fs::read_to_string(extra_file()).unwrap();
    // The runner's own list of upstream's CSITranslator methods (its type pins all 12).
    for f in vectors::TRANSLATOR_FUNCTIONS {
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|r: &serde_json::Value| r["plugin"] == "translator" && r["function"] == f)
            .collect();
        assert!(rows.len() >= 2, "{f}: a success and an error/negative row");
        assert!(
            rows.iter().any(|r| r["expect_error"] == true
                || r["expected"] == false
                || r["expected"]
                    .as_object()
                    .is_some_and(|m| m.values().any(|v| v == false))),
            "{f}: a failing or negative case"
        );
    }
}

/// The same rows with each expectation changed (or an error no longer expected) must all fail:
/// the runner really compares every shape.
#[test]
fn every_extra_row_fails_when_its_expectation_is_wrong() {
    let text = std::fs::read_to_string(extra_file()).unwrap();
    let mut mutated = Vec::new();
    for line in text.lines() {
        let mut r: serde_json::Value = serde_json::from_str(line).unwrap();
        if r["expect_error"] == true {
            r["expect_error"] = false.into();
        } else {
            let e = &mut r["expected"];
            match e {
                serde_json::Value::Bool(b) => *b = !*b,
                serde_json::Value::String(s) => s.push('x'),
                serde_json::Value::Object(m) => {
                    let (_, v) = m.iter_mut().next().unwrap();
                    *v = match v.take() {
                        serde_json::Value::Bool(b) => (!b).into(),
                        serde_json::Value::String(s) => format!("{s}x").into(),
                        _ => serde_json::json!({"unexpected": "1"}),
                    };
                }
                other => panic!("unexpected expected value {other}"),
            }
        }
        mutated.push(r.to_string());
    }
    let report = vectors::run_str(&mutated.join("\n"));
    let rendered = report.render();
    assert_eq!(report.failed(), 62, "{rendered}");
}

#[test]
fn multi_function_rows_check_each_function_and_reject_unknown_ones() {
    let keyed = r#"{"plugin":"translator","function":"GetCSINameFromInTreeName","name":"k","input":{"pluginName":"kubernetes.io/cinder"},"expected":{"GetCSINameFromInTreeName":"cinder.csi.openstack.org","IsMigratableIntreePluginByName":false},"expect_error":false,"compare":"full"}"#;
    let unknown = r#"{"plugin":"translator","function":"IsPVMigratable+NoSuchFunction","name":"u","input":{"pv":null},"expected":false,"expect_error":false,"compare":"full"}"#;
    let report = vectors::run_str(&[keyed, unknown].join("\n"));
    let text = report.render();
    assert!(
        text.contains("IsMigratableIntreePluginByName:\n")
            && text.contains("expected false, got true"),
        "the wrong one of two named results is reported: {text}"
    );
    assert!(text.contains("NoSuchFunction in this runner"), "{text}");
    assert_eq!(report.failed(), 2, "{text}");
}
