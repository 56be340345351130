//! `haunt matrix`: runs `haunt run` once per bug mode and seed, and the correct
//! build, and tabulates what the checker caught.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use haunt_chaos::matrix::{Case, Expect, MatrixVerdict, Needs, Row, RunRecord, ScratchDb, cases, markdown, verdict};

#[derive(Debug, clap::Args)]
pub struct MatrixArgs {
    /// Runs per bug mode (and of the correct build), seeds 1..=N.
    #[arg(long, default_value_t = 10)]
    pub seeds: u64,
    /// Length of each run's workload, in seconds.
    #[arg(long, default_value_t = 30)]
    pub time_limit_s: u64,
    /// A PostgreSQL server (any database URL on it) for the bug modes that need
    /// concurrency or a crash; each run gets a fresh database there. Without
    /// it those rows are skipped, say so, and the matrix exits 2 (unknown)
    /// unless `--only` leaves them out.
    #[arg(long)]
    pub db: Option<String>,
    /// The data directory of that server, which async-commit's runs crash.
    #[arg(long, value_name = "DIR")]
    pub pg_data: Option<PathBuf>,
    /// Where the runs and the table go.
    #[arg(long, default_value = "store")]
    pub store: PathBuf,
    /// Only these rows: bug mode names, or `correct`.
    #[arg(long, num_args = 1.., value_name = "NAME")]
    pub only: Vec<String>,
    /// Only the rows on these backends (a bug mode that needs nothing of the
    /// database has a row on each; the rest run on PostgreSQL only).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres", value_parser = ["sqlite", "postgres"])]
    pub backends: Vec<String>,
}

fn selected(case: &Case, args: &MatrixArgs) -> bool {
    let named = args.only.is_empty()
        || args.only.iter().any(|o| match case.bug {
            Some(b) => o == b.name(),
            None => o == "correct",
        });
    named && args.backends.iter().any(|b| b == case.backend())
}

fn skip_reason(case: &Case, args: &MatrixArgs) -> Option<String> {
    match case.needs {
        Needs::Any if case.postgres && args.db.is_none() => Some("needs --db postgres://…".into()),
        Needs::Any => None,
        Needs::Postgres if args.db.is_none() => Some("needs --db postgres://…".into()),
        Needs::PostgresCrash if args.db.is_none() || args.pg_data.is_none() => {
            Some("needs --db postgres://… and --pg-data".into())
        }
        _ => None,
    }
}

async fn one_run(case: &Case, seed: u64, args: &MatrixArgs, runs_dir: &Path, n: usize) -> RunRecord {
    let scratch = match (&args.db, case.postgres) {
        (Some(admin), true) => {
            match ScratchDb::create(admin, &format!("haunt_matrix_{}_{n}", std::process::id())).await {
                Ok(db) => Some(db),
                Err(e) => return RunRecord::failed_to_run(seed, format!("{e:#}")),
            }
        }
        _ => None,
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return RunRecord::failed_to_run(seed, e.to_string()),
    };
    let mut command = Command::new(exe);
    command
        .arg("run")
        .arg("--store")
        .arg(runs_dir)
        .args(["--seed", &seed.to_string(), "--time-limit-s", &args.time_limit_s.to_string()])
        .args(["--nemesis", case.nemesis, "--quiet"]);
    if !case.args.contains(&"--nemesis-interval-s") {
        // About six faults a run, however long the run: a short run must still
        // see the faults that expose its bug.
        command.args(["--nemesis-interval-s", &(args.time_limit_s as f64 / 6.0).clamp(1.0, 5.0).to_string()]);
    }
    command.args(case.args);
    if let Some(bug) = case.bug {
        command.args(["--bug", bug.name()]);
    }
    if let Some(db) = &scratch {
        command.args(["--db", &db.url]);
        if let Some(data) = &args.pg_data {
            command.arg("--pg-data").arg(data);
        }
    }
    let output = tokio::task::spawn_blocking(move || command.output()).await;
    let record = match output {
        Ok(Ok(out)) if matches!(out.status.code(), Some(0..=2)) => {
            let latest = runs_dir.join("latest");
            match std::fs::canonicalize(&latest).and_then(|dir| {
                let text = std::fs::read_to_string(dir.join("results.json"))?;
                Ok((dir, text))
            }) {
                Ok((dir, text)) => match serde_json::from_str(&text) {
                    Ok(results) => RunRecord::from_results(case, seed, dir.display().to_string(), &results),
                    Err(e) => RunRecord::failed_to_run(seed, format!("reading results: {e}")),
                },
                Err(e) => RunRecord::failed_to_run(seed, format!("finding the run: {e}")),
            }
        }
        Ok(Ok(out)) => RunRecord::failed_to_run(
            seed,
            format!("haunt run exited {:?}: {}", out.status.code(), String::from_utf8_lossy(&out.stderr).trim()),
        ),
        Ok(Err(e)) => RunRecord::failed_to_run(seed, e.to_string()),
        Err(e) => RunRecord::failed_to_run(seed, e.to_string()),
    };
    if let Some(db) = scratch {
        db.drop_now().await;
    }
    record
}

