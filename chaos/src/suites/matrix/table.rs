//! The matrix as a Markdown table.

use super::*;

/// The table in Markdown.
pub fn markdown(rows: &[Row], command: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| bug mode | faults | expected | caught | anomalies reported (all seeds) | median time to first anomalous op |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for row in rows {
        let expected = match row.case.expected {
            Expect::Valid => "verdict true".to_owned(),
            Expect::Anomaly(a) => format!("`{a}`"),
            Expect::NotDrained => "not drained (verdict unknown, orders pending)".to_owned(),
        };
        let caught = match (&row.skipped, row.case.expected == Expect::Valid) {
            (Some(why), _) => format!("skipped: {why}"),
            (None, true) => format!("{}/{} valid", row.passed_count(), row.runs.len()),
            (None, false) => {
                format!("{}/{}{}", row.passed_count(), row.runs.len(), if row.ok() { "" } else { " **(below 90 %)**" })
            }
        };
        let median = row.median_first_anomaly_s().map_or("-".to_owned(), |s| format!("{s:.1} s"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            row.case.name(),
            row.case.nemesis,
            expected,
            caught,
            row.reported(),
            median
        );
    }
    let _ = writeln!(out, "\nProduced by `{command}`.");
    out
}
