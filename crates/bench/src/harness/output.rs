//! How every benchmark prints its report: the same three flags on each subcommand, so that a
//! command that works for one scenario works for the next.

use std::path::PathBuf;

use serde::Serialize;

/// What `--output` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The human-readable table(s).
    #[value(alias = "text")]
    Table,
    /// The whole report as one JSON document.
    Json,
}

/// `--output`, `--json` and `--json-file`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportFlags {
    /// How to print the report: table (or text), or json.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    pub output: Format,

    /// Print the report as JSON instead of the table (the same as --output=json).
    #[arg(long)]
    pub json: bool,

    /// Also write the JSON report to this file, whatever is printed.
    #[arg(long, value_name = "PATH")]
    pub json_file: Option<PathBuf>,
}

impl ReportFlags {
    /// Whether the report is printed as JSON.
    pub fn json(&self) -> bool {
        self.json || self.output == Format::Json
    }

    /// Writes `report` to --json-file if asked, then prints it as JSON or as `table` makes it.
    pub fn emit<R: Serialize>(
        &self,
        report: &R,
        table: impl FnOnce(&R) -> String,
    ) -> Result<(), crate::Error> {
        let json = serde_json::to_string_pretty(report)
            .map_err(|e| crate::Error::Other(format!("encoding the report as JSON: {e}")))?;
        if let Some(path) = &self.json_file {
            std::fs::write(path, format!("{json}\n")).map_err(|source| crate::Error::Io {
                op: format!("writing the report to {}", path.display()),
                source,
            })?;
        }
        if self.json() {
            println!("{json}");
        } else {
            print!("{}", table(report));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        report: ReportFlags,
    }

    fn parse(args: &[&str]) -> Result<ReportFlags, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.report)
    }

    #[test]
    fn every_spelling_of_json_and_table_is_taken() {
        assert!(!parse(&[]).unwrap().json());
        assert!(!parse(&["-o", "text"]).unwrap().json());
        assert!(!parse(&["--output=table"]).unwrap().json());
        assert!(parse(&["--output", "json"]).unwrap().json());
        assert!(parse(&["--json"]).unwrap().json());
        let e = parse(&["--output", "yaml"]).err().unwrap().to_string();
        assert!(e.contains("--output"), "{e}");
    }

    #[test]
    fn the_json_file_gets_the_whole_report_whatever_is_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let flags = parse(&["--json-file", path.to_str().unwrap()]).unwrap();
        let mut printed_table = false;
        flags
            .emit(&serde_json::json!({"pods": 3}), |_| {
                printed_table = true;
                String::new()
            })
            .unwrap();
        assert!(printed_table);
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(written["pods"], 3);
        let unwritable = parse(&["--json-file", "/nonexistent-dir/r.json"]).unwrap();
        let e = unwritable.emit(&1, |_| String::new()).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/r.json"), "{e}");
    }
}
