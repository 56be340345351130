//! haunt's workers against a consumer over pgmq written as pgmq's
//! documentation shows one (`haunt bench pipeline --pgmq-sql FILE`): the same
//! server, the same batch size, as many consumers as haunt's workers run
//! lease loops, and the same effect. pgmq's SQL is not haunt's to ship: the
//! bench installs the file it is given (pgmq's SQL-only install) into the
//! bench's database and drops it after.
//!
//! The two drains alternate (pgmq, haunt, pgmq, … pgmq), each of haunt's
//! against the mean of the pgmq drains on either side of it, as the limit is
//! paired in [`mod@crate::pipeline`]: the machine's drift stays out of the ratio.

use std::path::{Path, PathBuf};

use anyhow::Context;
use haunt_store::{Baseline, DbUrl};
use serde_json::json;

use crate::cpu::{CpuClock, CpuSpent};
use crate::pipeline::Drained;

/// pgmq's SQL, read before any phase runs, so that a bad path fails at once.
#[derive(Debug, Clone)]
pub(crate) struct PgmqSql {
    pub path: PathBuf,
    pub text: String,
}

impl PgmqSql {
    pub fn read(path: &Path, db: &DbUrl) -> anyhow::Result<PgmqSql> {
        anyhow::ensure!(
            db.is_postgres(),
            "--pgmq-sql needs a PostgreSQL database (--db postgres://…): pgmq is PostgreSQL's"
        );
        let text = std::fs::read_to_string(path).with_context(|| format!("reading --pgmq-sql {}", path.display()))?;
        anyhow::ensure!(!text.trim().is_empty(), "--pgmq-sql {}: the file is empty", path.display());
        Ok(PgmqSql { path: path.to_owned(), text })
    }
}

/// The paired rounds against pgmq.
#[derive(Debug)]
pub(crate) struct AgainstPgmq {
    /// The SQL's file and size, for the report.
    pub sql: (PathBuf, usize),
    pub consumers: usize,
    pub pgmq: Vec<f64>,
    pub haunt: Vec<f64>,
    pub ratios: Vec<f64>,
    /// What each drain cost the machine and this process (pgmq's drains,
    /// then haunt's), where /proc says.
    pub pgmq_cpu: Vec<Option<CpuSpent>>,
    pub haunt_cpu: Vec<Option<CpuSpent>>,
    /// The WAL the server wrote during each drain, in bytes (pgmq's, then
    /// haunt's): most of what a write costs a PostgreSQL server.
    pub pgmq_wal: Vec<Option<i64>>,
    pub haunt_wal: Vec<Option<i64>>,
    /// Events per drain.
    pub events: usize,
}

impl AgainstPgmq {
    pub fn median_ratio(&self) -> f64 {
        haunt_checker::stats::quantile(&mut self.ratios.clone(), 0.5).unwrap_or(f64::NAN)
    }

    /// The median over `drains` of the machine's and this process's CPU per
    /// event, in µs; `None` where any drain went unmeasured.
    pub fn cpu_us_per_event(&self, drains: &[Option<CpuSpent>]) -> Option<(f64, f64)> {
        let spent: Vec<CpuSpent> = drains.iter().copied().collect::<Option<_>>()?;
        let per_event = |f: fn(&CpuSpent) -> f64| {
            let mut v: Vec<f64> = spent.iter().map(|c| f(c) * 1e6 / self.events as f64).collect();
            haunt_checker::stats::quantile(&mut v, 0.5)
        };
        Some((per_event(|c| c.machine_s)?, per_event(|c| c.own_s)?))
    }

    /// The median over `drains` of the WAL written per event, in bytes;
    /// `None` where any drain went unmeasured.
    pub fn wal_bytes_per_event(&self, drains: &[Option<i64>]) -> Option<f64> {
        let mut v: Vec<f64> = drains.iter().map(|b| b.map(|b| b as f64 / self.events as f64)).collect::<Option<_>>()?;
        haunt_checker::stats::quantile(&mut v, 0.5)
    }

    pub fn json(&self, batch_size: u32) -> serde_json::Value {
        let cpu = |drains: &[Option<CpuSpent>]| {
            self.cpu_us_per_event(drains).map(|(machine, own)| json!({"machine": machine, "bench_process": own}))
        };
        json!({
            "sql": self.sql.0.display().to_string(),
            "sql_bytes": self.sql.1,
            "consumer": "client-side: pgmq.read of a batch; inbox, projection and ledger in one transaction; pgmq.delete of the batch",
            "consumers": self.consumers,
            "batch_size": batch_size,
            "pgmq": self.pgmq,
            "haunt": self.haunt,
            "ratios": self.ratios,
            "median_ratio": self.median_ratio(),
            "cpu_us_per_event_median": {
                "note": "busy CPU of the whole machine (/proc/stat) and of the bench process, whose consumers these are, over each drain; the difference is the server's",
                "pgmq": cpu(&self.pgmq_cpu),
                "haunt": cpu(&self.haunt_cpu),
            },
            "wal_bytes_per_event_median": {
                "note": "WAL the server wrote over each drain (pg_current_wal_insert_lsn before and after), by every session",
                "pgmq": self.wal_bytes_per_event(&self.pgmq_wal),
                "haunt": self.wal_bytes_per_event(&self.haunt_wal),
            },
        })
    }
}

/// One drain of `n` messages sent to pgmq's queue, by `consumers` consumers
/// on a pool of their own, warmed before the clock starts; every event
/// checked applied once, then the queue dropped and the tables emptied.
pub(crate) async fn pgmq_phase(
    baseline: &Baseline,
    db: &DbUrl,
    (n, items): (usize, usize),
    consumers: usize,
    batch: i64,
) -> anyhow::Result<Drained> {
    if !baseline.pgmq_enqueue(n, items).await? {
        eprintln!("warning: pgmq drain: no checkpoint before it (CHECKPOINT needs a superuser or pg_checkpoint)");
    }
    let pool = Baseline::connect(db, consumers as u32).await?;
    pool.warm(consumers as u32).await?;
    let p = pool.clone();
    let wal_start = baseline.wal_position().await;
    let clock = CpuClock::now();
    let rate = crate::pipeline::timed(n, consumers, move |t| {
        let p = p.clone();
        async move { Ok(p.pgmq_drain(t, batch).await?) }
    })
    .await;
    let cpu = clock.and_then(CpuClock::spent);
    let wal_bytes = crate::pipeline::wal_since(baseline, wal_start).await;
    pool.close().await;
    let drained = Drained { events_per_s: rate?, cpu, wal_bytes };
    let left = baseline.pgmq_queued().await?;
    anyhow::ensure!(left == 0, "pgmq drain: {left} messages still in its queue");
    crate::pipeline::verify_drained(baseline, n, "pgmq drain", crate::pipeline::Record::Numbered).await?;
    baseline.pgmq_drop_queue().await?;
    baseline.reset().await?;
    Ok(drained)
}
