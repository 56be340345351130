//! A run of the matrix as a child `haunt run`, on a scratch PostgreSQL
//! database of its own when its row needs one.

use std::process::Command;

use super::*;

/// One run of `case` as a child `haunt run`, on a scratch database of its own
/// when the case runs on PostgreSQL; whatever goes wrong is the record's error.
pub(super) async fn one_run(case: &Case, seed: u64, options: &MatrixOptions, runs_dir: &Path, n: usize) -> RunRecord {
    let scratch = match (&options.db, case.postgres) {
        (Some(admin), true) => {
            match ScratchDb::create(admin, &format!("haunt_matrix_{}_{n}", std::process::id())).await {
                Ok(db) => Some(db),
                Err(e) => return RunRecord::failed_to_run(seed, format!("{e:#}")),
            }
        }
        _ => None,
    };
    let mut command = Command::new(&options.haunt);
    command.arg("run");
    if let Some(system) = &options.system {
        command.arg("--system").arg(system);
    }
    command
        .arg("--store")
        .arg(runs_dir)
        .args(["--seed", &seed.to_string(), "--time-limit-s", &options.time_limit_s.to_string()])
        .args(["--nemesis", case.nemesis, "--quiet"]);
    if !case.args.contains(&"--nemesis-interval-s") {
        // About six faults a run, however long the run: a short run must still
        // see the faults that expose its bug.
        command.args(["--nemesis-interval-s", &(options.time_limit_s as f64 / 6.0).clamp(1.0, 5.0).to_string()]);
    }
    command.args(case.args);
    if let Some(bug) = case.bug {
        command.args(["--bug", bug.name()]);
    }
    if let Some(transport) = case.transport {
        command.args(["--transport", &transport.to_string()]);
    }
    if let Some(db) = &scratch {
        command.args(["--db", &db.url]);
        if let Some(data) = &options.pg_data {
            command.arg("--pg-data").arg(data);
        }
    }
    let record = match child_run(command, runs_dir).await {
        Ok((dir, results)) => RunRecord::from_results(case, seed, dir.display().to_string(), &results),
        Err(e) => RunRecord::failed_to_run(seed, e),
    };
    if let Some(db) = scratch {
        db.drop_now().await;
    }
    record
}

/// Runs `command`, a child `haunt run --store runs_dir …`, to its end, and
/// reads back its run directory and results; an exit other than a verdict's
/// (0, 1 or 2), or a run without results, is the error.
pub(crate) async fn child_run(mut command: Command, runs_dir: &Path) -> Result<(PathBuf, Results), String> {
    crate::backends::local::interrupt_when_parent_dies(&mut command);
    let out = match tokio::task::spawn_blocking(move || command.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(e) => return Err(e.to_string()),
    };
    if !matches!(out.status.code(), Some(0..=2)) {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("haunt run exited {:?}: {}", out.status.code(), stderr.trim()));
    }
    let dir = std::fs::canonicalize(runs_dir.join("latest")).map_err(|e| format!("finding the run: {e}"))?;
    let text = std::fs::read_to_string(dir.join("results.json")).map_err(|e| format!("finding the run: {e}"))?;
    let results = serde_json::from_str(&text).map_err(|e| format!("reading results: {e}"))?;
    Ok((dir, results))
}

/// A database of its own for each PostgreSQL run, on the server behind
/// `admin_url`; dropped with the value.
#[derive(Debug)]
pub struct ScratchDb {
    admin_url: String,
    name: String,
    pub url: String,
}

impl ScratchDb {
    pub async fn create(admin_url: &str, name: &str) -> anyhow::Result<ScratchDb> {
        use anyhow::Context;
        use sqlx::Connection;
        let mut conn =
            sqlx::PgConnection::connect(admin_url).await.with_context(|| format!("connecting to {admin_url}"))?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
            .execute(&mut conn)
            .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await?;
        let _ = conn.close().await;
        let (base, _) = admin_url.split_once('?').unwrap_or((admin_url, ""));
        let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
        Ok(ScratchDb { admin_url: admin_url.to_owned(), name: name.to_owned(), url: format!("{base}/{name}") })
    }

    pub async fn drop_now(self) {
        use sqlx::Connection;
        if let Ok(mut conn) = sqlx::PgConnection::connect(&self.admin_url).await {
            let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await;
            let _ = conn.close().await;
        }
    }
}
