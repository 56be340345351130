//! The schema's migrations, embedded in the binary.
//!
//! sqlx's `migrate!` macro embeds them at compile time, but its macros crate
//! builds sqlx's drivers, and SQLite's C source, a second time for the
//! compiler: a minute and more of every clean build's CPU. These are the same
//! migrations with the same version, description and checksum, so a database
//! migrated by a build with the macro takes this one's and the other way
//! round; a test holds the list to the files of each directory.

use std::borrow::Cow;
use std::sync::LazyLock;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr};

/// A migrator of the files named, each `VERSION_DESCRIPTION` of `dir`.
macro_rules! embedded {
    ($dir:literal: $($file:literal),+ $(,)?) => {
        LazyLock::new(|| Migrator::with_migrations(vec![$(
            migration($file, include_str!(concat!("../../migrations/", $dir, "/", $file, ".sql"))),
        )+]))
    };
}

pub(super) static SQLITE: LazyLock<Migrator> =
    embedded!("sqlite": "0001_pipeline", "0002_inbox_deliveries", "0003_key_seq", "0004_publish_seq");

pub(super) static POSTGRES: LazyLock<Migrator> = embedded!("postgres":
    "0001_pipeline", "0002_inbox_deliveries", "0003_key_seq", "0004_outbox_seq", "0005_publish_seq", "0006_lean_queue");

/// One migration as sqlx reads it from a file named `file.sql`: the version
/// before the first `_`, the rest with spaces for `_` as its description.
fn migration(file: &'static str, sql: &'static str) -> Migration {
    let (version, description) = file.split_once('_').expect("a migration file is VERSION_DESCRIPTION");
    let version = version.parse().expect("a migration's version is an integer");
    let no_tx = sql.starts_with("-- no-transaction");
    Migration::new(
        version,
        Cow::Owned(description.replace('_', " ")),
        MigrationType::Simple,
        AssertSqlSafe(sql).into_sql_str(),
        no_tx,
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// What identifies a migration in `_sqlx_migrations`.
    fn identities(m: &Migrator) -> Vec<(i64, String, Vec<u8>, bool)> {
        m.iter().map(|m| (m.version, m.description.to_string(), m.checksum.to_vec(), m.no_tx)).collect()
    }

    async fn assert_same_as_directory(embedded: &Migrator, dir: &str) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("migrations").join(dir);
        let read = Migrator::new(path).await.expect("the migrations directory reads");
        assert!(read.iter().all(|m| m.migration_type == MigrationType::Simple), "{dir}: only simple migrations");
        assert_eq!(identities(embedded), identities(&read), "{dir}: every file embedded, the same as sqlx reads it");
    }

    #[tokio::test]
    async fn the_embedded_migrations_are_the_files_as_sqlx_reads_them() {
        assert_same_as_directory(&SQLITE, "sqlite").await;
        assert_same_as_directory(&POSTGRES, "postgres").await;
    }
}
