//! A run of the matrix as a child `haunt run`, on a scratch PostgreSQL
//! database of its own when its row needs one.

use std::process::Command;

use haunt_store::DbUrl;

use super::*;

/// One run of `case` as a child `haunt run`, on a scratch database of its own
/// when the case runs on PostgreSQL; whatever goes wrong is the record's error.
/// `spec` is the system file of `--system`, loaded once for the matrix.
pub(super) async fn one_run(
    case: &Case,
    seed: u64,
    options: &MatrixOptions,
    spec: Option<&SystemSpec>,
    runs_dir: &Path,
    n: usize,
) -> RunRecord {
    let scratch = match (&options.db, case.postgres) {
        (Some(admin), true) => {
            match ScratchDb::create(admin, &format!("haunt_matrix_{}_{n}", std::process::id())).await {
                Ok(db) => Some(db),
                Err(e) => return RunRecord::failed_to_run(seed, format!("{e:#}")),
            }
        }
        _ => None,
    };
    let run = run_options(case, seed, options, spec, runs_dir, scratch.as_ref().map(|db| &db.url));
    let record = match run {
        Ok(run) => match child_run(&options.haunt, &run, &format!("matrix-{n}")).await {
            Ok((dir, results)) => RunRecord::from_results(case, seed, dir.display().to_string(), &results),
            Err(e) => RunRecord::failed_to_run(seed, e),
        },
        Err(e) => RunRecord::failed_to_run(seed, format!("{e:#}")),
    };
    if let Some(db) = scratch {
        db.drop_now().await;
    }
    record
}

/// The options of one run of `case`: `haunt run`'s defaults, the matrix's
/// time limit and store, the row's tuning, bug mode, transport and faults.
fn run_options(
    case: &Case,
    seed: u64,
    options: &MatrixOptions,
    spec: Option<&SystemSpec>,
    runs_dir: &Path,
    db: Option<&DbUrl>,
) -> anyhow::Result<RunOptions> {
    let mut run = RunOptions {
        store: runs_dir.to_owned(),
        seed,
        time_limit: Duration::from_secs(options.time_limit_s),
        // About six faults a run, however long the run: a short run must
        // still see the faults that expose its bug (a row's tuning may say
        // otherwise).
        nemesis_interval: Duration::from_secs_f64((options.time_limit_s as f64 / 6.0).clamp(1.0, 5.0)),
        quiet: true,
        system: options.system.clone(),
        variant: case.variant.clone(),
        bug: case.bug,
        transport: case.transport.unwrap_or_default(),
        db: db.cloned(),
        pg_data: db.and(options.pg_data.clone()),
        exe: options.haunt.clone(),
        ..RunOptions::default()
    };
    case.tuning.apply(&mut run);
    // A variant's row narrows its faults as the variant says.
    if let Some(v) = spec.and_then(|s| s.variants.iter().find(|v| Some(&v.name) == case.variant.as_ref())) {
        run.fault_targets.clone_from(&v.fault_targets);
    }
    // What `all` means, as `haunt run` resolves it: the file's faults, or
    // what the pipeline's layout can take.
    let all = match spec {
        Some(spec) => crate::systems::system_file::faults_allowed(spec),
        None => run.pipeline_faults(),
    };
    run.faults = Fault::parse_list(&case.nemesis, &all)?;
    Ok(run)
}

/// Runs `run` as a child `haunt run --options FILE` (`haunt` is the
/// executable) to its end, and reads back its run directory and results;
/// an exit other than a verdict's (0, 1 or 2), or a run without results, is
/// the error. The options file, named after `name`, lives in the run's store
/// while the child runs.
pub(crate) async fn child_run(haunt: &Path, run: &RunOptions, name: &str) -> Result<(PathBuf, Results), String> {
    let runs_dir = run.store.clone();
    let file = runs_dir.join(format!(".{name}.options.json"));
    let json = serde_json::to_string_pretty(run).map_err(|e| format!("writing the run's options: {e}"))?;
    std::fs::write(&file, json).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let mut command = Command::new(haunt);
    command.arg("run").arg("--options").arg(&file);
    crate::backends::local::interrupt_when_parent_dies(&mut command);
    let out = tokio::task::spawn_blocking(move || command.output()).await;
    let _ = std::fs::remove_file(&file);
    let out = match out {
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
    pub url: DbUrl,
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
        let url = DbUrl::parse(&format!("{base}/{name}"))?;
        Ok(ScratchDb { admin_url: admin_url.to_owned(), name: name.to_owned(), url })
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
