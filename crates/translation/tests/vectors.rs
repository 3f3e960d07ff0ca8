//! Every row of the shared vector file (recorded from upstream's Go csi-translation-lib) must
//! pass through the library's vectors runner: none may fail, and no row of a public function
//! may be skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use std::path::PathBuf;

use csi_translation::vectors::{self, Verdict};

fn vector_file() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("CSI_RS_SHARED")
            .map(|d| PathBuf::from(d).join("vectors/translation.jsonl")),
        Some(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/vectors/translation.jsonl"),
        ),
    ];
    candidates.into_iter().flatten().find(|p| p.is_file())
}

#[test]
fn every_upstream_vector_passes() {
    let Some(path) = vector_file() else {
        eprintln!(
            "SKIP: translation.jsonl not found (set CSI_RS_SHARED to the shared dir, or keep ../shared next to the clone)"
        );
        return;
    };
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