pub async fn matrix(args: MatrixArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.seeds > 0, "--seeds must be positive");
    let known: Vec<String> =
        cases().iter().filter_map(|c| c.bug.map(|b| b.name().to_owned())).chain(["correct".to_owned()]).collect();
    if let Some(bad) = args.only.iter().find(|o| !known.contains(o)) {
        anyhow::bail!("--only {bad:?}: not a row; known: {}", known.join(", "));
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let dir = args.store.join("matrix").join(stamp.to_string());
    let runs_dir = dir.join("runs");
    std::fs::create_dir_all(&runs_dir).with_context(|| format!("creating {}", runs_dir.display()))?;
    eprintln!("matrix: {} seeds per row, {} s runs, into {}", args.seeds, args.time_limit_s, dir.display());

    let mut rows = Vec::new();
    let mut n = 0;
    for case in cases().into_iter().filter(|c| selected(c, &args)) {
        if let Some(why) = skip_reason(&case, &args) {
            eprintln!("{:<30} SKIPPED: {why}", case.name());
            rows.push(Row { case, runs: Vec::new(), skipped: Some(why) });
            continue;
        }
        let mut runs = Vec::new();
        for seed in 1..=args.seeds {
            n += 1;
            let started = Instant::now();
            let record = one_run(&case, seed, &args, &runs_dir, n).await;
            let what = match (&record.error, record.passed, case.bug) {
                (Some(e), _, _) => format!("ERROR {e}"),
                (None, true, None) => "valid".to_owned(),
                (None, false, None) => format!("NOT VALID ({})", record.verdict),
                (None, true, Some(_)) if case.expected == Expect::NotDrained => {
                    format!("caught: not drained, {} orders pending", record.pending)
                }
                (None, true, Some(_)) => format!("caught {:?}", record.anomalies),
                (None, false, Some(_)) => format!("MISSED (verdict {}, {:?})", record.verdict, record.anomalies),
            };
            eprintln!("{:<30} seed {seed:<3} {what}  [{:.0} s]", case.name(), started.elapsed().as_secs_f64());
            runs.push(record);
        }
        rows.push(Row { case, runs, skipped: None });
    }

    let command = format!(
        "haunt matrix --seeds {} --time-limit-s {}{}{}{}",
        args.seeds,
        args.time_limit_s,
        if args.backends.len() == 2 { String::new() } else { format!(" --backends {}", args.backends.join(",")) },
        if args.db.is_some() { " --db postgres://…" } else { "" },
        if args.pg_data.is_some() { " --pg-data DIR" } else { "" }
    );
    let table = markdown(&rows, &command);
    std::fs::write(dir.join("matrix.md"), &table)?;
    let json = serde_json::json!({ "seeds": args.seeds, "time_limit_s": args.time_limit_s, "rows": rows });
    std::fs::write(dir.join("matrix.json"), serde_json::to_string_pretty(&json)? + "\n")?;
    println!("{table}");
    println!("matrix: {}", dir.join("matrix.md").display());
    let verdict = verdict(&rows);
    match &verdict {
        MatrixVerdict::Passed => eprintln!("matrix: every row ran and met its bar"),
        MatrixVerdict::BelowBar(rows) => eprintln!("matrix: below the bar: {}", rows.join(", ")),
        MatrixVerdict::Incomplete(rows) => eprintln!(
            "matrix: UNKNOWN: these rows did not run: {} (give --db and --pg-data, or ask for fewer rows with --only or --backends sqlite)",
            rows.join(", ")
        ),
    }
    Ok(verdict.exit_code())
}
