//! Test databases: a fresh SQLite file or a fresh PostgreSQL database per test.
//!
//! PostgreSQL comes from `HAUNT_TEST_POSTGRES_URL` (`scripts/test` starts a
//! throwaway server and sets it), or, with `HAUNT_TEST_POSTGRES=container`, from
//! a fresh container per database started by testcontainers (image
//! `haunt-postgres:latest` from `scripts/images`, or `HAUNT_TEST_POSTGRES_IMAGE`).
//! When neither is set the tests fail with a message saying how to get one,
//! unless `HAUNT_SKIP_POSTGRES=1` says to skip them, and then every skip is
//! printed.
//!
//! # Layout
//!
//! - [`TestDb`]: one database, dropped when the value is.
//! - [`databases`]: every backend a test should run on.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::Connection;

pub const POSTGRES_URL_VAR: &str = "HAUNT_TEST_POSTGRES_URL";
pub const SKIP_POSTGRES_VAR: &str = "HAUNT_SKIP_POSTGRES";
pub const POSTGRES_MODE_VAR: &str = "HAUNT_TEST_POSTGRES";
pub const POSTGRES_IMAGE_VAR: &str = "HAUNT_TEST_POSTGRES_IMAGE";

/// A database that exists for one test.
#[derive(Debug)]
pub struct TestDb {
    pub url: String,
    pub kind: &'static str,
    cleanup: Cleanup,
}

#[derive(Debug)]
enum Cleanup {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { admin_url: String, name: String },
    Container(Option<Box<testcontainers::ContainerAsync<testcontainers::GenericImage>>>),
}

impl TestDb {
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("a temp dir for the SQLite file");
        let url = format!("sqlite://{}", dir.path().join("haunt.db").display());
        TestDb { url, kind: "sqlite", cleanup: Cleanup::Sqlite(dir) }
    }

    /// A fresh database on the test server, or `None` when the user opted out.
    pub async fn postgres() -> Option<TestDb> {
        if std::env::var(POSTGRES_MODE_VAR).as_deref() == Ok("container") {
            return Some(TestDb::postgres_container().await);
        }
        let admin_url = postgres_admin_url()?;
        let name = format!("haunt_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("connecting to {POSTGRES_URL_VAR}={admin_url}: {e}"));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("creating a test database");
        let _ = conn.close().await;
        let base = admin_url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin_url);
        Some(TestDb { url: format!("{base}/{name}"), kind: "postgres", cleanup: Cleanup::Postgres { admin_url, name } })
    }
}

impl TestDb {
    /// A PostgreSQL server of its own, in a container that lives as long as the value.
    pub async fn postgres_container() -> TestDb {
        use testcontainers::core::{ContainerPort, WaitFor};
        use testcontainers::runners::AsyncRunner;
        use testcontainers::{GenericImage, ImageExt};
        let image = std::env::var(POSTGRES_IMAGE_VAR).unwrap_or_else(|_| "haunt-postgres:latest".into());
        let (name, tag) = image.rsplit_once(':').unwrap_or((&image, "latest"));
        let container = GenericImage::new(name, tag)
            .with_exposed_port(ContainerPort::Tcp(5432))
            .with_wait_for(WaitFor::healthcheck())
            .with_label("io.haunt.test", "store")
            .with_startup_timeout(std::time::Duration::from_secs(120))
            .start()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{POSTGRES_MODE_VAR}=container: starting a PostgreSQL container from {image}: {e} \
                     (scripts/images builds the image; scripts/docker starts the engine)"
                )
            });
        let port = container.get_host_port_ipv4(ContainerPort::Tcp(5432)).await.expect("the published port");
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        TestDb { url, kind: "postgres", cleanup: Cleanup::Container(Some(Box::new(container))) }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Cleanup::Container(container) = &mut self.cleanup
            && let Some(container) = container.take()
        {
            // Removed on a runtime of its own: this may run inside a test's
            // runtime or outside any.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
                rt.block_on(container.rm()).ok()
            })
            .join();
        }
        if let Cleanup::Postgres { admin_url, name } = &self.cleanup {
            let (admin_url, name) = (admin_url.clone(), name.clone());
            // Drop may run inside a runtime; a thread with its own runtime keeps
            // this independent of the caller's.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
                rt.block_on(async {
                    let mut conn = sqlx::PgConnection::connect(&admin_url).await.ok()?;
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await.ok()?;
                    conn.close().await.ok()
                })
            })
            .join();
        }
    }
}

static SKIP_REPORTED: AtomicBool = AtomicBool::new(false);

/// The server URL, `None` when skipping was asked for. Panics with directions
/// when neither is set: a missing database must never pass silently.
pub fn postgres_admin_url() -> Option<String> {
    if let Ok(url) = std::env::var(POSTGRES_URL_VAR)
        && !url.is_empty()
    {
        return Some(url);
    }
    if std::env::var(SKIP_POSTGRES_VAR).as_deref() == Ok("1") {
        if !SKIP_REPORTED.swap(true, Ordering::Relaxed) {
            eprintln!("SKIPPED: PostgreSQL tests ({SKIP_POSTGRES_VAR}=1); only SQLite was tested");
        }
        return None;
    }
    panic!(
        "this test needs PostgreSQL: set {POSTGRES_URL_VAR} (run ./scripts/test, which starts one), \
         or set {SKIP_POSTGRES_VAR}=1 to skip the PostgreSQL tests explicitly"
    );
}

impl TestDb {
    /// [`TestDb::postgres`] for tests without a runtime of their own.
    pub fn postgres_blocking() -> Option<TestDb> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(TestDb::postgres())
    }
}

/// Every backend a store test should run on: SQLite, then PostgreSQL.
pub async fn databases() -> Vec<TestDb> {
    let mut dbs = vec![TestDb::sqlite()];
    dbs.extend(TestDb::postgres().await);
    dbs
}
