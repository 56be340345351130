//! The terminal table of `haunt guarantees`, and the files it writes: the
//! claim of each guarantee beside what its rows measured, every row, the
//! findings and what was not measured.

use std::fmt::Write as _;
use std::path::Path;

use super::{GuaranteesOptions, Row, page, set_speeds};

/// Writes `guarantees.txt`, `guarantees.json` (with `"complete"`: whether
/// every row has run) and `guarantees.html` for the rows so far, with their
/// speeds; returns the table.
pub(super) fn write_outputs(
    dir: &Path,
    rows: &mut [Row],
    options: &GuaranteesOptions,
    complete: bool,
) -> anyhow::Result<String> {
    set_speeds(rows);
    let mut command = format!(
        "haunt guarantees --transports {} --seeds {} --time-limit-s {} --throughput-time-limit-s {}",
        options.transports.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(","),
        options.seeds,
        options.time_limit_s,
        options.throughput_time_limit_s
    );
    if options.kafka_server != crate::core::options::KafkaServer::Kafka {
        let _ = write!(command, " --kafka-server {}", options.kafka_server);
    }
    if options.speed_db.is_some() {
        command.push_str(" --speed-db URL");
        if let Some(n) = options.speed_events {
            let _ = write!(command, " --speed-events {n}");
        }
    }
    let table = table(rows, &command);
    std::fs::write(dir.join("guarantees.txt"), &table)?;
    let json = serde_json::json!({
        "command": command,
        "complete": complete,
        "seeds": options.seeds,
        "time_limit_s": options.time_limit_s,
        "throughput_time_limit_s": options.throughput_time_limit_s,
        "rows": rows,
    });
    std::fs::write(dir.join("guarantees.json"), serde_json::to_string_pretty(&json)? + "\n")?;
    std::fs::write(dir.join("guarantees.html"), page::render(rows, &command))?;
    Ok(table)
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// What the tutorial's table says of a guarantee: lost, duplicated, speed.
fn tutorial(claim: &str) -> (&'static str, &'static str, &'static str) {
    match claim {
        "at-most-once" => ("yes", "no", "fast"),
        "at-least-once" => ("no", "yes", "normal"),
        _ => ("no", "no", "slow"),
    }
}

/// The terminal table: the tutorial's shape first (each guarantee, the claim
/// beside what its rows without an inbox measured, then at-least-once with
/// the inbox), then every row, the findings and the runs that did not run.
pub fn table(rows: &[Row], command: &str) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "{command}\n");
    claims(&mut t, rows);
    let _ = writeln!(t);
    every_row(&mut t, rows);
    findings(&mut t, rows);
    not_measured(&mut t, rows);
    t
}

