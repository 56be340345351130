//! Command-line parsing and dispatch.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::services;

#[derive(Debug, Parser)]
#[command(
    name = "haunt",
    version,
    about = "Jepsen-style chaos harness for at-least-once event pipelines",
    long_about = "Jepsen-style chaos harness for at-least-once event pipelines.\n\n\
        It runs a reference outbox/inbox pipeline (api, workers, reconcile), injects \
        faults while clients record a history, and checks from that history and the \
        final state that no acknowledged order was lost and no event applied twice."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the order API (POST /orders) over a store.
    Api(services::ApiArgs),
    /// Run a worker: lease messages, apply them once through the inbox, ack.
    Worker(services::WorkerArgs),
    /// Rebuild the projection from the orders; print the drift per item.
    Reconcile(services::ReconcileArgs),
    /// Move dead letters back to the queue.
    Redrive(services::RedriveArgs),
    /// Run a test: start the pipeline, drive orders while faults hit it, heal,
    /// check, report. Exit status as for `haunt check` (130 when interrupted).
    Run(crate::run_cmd::RunArgs),
    /// Run every bug mode under the faults that expose it, and the correct build
    /// under all faults; show what the checker caught. Exit 1 if a bug mode is
    /// caught in fewer than 9 runs in 10, or the correct build is ever not valid.
    Matrix(crate::matrix_cmd::MatrixArgs),
    /// Benchmarks, each against a baseline measured in the same run.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// Check a run directory (history.jsonl + final-state.jsonl) and write results.json.
    ///
    /// Exit status: 0 valid, 1 invalid (anomalies found), 2 unknown, 65 input that
    /// does not follow the run-directory format (file and line on stderr), 66 no
    /// such directory.
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// The run directory.
    dir: PathBuf,
    /// Print the results as JSON instead of the human summary.
    #[arg(long)]
    json: bool,
}

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // 64 (EX_USAGE), not clap's 2: `haunt check` already means "unknown" by 2.
            return if e.use_stderr() { 64 } else { 0 };
        }
    };
    match cli.command {
        Command::Check(args) => check(args),
        Command::Bench(crate::bench::BenchCommand::Harness(args)) => {
            run_async_code("haunt bench", async { crate::bench::harness(args).await.map(|()| 0) })
        }
        Command::Bench(crate::bench::BenchCommand::Check(args)) => match crate::bench::check(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("haunt bench: {e:#}");
                1
            }
        },
        Command::Api(args) => run_async(services::api(args)),
        Command::Worker(args) => run_async(services::worker(args)),
        Command::Reconcile(args) => run_async(services::reconcile(args)),
        Command::Redrive(args) => run_async(services::redrive(args)),
        Command::Matrix(args) => run_async_code("haunt matrix", crate::matrix_cmd::matrix(args)),
        Command::Run(args) => run_async_code("haunt run", crate::run_cmd::run(args)),
    }
}

/// Runs a service or tool on a multi-threaded runtime; errors print their chain.
fn run_async(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> i32 {
    run_async_code("haunt", async { fut.await.map(|()| 0) })
}

/// Like [`run_async`] for commands whose exit status is a verdict; an error
/// exits 3, apart from every verdict.
fn run_async_code(name: &str, fut: impl std::future::Future<Output = anyhow::Result<i32>>) -> i32 {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("haunt: starting the runtime: {e}");
            return 70;
        }
    };
    match runtime.block_on(fut) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            3
        }
    }
}

fn check(args: CheckArgs) -> i32 {
    let results = match haunt_checker::check_dir(&args.dir) {
        Ok(results) => results,
        Err(e) => {
            eprintln!("haunt check: {e}");
            return e.exit_code();
        }
    };
    let json = match serde_json::to_string_pretty(&results) {
        Ok(json) => json,
        Err(e) => {
            eprintln!("haunt check: serializing results: {e}");
            return 70;
        }
    };
    let out = args.dir.join(haunt_format::RESULTS_FILE);
    if let Err(e) = std::fs::write(&out, format!("{json}\n")) {
        eprintln!("haunt check: writing {}: {e}", out.display());
        return 73;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", haunt_checker::summary::render(&results));
        println!("\nresults: {}", out.display());
    }
    results.valid.exit_code()
}
