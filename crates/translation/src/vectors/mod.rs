//! Runs vector files in the shared format (`../shared/vectors/README.md`): one JSON object per
//! line recording what upstream's Go csi-translation-lib did for an input.
//!
//! Used by `csi-translate vectors FILE` and by the crate's tests. Every row of a public
//! function runs (`public`: called by its upstream name, arguments under upstream's parameter
//! names, several functions per row); rows of upstream's internal helpers run against this
//! crate's equivalents (`cases`), and a row this runner cannot interpret is a SKIP only when it
//! names an internal helper (a lower-case Go name), else a FAIL.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

mod cases;
mod compare;
mod outcome;
mod public;

pub use public::TRANSLATOR_FUNCTIONS;

/// One row of a vector file.
#[derive(Debug, Clone, Deserialize)]
pub struct Row {
    /// `aws-ebs`, ..., `common`, or `translator`.
    #[serde(default)]
    pub plugin: String,
    /// The upstream function.
    pub function: String,
    /// The upstream test function.
    #[serde(default)]
    pub test: String,
    /// The test case name.
    #[serde(default)]
    pub name: String,
    /// The argument(s).
    #[serde(default)]
    pub input: Value,
    /// What upstream asserts.
    #[serde(default)]
    pub expected: Value,
    /// Whether the call must fail.
    #[serde(default)]
    pub expect_error: bool,
    /// `full`, or a description of the fields upstream checked.
    #[serde(default)]
    pub compare: String,
    /// The full upstream output where it differs from `expected`.
    #[serde(default)]
    pub go_output: Option<Value>,
    /// The upstream error text.
    #[serde(default)]
    pub go_error: Option<String>,
}

/// The result of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Behaves like upstream.
    Pass,
    /// Differs; the text says how.
    Fail(String),
    /// Not run; the text says why.
    Skip(String),
}

/// One row and its verdict.
#[derive(Debug, Clone)]
pub struct RowResult {
    /// Line number in the file (1-based).
    pub line: usize,
    /// The row's plugin.
    pub plugin: String,
    /// The row's function.
    pub function: String,
    /// The row's case name.
    pub name: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// All rows of a file.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Row results in file order.
    pub rows: Vec<RowResult>,
}

impl Report {
    /// Number of passed rows.
    pub fn passed(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Pass)
            .count()
    }
    /// Number of failed rows.
    pub fn failed(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| matches!(r.verdict, Verdict::Fail(_)))
            .count()
    }
    /// Number of skipped rows.
    pub fn skipped(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| matches!(r.verdict, Verdict::Skip(_)))
            .count()
    }

    /// The report as the tool prints it: `PASS|FAIL|SKIP plugin function name` per row (a diff
    /// under a failure, the reason under a skip), then `N passed, M failed, K skipped`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for r in &self.rows {
            let (tag, detail) = match &r.verdict {
                Verdict::Pass => ("PASS", None),
                Verdict::Fail(d) => ("FAIL", Some(d)),
                Verdict::Skip(d) => ("SKIP", Some(d)),
            };
            let _ = writeln!(out, "{tag} {} {} {}", r.plugin, r.function, r.name);
            if let Some(d) = detail {
                for line in d.lines() {
                    let _ = writeln!(out, "    {line}");
                }
            }
        }
        let _ = writeln!(
            out,
            "{} passed, {} failed, {} skipped",
            self.passed(),
            self.failed(),
            self.skipped()
        );
        out
    }
}

/// Runs every non-blank line of a vector file's text.
pub fn run_str(text: &str) -> Report {
    let rows = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| match serde_json::from_str::<Row>(line) {
            Ok(row) => RowResult {
                line: i + 1,
                verdict: cases::run(&row),
                plugin: row.plugin,
                function: row.function,
                name: row.name,
            },
            Err(e) => RowResult {
                line: i + 1,
                plugin: "?".into(),
                function: "?".into(),
                name: format!("line {}", i + 1),
                verdict: Verdict::Fail(format!("not a vector row: {e}")),
            },
        })
        .collect();
    Report { rows }
}

/// Reads and runs a vector file.
pub fn run_file(path: &Path) -> crate::Result<Report> {
    let text = std::fs::read_to_string(path).map_err(|error| crate::Error::Io {
        path: path.display().to_string(),
        error,
    })?;
    Ok(run_str(&text))
}

/// Runs one row.
pub fn run_row(row: &Row) -> Verdict {
    cases::run(row)
}
