//! `haunt guarantees`: its arguments, and the call of
//! [`haunt_chaos::suites::guarantees::run`], which measures each transport's delivery
//! guarantee under one seeded fault schedule, with and without the inbox.

use std::path::PathBuf;

use anyhow::Context;
use haunt_chaos::suites::guarantees::GuaranteesOptions;
use haunt_transport::TransportSpec;

#[derive(Debug, clap::Args)]
pub struct GuaranteesArgs {
    /// Transports and modes, comma-separated, as `haunt run --transport`
    /// spells them (default: every one this build has, the database queue
    /// first). Each needs its broker's server (scripts/brokers installs them).
    #[arg(long, value_delimiter = ',', value_name = "NAME[:MODE]", value_parser = TransportSpec::built)]
    pub transports: Vec<TransportSpec>,
    /// Fault runs per transport and inbox setting, seeds 1..=N.
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Length of each fault run's workload, in seconds.
    #[arg(long, default_value_t = 20)]
    pub time_limit_s: u64,
    /// Length of each fault-free run's workload, in seconds.
    #[arg(long, default_value_t = 10)]
    pub throughput_time_limit_s: u64,
    /// An empty PostgreSQL database (postgres://…) for the speed columns:
    /// for each row over a broker, `haunt bench transport` measures haunt's
    /// relay and workers against the transport's own client without the
    /// database. Without it the speed columns are left out.
    #[arg(long, value_name = "URL")]
    pub speed_db: Option<haunt_store::DbUrl>,
    /// Events of each phase of those benches [default: the transport
    /// bench's own for each transport; see `haunt bench transport --help`].
    #[arg(long)]
    pub speed_events: Option<usize>,
    /// The server behind the Kafka rows: kafka (Apache Kafka's broker, three
    /// nodes for kafka and kafka:acks-1) or tansu (one node, optional, see
    /// `haunt run --help`; not with kafka:eos or --speed-db).
    #[arg(long, value_name = "SERVER", default_value = "kafka")]
    pub kafka_server: haunt_chaos::core::options::KafkaServer,
    /// Where the runs, the table, guarantees.json and guarantees.html go.
    #[arg(long, default_value = "store")]
    pub store: PathBuf,
}

pub async fn guarantees(args: GuaranteesArgs) -> anyhow::Result<i32> {
    // Each run is a child of this very executable.
    let haunt = std::env::current_exe().context("finding the haunt executable")?;
    let transports = if args.transports.is_empty() {
        let (built, left_out): (Vec<_>, Vec<_>) = TransportSpec::all().into_iter().partition(TransportSpec::is_built);
        if !left_out.is_empty() {
            let names: Vec<String> = left_out.iter().map(ToString::to_string).collect();
            eprintln!(
                "guarantees: not in this build, so not measured: {} (cargo build --release --features brokers has every one)",
                names.join(", ")
            );
        }
        built
    } else {
        args.transports
    };
    if let Some(db) = &args.speed_db {
        anyhow::ensure!(
            db.is_postgres(),
            "--speed-db: the transport bench runs on PostgreSQL (postgres://…), not {db}"
        );
    }
    anyhow::ensure!(args.speed_events != Some(0), "--speed-events: at least 1");
    let options = GuaranteesOptions {
        haunt,
        store: args.store,
        transports,
        seeds: args.seeds,
        time_limit_s: args.time_limit_s,
        throughput_time_limit_s: args.throughput_time_limit_s,
        speed_db: args.speed_db,
        speed_events: args.speed_events,
        kafka_server: args.kafka_server,
    };
    let outcome = haunt_chaos::suites::guarantees::run(&options, &mut |line| eprintln!("{line}")).await?;
    println!("{}", outcome.table);
    println!("guarantees: {}", outcome.dir.join("guarantees.html").display());
    Ok(outcome.exit_code())
}
