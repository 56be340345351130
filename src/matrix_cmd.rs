//! `haunt matrix`: its arguments, and the call of [`haunt_chaos::suites::matrix::run`],
//! which runs `haunt run` once per bug mode and seed, and the correct build, and
//! tabulates what the checker caught.

use std::path::PathBuf;

use anyhow::Context;
use haunt_chaos::suites::matrix::MatrixOptions;

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
    /// A system file (docs/system-format.md): instead of haunt's bug modes,
    /// run that system under each fault it allows, alone and all together,
    /// seed after seed; every run must be valid. `--only` then names faults.
    #[arg(long, value_name = "FILE")]
    pub system: Option<PathBuf>,
    /// A broker transport (as `haunt run --transport` spells it): instead of
    /// the database queue's rows, the pipeline over that broker, the bug
    /// modes of a consumer and a relay each under the fault that exposes it,
    /// and the correct build under the broker's faults; for an at-most-once
    /// mode, its claim: with its only consumer killed, it loses.
    #[arg(long, value_name = "NAME[:MODE]", value_parser = haunt_transport::TransportSpec::built)]
    pub transport: Option<haunt_transport::TransportSpec>,
}

impl MatrixArgs {
    fn into_options(self, haunt: PathBuf) -> MatrixOptions {
        MatrixOptions {
            haunt,
            seeds: self.seeds,
            time_limit_s: self.time_limit_s,
            db: self.db,
            pg_data: self.pg_data,
            store: self.store,
            only: self.only,
            backends: self.backends,
            system: self.system,
            transport: self.transport,
        }
    }
}

pub async fn matrix(args: MatrixArgs) -> anyhow::Result<i32> {
    // Each run is a child of this very executable.
    let haunt = std::env::current_exe().context("finding the haunt executable")?;
    let options = args.into_options(haunt);
    let outcome = haunt_chaos::suites::matrix::run(&options, &mut |line| eprintln!("{line}")).await?;
    println!("{}", outcome.table);
    println!("matrix: {}", outcome.dir.join("matrix.md").display());
    eprintln!("matrix: {}", outcome.verdict.summary());
    Ok(outcome.verdict.exit_code())
}
