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
    /// Publish the outbox to a broker: lease outbox rows, publish them, wait
    /// for the broker's confirmation, then delete them (with --transport).
    Relay(services::RelayArgs),
    /// Rebuild the projection from the orders; print the drift per item.
    Reconcile(services::ReconcileArgs),
    /// Move dead letters back to the queue.
    Redrive(services::RedriveArgs),
    /// Run a test: start the pipeline, drive orders while faults hit it, heal,
    /// check, report. Exit status as for `haunt check` (130 when interrupted).
    Run(Box<crate::run_cmd::RunArgs>),
    /// Run every bug mode under the faults that expose it, and the correct build
    /// under all faults; show what the checker caught. Exit 1 if a bug mode is
    /// caught in fewer than 9 runs in 10, or the correct build is ever not valid;
    /// exit 2 (unknown) if a row could not run (no --db) and --only did not
    /// leave it out.
    Matrix(crate::matrix_cmd::MatrixArgs),
    /// Measure each transport's delivery guarantee: the same seeded faults
    /// (consumer kill, broker restart, partition, ack loss, relay kill) with
    /// and without the inbox, reconcile afterwards, then a fault-free run for
    /// speed; the tutorial's table with claim and measurement side by side.
    /// `kafka` and `kafka:acks-1` run on a cluster of three brokers, whose
    /// nodes a partition may cut off (a leader's failover), and a loss under a
    /// fault its claim makes no promise for (acks=1 under a leader's loss) is
    /// reported, not called a contradiction.
    /// Exit 1 if a row contradicts its claim, 2 if a row could not be measured.
    Guarantees(crate::guarantees_cmd::GuaranteesArgs),
    /// From a failing run to a smaller one that still fails the same way:
    /// fewer fault windows (ddmin), shorter holds, a shorter run, fewer
    /// clients, each candidate rerun a few times. Writes DIR/shrunk/ with the
    /// schedule, the options to replay and every candidate tried.
    Shrink(crate::shrink_cmd::ShrinkArgs),
    /// Benchmarks, each against a baseline measured in the same run. In a
    /// build with the feature `bench` (`cargo build --release --features
    /// bench`); the README's first command leaves them out.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// Check a run directory (history.jsonl + final-state.jsonl, from haunt or any
    /// other tool) and write results.json and report.html beside them.
    ///
    /// Exit status: 0 valid, 1 invalid (anomalies found), 2 unknown, 65 input that
    /// does not follow the run-directory format (file and line on stderr), 66 no
    /// such directory.
    Check(CheckArgs),
    /// Remove every container and network that haunt runs created (labelled
    /// io.haunt.run), e.g. after a harness was killed with SIGKILL.
    Clean(CleanArgs),
    /// Exit 0 when a service answers its health URL with 2xx within 2 s, 1
    /// otherwise: the container images' HEALTHCHECK.
    Healthcheck(HealthcheckArgs),
}

#[derive(Debug, clap::Args)]
struct CleanArgs {
    /// List what would be removed; remove nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, clap::Args)]
struct HealthcheckArgs {
    /// The URL to ask.
    #[arg(env = "HAUNT_HEALTH_URL", default_value = "http://127.0.0.1:8080/healthz")]
    url: String,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// The run directory.
    dir: PathBuf,
    /// Print the results as JSON instead of the human summary.
    #[arg(long)]
    json: bool,
    /// What the run promises about the order of one key's (item's) orders,
    /// instead of run.json's `order_claim`: `per-key` makes each order that
    /// took effect before one acknowledged ahead of it the anomaly
    /// `reordered`; `none` leaves inversions as figures.
    #[arg(long, value_name = "CLAIM", value_parser = ["none", "per-key"])]
    claim_order: Option<String>,
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
        Command::Healthcheck(args) => run_async(healthcheck(args)),
        Command::Clean(args) => clean(args),
        Command::Bench(_) if !haunt_bench::BUILT => {
            eprintln!("haunt bench: {}", haunt_bench::NOT_BUILT);
            64
        }
        Command::Bench(command) => {
            if cfg!(debug_assertions) {
                eprintln!("haunt bench: {UNOPTIMIZED}");
            }
            bench(command)
        }
        Command::Api(args) => run_async(services::api(args)),
        Command::Worker(args) => {
            let threads = args.threads;
            run_async_on(threads, services::worker(args))
        }
        Command::Relay(args) => run_async(services::relay(args)),
        Command::Reconcile(args) => run_async(services::reconcile(args)),
        Command::Redrive(args) => run_async(services::redrive(args)),
        Command::Matrix(args) => run_async_code("haunt matrix", crate::matrix_cmd::matrix(args)),
        Command::Guarantees(args) => run_async_code("haunt guarantees", crate::guarantees_cmd::guarantees(args)),
        Command::Shrink(args) => run_async_code("haunt shrink", crate::shrink_cmd::shrink(args)),
        Command::Run(args) => run_async_code("haunt run", crate::run_cmd::run(*args)),
    }
}

