//! `haunt matrix`: each bug mode run under the faults that expose it, seed
//! after seed, and the correct build under all faults; the table says whether
//! the checker caught each one with the anomaly it should.
//!
//! [`run`] is the whole matrix: each run a child `haunt run` (a whole run with
//! its own backend, not a node of a system under test), its results read back
//! from its run directory, the table and `matrix.json` written beside them.
//!
//! - [`cases`]: the rows (the bug-mode catalogue, a transport's, a system
//!   file's);
//! - [`verdict`]: the pass rule;
//! - [`table`]: the Markdown table;
//! - [`child`]: one run as a child `haunt run`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use haunt_checker::order::REORDERED;
use haunt_checker::{Results, Verdict};
use haunt_store::Bug;
use haunt_transport::{Guarantee, OrderClaim, TransportSpec};
use serde::Serialize;

use crate::core::fault::Fault;
use crate::core::options::RunOptions;
use crate::systems::system_file::spec::SystemSpec;

pub mod cases;
pub mod child;
pub mod table;
pub mod verdict;

pub use cases::*;
pub use child::ScratchDb;
pub(crate) use child::child_run;
use child::one_run;
pub use table::markdown;
pub use verdict::*;

/// A whole matrix: which rows, how many seeds, how long each run, where.
#[derive(Debug, Clone)]
pub struct MatrixOptions {
    /// The `haunt` executable each run is started from (`haunt run`).
    pub haunt: PathBuf,
    /// Runs per bug mode (and of the correct build), seeds 1..=N.
    pub seeds: u64,
    /// Length of each run's workload, in seconds.
    pub time_limit_s: u64,
    /// A PostgreSQL server (any database URL on it); each PostgreSQL run gets
    /// a fresh database there. Without it those rows are skipped.
    pub db: Option<String>,
    /// The data directory of that server, which async-commit's runs crash.
    pub pg_data: Option<PathBuf>,
    /// Where the runs and the table go (under `matrix/<unix time>`).
    pub store: PathBuf,
    /// Only these rows: bug mode names, or `correct`; empty for all.
    pub only: Vec<String>,
    /// Only the rows on these backends (`sqlite`, `postgres`).
    pub backends: Vec<String>,
    /// A system file: the rows are its system under each fault it allows,
    /// alone and all together, instead of haunt's bug modes.
    pub system: Option<PathBuf>,
    /// A broker transport: the rows are [`transport_cases`].
    pub transport: Option<TransportSpec>,
}

/// A finished matrix.
#[derive(Debug)]
pub struct MatrixOutcome {
    /// The matrix's directory: `runs/`, `matrix.md`, `matrix.json`.
    pub dir: PathBuf,
    /// The table in Markdown, as `matrix.md` holds it.
    pub table: String,
    pub rows: Vec<Row>,
    pub verdict: MatrixVerdict,
}

fn selected(case: &Case, options: &MatrixOptions) -> bool {
    let named = options.only.is_empty()
        || options.only.iter().any(|o| match (&case.system, &case.variant) {
            (Some(_), Some(variant)) => o == variant,
            (Some(_), None) => o == &case.nemesis,
            (None, _) => o == case.row_name(),
        });
    named && options.backends.iter().any(|b| b == case.backend())
}

fn skip_reason(case: &Case, options: &MatrixOptions) -> Option<String> {
    match case.needs {
        Needs::Any if case.postgres && options.db.is_none() => Some("needs --db postgres://…".into()),
        Needs::Any => None,
        Needs::Postgres if options.db.is_none() => Some("needs --db postgres://…".into()),
        Needs::PostgresCrash if options.db.is_none() || options.pg_data.is_none() => {
            Some("needs --db postgres://… and --pg-data".into())
        }
        _ => None,
    }
}