/// One line a guarantee: the tutorial's claim / what its rows measured.
fn claims(t: &mut String, rows: &[Row]) {
    let _ = writeln!(
        t,
        "{:<24} {:<24} {:<26} {:<34} rows",
        "guarantee", "lost: claim / measured", "duplicated: claim / measured", "speed: claim / vs its first mode"
    );
    let classes: [(&str, &str, bool); 4] = [
        ("at-most-once", "at-most-once", false),
        ("at-least-once", "at-least-once", false),
        ("exactly-once", "exactly-once", false),
        // With the inbox, "duplicated" is about effects: applied twice.
        ("at-least-once + inbox", "at-least-once", true),
    ];
    for (name, claim, inbox) in classes {
        let done: Vec<&Row> =
            rows.iter().filter(|r| r.claim == claim && r.inbox == inbox && r.matches_claim.is_some()).collect();
        if done.is_empty() {
            continue;
        }
        let (lost, duplicated, speed) = tutorial(claim);
        let duplicated = if inbox { "no" } else { duplicated };
        let lost_measured = done.iter().any(|r| r.lost > 0);
        let dup_measured = done
            .iter()
            .any(|r| r.applied_more_than_once > 0 || (!inbox && r.delivered_more_than_once.unwrap_or(0) > 0));
        let speeds: Vec<f64> = done.iter().filter_map(|r| r.mode_speed).collect();
        let speed_range = match (speeds.iter().copied().reduce(f64::min), speeds.iter().copied().reduce(f64::max)) {
            (Some(lo), Some(hi)) if hi - lo < 0.005 => format!("{lo:.2}"),
            (Some(lo), Some(hi)) => format!("{lo:.2}-{hi:.2}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            t,
            "{name:<24} {:<24} {:<26} {:<34} {}",
            format!("{lost} / {}", yes_no(lost_measured)),
            format!("{duplicated} / {}", yes_no(dup_measured)),
            format!("{speed} / {speed_range}"),
            done.len()
        );
    }
}

/// A row's transport as the table names it: `×3` on a Kafka cluster, `on
/// tansu` on tansu.
pub(super) fn label(r: &Row) -> String {
    match (r.server, r.brokers) {
        (Some(server), _) => format!("{} on {server}", r.transport),
        (None, n) if n > 1 => format!("{} ×{n}", r.transport),
        (None, _) => r.transport.clone(),
    }
}

/// One line a row: its figures, what reconciliation repaired, and whether
/// it matches its claim.
fn every_row(t: &mut String, rows: &[Row]) {
    let width = rows.iter().map(|r| label(r).chars().count()).max().unwrap_or(0).max(22);
    let _ = writeln!(
        t,
        "{:<width$} {:<6} {:<14} {:>6} {:>11} {:>13} {:<24} {:>9} {:>6} {:>10} {:>11} {:<26} matches",
        "transport",
        "inbox",
        "claim",
        "lost",
        "delivered>1",
        "applied twice",
        "order kept?",
        "events/s",
        "speed",
        "bare ev/s",
        "p99 lag ms",
        "reconcile"
    );
    for r in rows {
        let reconcile = match &r.repaired_by_reconcile {
            Some(p) => format!(
                "{} re-enqueued, {} fixed, {}",
                p.requeued,
                p.projection_corrected,
                if p.lost_after == 0 && p.projection_mismatch_after == 0 { "then valid" } else { "STILL WRONG" }
            ),
            None if r.inbox => "-".into(),
            None => "n/a (needs the inbox)".into(),
        };
        let _ = writeln!(
            t,
            "{:<width$} {:<6} {:<14} {:>6} {:>11} {:>13} {:<24} {:>9} {:>6} {:>10} {:>11} {:<26} {}",
            label(r),
            yes_no(r.inbox),
            r.claim,
            r.lost,
            r.delivered_more_than_once.map_or("-".into(), |d| d.to_string()),
            r.applied_more_than_once,
            order_kept(r),
            r.events_per_s.map_or("-".into(), |e| format!("{e:.0}")),
            r.speed.map_or("-".into(), |s| format!("{s:.2}")),
            bare_rate(r),
            r.effect_lag_ms_p99.map_or("-".into(), |l| format!("{l:.0}")),
            reconcile,
            match r.matches_claim {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "not measured",
            }
        );
    }
}

/// The bare client's rate in the row's mode, end to end, from its
/// transport bench.
pub(super) fn bare_rate(r: &Row) -> String {
    r.transport_speed.as_ref().and_then(|s| s.bare_events_per_s).map_or("-".into(), |e| format!("{e:.0}"))
}

/// The order column: the claim, then what was measured. Under `per-key`,
/// "yes" or "NO" with the overtaken orders; under `none`, the overtaken
/// orders as a figure.
pub(super) fn order_kept(r: &Row) -> String {
    if r.matches_claim.is_none() && r.order_pairs == 0 {
        return format!("{}: -", r.order_claim);
    }
    let verdict = match (r.order_claim, r.overtaken) {
        ("per-key", 0) => "yes".to_owned(),
        ("per-key", n) => format!("NO, {n} overtaken"),
        (_, n) => format!("{n} overtaken"),
    };
    format!("{}: {verdict}", r.order_claim)
}

fn findings(t: &mut String, rows: &[Row]) {
    let findings: Vec<&Row> = rows.iter().filter(|r| r.finding.is_some()).collect();
    if findings.is_empty() {
        return;
    }
    let _ = writeln!(t, "\nfindings:");
    for r in findings {
        let dirs: Vec<&str> = r.runs.iter().filter_map(|run| run.run_dir.as_deref()).collect();
        let _ = writeln!(
            t,
            "  {} ({}): {}\n    runs: {}",
            r.transport,
            if r.inbox { "inbox" } else { "no inbox" },
            r.finding.as_deref().unwrap_or_default(),
            dirs.join(" ")
        );
        // A contradicted claim's failing runs, each to shrink to a smaller one.
        if r.matches_claim == Some(false) {
            for run in r.runs.iter().filter(|run| run.verdict.as_deref().is_some_and(|v| v != "true")) {
                if let Some(dir) = &run.run_dir {
                    let _ = writeln!(t, "    shrink: haunt shrink {dir}");
                }
            }
        }
    }
}

/// The runs that failed to run, each with its error.
fn not_measured(t: &mut String, rows: &[Row]) {
    let errors: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            let name = format!("{} {}", r.transport, if r.inbox { "inbox" } else { "no-inbox" });
            let runs = r.runs.iter().filter_map(move |run| run.error.as_ref().map(|e| (run.seed, e.clone())));
            let (n, t) = (name.clone(), name.clone());
            let speed = r.transport_speed.as_ref().and_then(|s| s.error.as_ref());
            runs.map(move |(seed, e)| format!("  {n} seed {seed}: {e}"))
                .chain(r.throughput.error.iter().map(move |e| format!("  {t} no faults: {e}")))
                .chain(speed.map(move |e| format!("  {name} speed: {e}")))
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(t, "\nnot measured:\n{}", errors.join("\n"));
    }
}