/// What `haunt bench` says first in a build without optimisation (the
/// README's first command builds one; a bench's figures are a release
/// build's).
const UNOPTIMIZED: &str = "warning: this haunt is a dev build, without optimisation: its figures are not what \
     a release build measures. Build one with `cargo build --release --features bench`.";

fn bench(command: crate::bench::BenchCommand) -> i32 {
    use crate::bench::BenchCommand;
    match command {
        BenchCommand::Harness(args) => {
            run_async_code("haunt bench", async { crate::bench::harness(args).await.map(|()| 0) })
        }
        BenchCommand::Pipeline(args) => {
            run_async_code("haunt bench", async { crate::bench::pipeline(args).await.map(|()| 0) })
        }
        BenchCommand::Transport(args) => {
            run_async_code("haunt bench", async { crate::bench::transport(args).await.map(|()| 0) })
        }
        BenchCommand::Check(args) => match crate::bench::check(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("haunt bench: {e:#}");
                1
            }
        },
    }
}

/// Runs a service or tool on a multi-threaded runtime; errors print their chain.
fn run_async(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> i32 {
    run_async_on(0, fut)
}

/// [`run_async`] on a runtime of `threads` worker threads (0: one per core,
/// or `TOKIO_WORKER_THREADS`).
fn run_async_on(threads: usize, fut: impl std::future::Future<Output = anyhow::Result<()>>) -> i32 {
    run_async_code_on("haunt", threads, async { fut.await.map(|()| 0) })
}

/// Like [`run_async`] for commands whose exit status is a verdict; an error
/// exits 3, apart from every verdict.
fn run_async_code(name: &str, fut: impl std::future::Future<Output = anyhow::Result<i32>>) -> i32 {
    run_async_code_on(name, 0, fut)
}

/// [`run_async_code`] on a runtime of `threads` worker threads (0: one per
/// core, or `TOKIO_WORKER_THREADS`).
fn run_async_code_on(name: &str, threads: usize, fut: impl std::future::Future<Output = anyhow::Result<i32>>) -> i32 {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if threads > 0 {
        builder.worker_threads(threads);
    }
    let runtime = match builder.build() {
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

fn clean(args: CleanArgs) -> i32 {
    let result = if args.dry_run {
        haunt_chaos::backends::docker::leftovers().map(|names| {
            for name in &names {
                println!("{name}");
            }
            println!("{} to remove", names.len());
        })
    } else {
        haunt_chaos::backends::docker::clean()
            .map(|(containers, networks)| println!("removed {containers} containers and {networks} networks"))
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("haunt clean: {e:#}");
            1
        }
    }
}

async fn healthcheck(args: HealthcheckArgs) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(2)).build()?;
    let status = http.get(&args.url).send().await?.status();
    anyhow::ensure!(status.is_success(), "{} answered {status}", args.url);
    Ok(())
}

fn check(args: CheckArgs) -> i32 {
    let claim = args.claim_order.as_deref().map(|c| c.parse().expect("clap checked the value"));
    let results = match haunt_checker::check_dir_claiming(&args.dir, claim) {
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
    // After results.json, which stands whatever becomes of the report.
    let report = haunt_report::write(&args.dir, &results);
    if args.json {
        println!("{json}");
    } else {
        print!("{}", haunt_checker::summary::render(&results));
        println!("\nresults: {}", out.display());
        if let Ok(path) = &report {
            println!("report: {}", path.display());
        }
    }
    match report {
        Ok(_) => results.valid.exit_code(),
        Err(e) => {
            // 73 (EX_CANTCREAT), apart from every verdict, as for results.json.
            eprintln!("haunt check: {e:#}");
            73
        }
    }
}
