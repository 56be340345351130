//! The `[final_state]` section: the file's queries, run through sqlx on the
//! system's own database (SQLite or PostgreSQL), each row a line of
//! `final-state.jsonl`, its columns named as the line's fields.

use std::time::Duration;

use haunt_format::{Applied, DeadLetter, FinalLine, OrderRow, Pending, ProjectionRow};
use serde_json::{Map, Value};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Column, Row};

use crate::core::system::FinalSink;
use crate::systems::system_file::spec::FinalDecl;

/// The system's database, connected on first use: a SQLite file does not
/// exist until the system has created it.
#[derive(Debug)]
pub struct Database {
    url: String,
    pool: tokio::sync::OnceCell<AnyPool>,
}

/// A column a query may leave out, and the value it then gets.
type ColumnDefault = (&'static str, fn() -> Value);

/// Columns a system may leave out of a query, and what they mean then.
fn defaults(kind: &str) -> &'static [ColumnDefault] {
    match kind {
        // Without them the application still counts; it is placed at the start.
        "applied" => &[
            ("delivery_attempt", || Value::from(0)),
            ("worker_id", || Value::from("")),
            ("applied_at_ms", || Value::from(0)),
        ],
        _ => &[],
    }
}

impl Database {
    pub fn new(url: String) -> Database {
        Database { url, pool: tokio::sync::OnceCell::new() }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    async fn pool(&self) -> anyhow::Result<&AnyPool> {
        self.pool
            .get_or_try_init(|| async {
                sqlx::any::install_default_drivers();
                AnyPoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(&self.url)
                    .await
                    .map_err(|e| anyhow::anyhow!("final_state.database: connecting to {}: {e}", self.url))
            })
            .await
    }

    /// `field`: the query's name in errors (`final_state.orders`).
    async fn rows(&self, field: &str, sql: &str) -> anyhow::Result<Vec<AnyRow>> {
        let pool = self.pool().await?;
        // The file's own SQL, run as written: the system file is the user's, as
        // the database is.
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .map_err(|e| anyhow::anyhow!("{field} failed: {e}\n  the query: {sql}"))
    }

    /// Whether the system is quiet: the `quiet` query's one value is true (or
    /// a non-zero integer), else the `pending` query returns no row. `None`:
    /// the file gives neither.
    pub async fn is_quiet(&self, decl: &FinalDecl) -> anyhow::Result<Option<bool>> {
        if let Some(sql) = &decl.quiet {
            return self.truth("final_state.quiet", sql).await.map(Some);
        }
        if let Some(sql) = &decl.pending {
            return Ok(Some(self.rows("final_state.pending", sql).await?.is_empty()));
        }
        Ok(None)
    }

    /// The first value of `sql`'s first row, as a boolean: a boolean, or a
    /// number other than 0. `field` names the query in errors.
    pub async fn truth(&self, field: &str, sql: &str) -> anyhow::Result<bool> {
        let rows = self.rows(field, sql).await?;
        let row = rows.first().ok_or_else(|| anyhow::anyhow!("{field} returned no row\n  the query: {sql}"))?;
        match value(row, 0) {
            Value::Bool(b) => Ok(b),
            Value::Number(n) => Ok(n.as_f64() != Some(0.0)),
            other => anyhow::bail!("{field}: {other} is neither a boolean nor a number\n  the query: {sql}"),
        }
    }

    /// Every query's rows into `sink`, as lines.
    pub async fn read(&self, decl: &FinalDecl, sink: &mut FinalSink<'_>) -> anyhow::Result<()> {
        let queries = [
            ("orders", "order", Some(&decl.orders)),
            ("applied", "applied", decl.applied.as_ref()),
            ("projection", "projection", Some(&decl.projection)),
            ("pending", "pending", decl.pending.as_ref()),
            ("dead_letters", "dead_letter", decl.dead_letters.as_ref()),
        ];
        for (field, kind, sql) in queries {
            let Some(sql) = sql else { continue };
            for (i, row) in self.rows(&format!("final_state.{field}"), sql).await?.iter().enumerate() {
                let line = line(kind, row).map_err(|e| {
                    anyhow::anyhow!("final_state.{field}, row {}: {e} (columns are named as the fields of `{kind}` lines; AS renames)\n  the query: {sql}", i + 1)
                })?;
                sink(line)?;
            }
        }
        Ok(())
    }

    pub async fn close(&self) {
        if let Some(pool) = self.pool.get() {
            pool.close().await;
        }
    }
}

/// One column's value, whatever its SQL type: an integer, a float, text, a
/// boolean, or null.
fn value(row: &AnyRow, i: usize) -> Value {
    if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
        return v.map_or(Value::Null, Value::from);
    }
    if let Ok(Some(v)) = row.try_get::<Option<i32>, _>(i) {
        return Value::from(v);
    }
    if let Ok(Some(v)) = row.try_get::<Option<f64>, _>(i) {
        return Value::from(v);
    }
    if let Ok(Some(v)) = row.try_get::<Option<String>, _>(i) {
        return Value::from(v);
    }
    if let Ok(Some(v)) = row.try_get::<Option<bool>, _>(i) {
        return Value::from(v);
    }
    Value::Null
}

/// A row as the line of `kind`, text that reads as a number taken as one
/// where a number is due.
fn line(kind: &str, row: &AnyRow) -> Result<FinalLine, String> {
    let mut fields = Map::new();
    for (i, column) in row.columns().iter().enumerate() {
        fields.insert(column.name().to_owned(), value(row, i));
    }
    for (name, default) in defaults(kind) {
        fields.entry(name.to_owned()).or_insert_with(default);
    }
    let v = Value::Object(fields);
    let parsed = match kind {
        "order" => serde_json::from_value::<OrderRow>(numbers_as_text(v, &["order_id", "item_id", "event_id"]))
            .map(FinalLine::Order),
        "applied" => {
            serde_json::from_value::<Applied>(numbers_as_text(v, &["event_id", "order_id", "item_id", "worker_id"]))
                .map(FinalLine::Applied)
        }
        "projection" => {
            serde_json::from_value::<ProjectionRow>(numbers_as_text(v, &["item_id"])).map(FinalLine::Projection)
        }
        "pending" => {
            serde_json::from_value::<Pending>(numbers_as_text(v, &["message_id", "event_id"])).map(FinalLine::Pending)
        }
        _ => serde_json::from_value::<DeadLetter>(numbers_as_text(v, &["message_id", "event_id", "last_error"]))
            .map(FinalLine::DeadLetter),
    };
    parsed.map_err(|e| e.to_string())
}

/// Ids a system keeps as integers are text in the run format.
fn numbers_as_text(mut v: Value, fields: &[&str]) -> Value {
    if let Value::Object(map) = &mut v {
        for f in fields {
            if let Some(n @ Value::Number(_)) = map.get(*f) {
                let text = n.to_string();
                map.insert((*f).to_owned(), Value::from(text));
            }
        }
    }
    v
}