/// Runs the matrix: every selected row, seed after seed, one child `haunt run`
/// at a time; writes `matrix.md` and `matrix.json`. `progress` gets a line as
/// the matrix starts, for each skipped row and for each finished run.
pub fn run<'a>(
    options: &'a MatrixOptions,
    progress: &'a mut (dyn FnMut(&str) + Send),
) -> futures_util::future::BoxFuture<'a, anyhow::Result<MatrixOutcome>> {
    // Boxed, as `crate::assemble::run_interruptible` says why.
    Box::pin(run_matrix(options, progress))
}

async fn run_matrix(options: &MatrixOptions, progress: &mut (dyn FnMut(&str) + Send)) -> anyhow::Result<MatrixOutcome> {
    use anyhow::Context;
    anyhow::ensure!(options.seeds > 0, "--seeds must be positive");
    anyhow::ensure!(
        options.system.is_none() || options.transport.is_none(),
        "--system and --transport: a system file brings its own transport"
    );
    // The system file, loaded once: its rows, and what `all` means for them.
    let spec = options.system.as_deref().map(crate::systems::system_file::spec::load).transpose()?;
    let all_cases = match (&spec, options.transport) {
        (Some(spec), _) => system_cases(spec)?,
        (None, Some(t)) if t.is_broker() => transport_cases(t),
        (None, _) => cases(),
    };
    let known: Vec<String> = match &options.system {
        Some(_) => all_cases.iter().map(|c| c.variant.clone().unwrap_or_else(|| c.nemesis.to_string())).collect(),
        None => all_cases.iter().map(|c| c.row_name().to_owned()).collect(),
    };
    if let Some(bad) = options.only.iter().find(|o| !known.contains(o)) {
        anyhow::bail!("--only {bad:?}: not a row; known: {}", known.join(", "));
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let dir = options.store.join("matrix").join(stamp.to_string());
    let runs_dir = dir.join("runs");
    std::fs::create_dir_all(&runs_dir).with_context(|| format!("creating {}", runs_dir.display()))?;
    progress(&format!(
        "matrix: {} seeds per row, {} s runs, into {}",
        options.seeds,
        options.time_limit_s,
        dir.display()
    ));

    let mut rows = Vec::new();
    let mut n = 0;
    for case in all_cases.into_iter().filter(|c| selected(c, options)) {
        if let Some(why) = skip_reason(&case, options) {
            progress(&format!("{:<30} SKIPPED: {why}", case.name()));
            rows.push(Row { case, runs: Vec::new(), skipped: Some(why) });
            continue;
        }
        let mut runs = Vec::new();
        for seed in 1..=options.seeds {
            n += 1;
            let started = Instant::now();
            let record = one_run(&case, seed, options, spec.as_ref(), &runs_dir, n).await;
            let what = match (&record.error, record.passed, case.expected) {
                (Some(e), _, _) => format!("ERROR {e}"),
                (None, true, Expect::Valid) => "valid".to_owned(),
                // The correct build failed: the run to shrink.
                (None, false, Expect::Valid) => {
                    format!("NOT VALID ({}); shrink: haunt shrink {}", record.verdict, record.run_dir)
                }
                (None, true, Expect::NotDrained) => {
                    format!("caught: not drained, {} orders pending", record.pending)
                }
                (None, true, _) => format!("caught {:?}", record.anomalies),
                (None, false, _) => format!("MISSED (verdict {}, {:?})", record.verdict, record.anomalies),
            };
            progress(&format!("{:<30} seed {seed:<3} {what}  [{:.0} s]", case.name(), started.elapsed().as_secs_f64()));
            runs.push(record);
        }
        rows.push(Row { case, runs, skipped: None });
    }

    let command = format!(
        "haunt matrix{}{}{} --seeds {} --time-limit-s {}{}{}{}",
        options.system.as_ref().map(|p| format!(" --system {}", p.display())).unwrap_or_default(),
        options.transport.filter(|t| t.is_broker()).map(|t| format!(" --transport {t}")).unwrap_or_default(),
        // The table holds only these rows: the line reproduces the table.
        if options.only.is_empty() { String::new() } else { format!(" --only {}", options.only.join(" ")) },
        options.seeds,
        options.time_limit_s,
        if options.backends.len() == 2 { String::new() } else { format!(" --backends {}", options.backends.join(",")) },
        if options.db.is_some() { " --db postgres://…" } else { "" },
        if options.pg_data.is_some() { " --pg-data DIR" } else { "" }
    );
    let table = markdown(&rows, &command);
    std::fs::write(dir.join("matrix.md"), &table)?;
    let json = serde_json::json!({ "seeds": options.seeds, "time_limit_s": options.time_limit_s, "rows": rows });
    std::fs::write(dir.join("matrix.json"), serde_json::to_string_pretty(&json)? + "\n")?;
    let verdict = verdict(&rows);
    Ok(MatrixOutcome { dir, table, rows, verdict })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_has_rows_and_an_at_most_once_mode_is_measured_against_its_claim() {
        for transport in TransportSpec::all().into_iter().filter(|t| t.is_broker()) {
            let cases = transport_cases(transport);
            let names: Vec<&str> = cases.iter().map(|c| c.row_name()).collect();
            if transport.claim() == Guarantee::AtMostOnce {
                assert_eq!(names, ["at-most-once"], "{transport}");
                assert_eq!(cases[0].expected, Expect::Anomaly("lost-effect"));
            } else {
                assert_eq!(names.last(), Some(&"correct"), "{transport}");
                assert!(names.contains(&"no-inbox") && names.contains(&"relay-marks-before-publish"), "{transport}");
                // Without the inbox, a redelivery is applied twice: lost acks
                // bring one, but where the next ack covers a lost one
                // (Kafka), a consumer that dies before its ack.
                let no_inbox = cases.iter().find(|c| c.bug == Some(Bug::NoInbox)).unwrap();
                // Kafka's own consumer bug, only there.
                let async_commit = cases.iter().find(|c| c.bug == Some(Bug::CommitAsyncOnReceipt));
                assert_eq!(async_commit.is_some(), transport.kind == haunt_transport::Kind::Kafka, "{transport}");
                let redelivers = if transport.acks_are_cumulative() { "kill" } else { "ack-loss" };
                assert_eq!(no_inbox.nemesis, redelivers, "{transport}");
                // Where the relay can skip the broker's confirmation, that bug
                // runs under a cut of the relay's link, which loses every
                // publish of the cut, not under a crash that loses by luck.
                let unconfirmed = cases.iter().find(|c| c.bug == Some(Bug::NoPublisherConfirms));
                assert_eq!(unconfirmed.is_some(), transport.has_publisher_confirms(), "{transport}");
                if let Some(c) = unconfirmed {
                    assert_eq!((&*c.nemesis, c.expected), ("partition", Expect::Anomaly("lost-effect")), "{transport}");
                    assert_eq!(c.tuning.fault_targets, ["relay<->broker"], "{transport}");
                }
            }
            // Where the broker keeps each key's order, every row runs keys
            // fixed in real time, and a bug that breaks the order is caught
            // as reordered; elsewhere there is no such row. (An at-most-once
            // mode's one row measures its loss.)
            let ordered = transport.order_claim() == OrderClaim::PerKey && transport.claim() != Guarantee::AtMostOnce;
            let reorder = cases.iter().find(|c| c.bug == Some(Bug::RetryAfterNext));
            assert_eq!(reorder.is_some(), ordered, "{transport}");
            if let Some(c) = reorder {
                assert_eq!((&*c.nemesis, c.expected), ("db-error", Expect::Anomaly(REORDERED)), "{transport}");
            }
            if ordered {
                assert!(
                    cases.iter().all(|c| c.tuning.ordered_keys.is_some_and(|k| k > 0)
                        || c.tuning.fault_targets == ["relay<->broker"]),
                    "{transport}"
                );
            }
            assert!(cases.iter().all(|c| c.transport == Some(transport) && c.name().contains(&transport.to_string())));
        }
    }

    #[test]
    fn every_bug_mode_has_a_row_on_each_backend_it_applies_to() {
        let cases = cases();
        for bug in Bug::ALL {
            let rows: Vec<&Case> = cases.iter().filter(|c| c.bug == Some(bug)).collect();
            let backends: Vec<bool> = rows.iter().map(|c| c.postgres).collect();
            match rows[0].needs {
                Needs::Any => assert_eq!(backends, vec![false, true], "{bug}: SQLite, then PostgreSQL"),
                _ => assert_eq!(backends, vec![true], "{bug}: PostgreSQL only"),
            }
        }
        let correct: Vec<String> = cases.iter().filter(|c| c.bug.is_none()).map(|c| c.name()).collect();
        assert_eq!(correct, vec!["correct (sqlite)", "correct (postgres)"]);
        let mut names: Vec<String> = cases.iter().map(|c| c.name()).collect();
        names.dedup();
        assert_eq!(names.len(), cases.len(), "row names are unique");
        for c in &cases {
            assert_eq!(
                c.bug.is_none(),
                c.expected == Expect::Valid,
                "{}: only the correct build expects valid",
                c.name()
            );
            if let Expect::Anomaly(a) = c.expected {
                assert!(haunt_checker::ANOMALIES.contains(&a), "{a}");
            }
        }
    }

    fn row(bug: Option<Bug>, passed: &[bool]) -> Row {
        let case = cases().into_iter().find(|c| c.bug == bug).unwrap();
        let runs =
            passed.iter().map(|&p| RunRecord { passed: p, ..RunRecord::failed_to_run(1, String::new()) }).collect();
        Row { case, runs, skipped: None }
    }

    #[test]
    fn the_pass_rule_is_nine_in_ten_for_bugs_and_all_for_the_correct_build() {
        assert!(row(Some(Bug::NoInbox), &[true; 10][..].iter().copied().chain([]).collect::<Vec<_>>()).ok());
        let mut nine = vec![true; 9];
        nine.push(false);
        assert!(row(Some(Bug::NoInbox), &nine).ok());
        let mut eight = vec![true; 8];
        eight.extend([false, false]);
        assert!(!row(Some(Bug::NoInbox), &eight).ok());
        assert!(!row(Some(Bug::NoInbox), &[false]).ok(), "one seed: it must be caught");
        assert!(!row(None, &nine).ok(), "the correct build may never fail");
        assert!(row(None, &[true, true]).ok());
        assert!(!row(Some(Bug::NoInbox), &[]).ok(), "no run: nothing passed");
    }

    #[test]
    fn a_skipped_row_makes_the_matrix_unknown_and_a_missed_one_false() {
        let skipped = |bug| Row { skipped: Some("needs --db".into()), ..row(bug, &[]) };
        let all_ran = vec![row(Some(Bug::NoInbox), &[true]), row(None, &[true])];
        assert_eq!(verdict(&all_ran), MatrixVerdict::Passed);
        assert_eq!(verdict(&all_ran).exit_code(), 0);

        let mut one_skipped = all_ran.clone();
        one_skipped.push(skipped(Some(Bug::AsyncCommit)));
        assert_eq!(verdict(&one_skipped), MatrixVerdict::Incomplete(vec!["async-commit".into()]));
        assert_eq!(verdict(&one_skipped).exit_code(), 2);

        let mut missed = one_skipped.clone();
        missed.push(row(Some(Bug::DlqDrop), &[false]));
        assert_eq!(verdict(&missed), MatrixVerdict::BelowBar(vec!["dlq-drop (sqlite)".into()]));
        assert_eq!(verdict(&missed).exit_code(), 1);
    }
}
