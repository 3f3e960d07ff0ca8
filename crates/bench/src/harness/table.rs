//! Tables of several runs: each row takes one run's report to a number, and a cell shows the
//! runs of one column as "median (min-max)", or one value when they agree.

use std::fmt::Write as _;

/// How a row's value is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Seconds,
    Count,
    /// Per volume, two decimals.
    Ratio,
    Bytes,
}

/// One row: a label and how to get its value from a run's report `R` and the run's size (pods,
/// claims); `None` when the row does not apply to that run.
pub struct Row<R> {
    pub label: &'static str,
    pub unit: Unit,
    pub value: fn(&R, usize) -> Option<f64>,
}

impl<R> Row<R> {
    pub const fn new(label: &'static str, unit: Unit, value: fn(&R, usize) -> Option<f64>) -> Self {
        Self { label, unit, value }
    }
}

fn number(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Seconds | Unit::Ratio => format!("{v:.2}"),
        Unit::Count => format!("{v:.0}"),
        Unit::Bytes => format!("{:.1}", v / (1024.0 * 1024.0)),
    }
}

fn suffix(unit: Unit) -> &'static str {
    match unit {
        Unit::Seconds => " s",
        Unit::Bytes => " MiB",
        Unit::Count | Unit::Ratio => "",
    }
}

/// The median (the mean of the middle two for an even count), min and max; `None` when empty.
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 0 {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    Some((median, v[0], v[v.len() - 1]))
}

/// One cell: "n/a", a value, or "median (min-max)" when the runs differ.
pub fn cell(unit: Unit, values: &[f64]) -> String {
    match spread(values) {
        None => "n/a".to_owned(),
        Some((median, min, max)) => {
            let (lo, hi) = (number(unit, min), number(unit, max));
            if lo == hi {
                format!("{}{}", number(unit, median), suffix(unit))
            } else {
                format!("{} ({lo}-{hi}){}", number(unit, median), suffix(unit))
            }
        }
    }
}

/// A process's command line as a table shows it: `bin` and its arguments but those starting
/// with one of `varying` (temp paths, ports: what differs from run to run).
pub fn command_line(bin: &str, args: &[String], varying: &[&str]) -> String {
    let kept = args
        .iter()
        .map(String::as_str)
        .filter(|a| !varying.iter().any(|v| a.starts_with(v)));
    std::iter::once(bin)
        .chain(kept)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first run of each column of a table of runs, in the order the columns first ran.
pub fn first_runs<R, C: PartialEq>(runs: &[R], column_of: impl Fn(&R) -> C) -> Vec<&R> {
    let mut seen: Vec<(C, &R)> = Vec::new();
    for r in runs {
        let c = column_of(r);
        if !seen.iter().any(|(s, _)| *s == c) {
            seen.push((c, r));
        }
    }
    seen.into_iter().map(|(_, r)| r).collect()
}

/// A table of runs: a header line with each column's name, then one line per row with one cell
/// per column, each cell over the runs whose `column_of` is that column (columns in the order
/// the runs first show them). `size` is handed to each row's value; `widths` are the label's
/// and each cell's.
pub fn grid<R, C: PartialEq + std::fmt::Display>(
    rows: &[Row<R>],
    runs: &[R],
    column_of: impl Fn(&R) -> C,
    size: usize,
    widths: (usize, usize),
) -> String {
    let (label_width, cell_width) = widths;
    let columns: Vec<C> = first_runs(runs, &column_of)
        .into_iter()
        .map(&column_of)
        .collect();
    let mut out = format!("{:<label_width$}", "");
    for c in &columns {
        let _ = write!(out, " {:>cell_width$}", c.to_string());
    }
    out.push('\n');
    for row in rows {
        let _ = write!(out, "{:<label_width$}", row.label);
        for c in &columns {
            let values: Vec<f64> = runs
                .iter()
                .filter(|r| column_of(r) == *c)
                .filter_map(|r| (row.value)(r, size))
                .collect();
            let _ = write!(out, " {:>cell_width$}", cell(row.unit, &values));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_leave_out_what_varies() {
        let args = [
            "--kubeconfig=/tmp/x/kc",
            "--v=5",
            "--csi-address=/tmp/s",
            "--timeout=15s",
        ]
        .map(String::from);
        let varying = &["--kubeconfig=", "--csi-address="];
        assert_eq!(
            command_line("csi-attacher", &args, varying),
            "csi-attacher --v=5 --timeout=15s"
        );
        assert_eq!(command_line("bin", &[], varying), "bin");
    }

    #[test]
    fn spread_takes_the_middle() {
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(spread(&[f64::NAN, 1.0]), Some((1.0, 1.0, 1.0)));
    }

    #[test]
    fn cells_show_the_range_only_when_runs_differ() {
        assert_eq!(cell(Unit::Seconds, &[]), "n/a");
        assert_eq!(cell(Unit::Seconds, &[5.191]), "5.19 s");
        assert_eq!(
            cell(Unit::Seconds, &[5.19, 5.03, 5.66]),
            "5.19 (5.03-5.66) s"
        );
        assert_eq!(cell(Unit::Count, &[1000.0, 1000.0]), "1000");
        assert_eq!(cell(Unit::Ratio, &[1.0, 1.001]), "1.00");
        assert_eq!(
            cell(
                Unit::Bytes,
                &[70.0 * 1048576.0, 68.0 * 1048576.0, 73.0 * 1048576.0]
            ),
            "70.0 (68.0-73.0) MiB"
        );
    }

    #[test]
    fn rows_put_each_run_in_its_column() {
        let runs = [("a", 1.0), ("b", 5.0), ("a", 3.0)];
        let table: &[Row<(&str, f64)>] = &[
            Row::new("time", Unit::Seconds, |r, _| Some(r.1)),
            Row::new("per pod", Unit::Ratio, |r, n| {
                (r.0 == "b").then(|| r.1 / n as f64)
            }),
        ];
        let firsts: Vec<(&str, f64)> = first_runs(&runs, |r| r.0).into_iter().copied().collect();
        assert_eq!(firsts, [("a", 1.0), ("b", 5.0)]);
        let text = grid(table, &runs, |r| r.0, 10, (8, 14));
        assert_eq!(
            text,
            "                      a              b\n\
             time     2.00 (1.00-3.00) s         5.00 s\n\
             per pod             n/a           0.50\n"
        );
    }
}
