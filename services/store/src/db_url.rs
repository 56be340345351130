//! [`DbUrl`]: a database URL parsed once, where it enters (a flag, a system
//! file, a test's database), and passed as a type from there on, so that no
//! caller sniffs a string's prefix again.

use std::fmt;
use std::str::FromStr;

use crate::StoreError;

/// Which database a URL names, and so which SQL the store speaks to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DbKind {
    Sqlite,
    Postgres,
}

impl DbKind {
    /// As run directories and tables name it: `sqlite`, `postgres`.
    pub fn name(self) -> &'static str {
        match self {
            DbKind::Sqlite => "sqlite",
            DbKind::Postgres => "postgres",
        }
    }
}

impl fmt::Display for DbKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A database URL whose kind is known: `sqlite:PATH` (or `sqlite://PATH`), or
/// `postgres://…` (or `postgresql://…`). Anything else is refused when it is
/// parsed, with the URL in the error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DbUrl {
    kind: DbKind,
    url: String,
}

impl DbUrl {
    pub fn parse(url: &str) -> Result<DbUrl, StoreError> {
        let kind = if url.starts_with("sqlite:") {
            DbKind::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            DbKind::Postgres
        } else {
            return Err(StoreError::Url(url.to_owned()));
        };
        if kind == DbKind::Postgres && !cfg!(feature = "tls") && demands_tls(url) {
            return Err(StoreError::NoTls(url.to_owned()));
        }
        Ok(DbUrl { kind, url: url.to_owned() })
    }

    /// A SQLite file, created on first connect when missing.
    pub fn sqlite_file(path: &std::path::Path) -> DbUrl {
        DbUrl { kind: DbKind::Sqlite, url: format!("sqlite://{}", path.display()) }
    }

    pub fn kind(&self) -> DbKind {
        self.kind
    }

    pub fn is_postgres(&self) -> bool {
        self.kind == DbKind::Postgres
    }

    pub fn as_str(&self) -> &str {
        &self.url
    }
}

/// Whether a PostgreSQL URL's `sslmode` refuses a connection without TLS
/// (`require`, `verify-ca`, `verify-full`); `prefer`, the default, goes on
/// without it.
fn demands_tls(url: &str) -> bool {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .filter_map(|pair| pair.strip_prefix("sslmode="))
        .any(|mode| mode.starts_with("require") || mode.starts_with("verify"))
}

impl FromStr for DbUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<DbUrl, StoreError> {
        DbUrl::parse(url)
    }
}

impl fmt::Display for DbUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

impl AsRef<str> for DbUrl {
    fn as_ref(&self) -> &str {
        &self.url
    }
}

/// Written as the URL itself (`run.json`'s `db`), as it was before it had a type.
impl serde::Serialize for DbUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.url)
    }
}

impl<'de> serde::Deserialize<'de> for DbUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<DbUrl, D::Error> {
        let url = String::deserialize(d)?;
        DbUrl::parse(&url).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The suite runs this with TLS (the workspace's build) and without
    /// (`--no-default-features`, as the README's first command builds).
    #[test]
    fn a_url_that_demands_tls_is_refused_naming_the_feature_in_a_build_without_it() {
        for url in [
            "postgres://u@db.example/app?sslmode=require",
            "postgresql://u@db.example/app?application_name=x&sslmode=verify-full",
            "postgres://u@db.example/app?sslmode=verify-ca",
        ] {
            match (cfg!(feature = "tls"), DbUrl::parse(url)) {
                (true, Ok(parsed)) => assert_eq!(parsed.as_str(), url),
                (false, Err(e)) => assert!(e.to_string().contains("--features postgres-tls"), "{e}"),
                (tls, answer) => panic!("{url}: tls {tls}, answered {answer:?}"),
            }
        }
        for url in
            ["postgres://u@127.0.0.1/app", "postgres://u@h/app?sslmode=prefer", "postgres://u@h/app?sslmode=disable"]
        {
            assert!(DbUrl::parse(url).is_ok(), "{url}: taken with or without TLS");
        }
    }

    #[test]
    fn kinds_by_scheme() {
        assert_eq!(DbUrl::parse("sqlite:///tmp/x.db").unwrap().kind(), DbKind::Sqlite);
        assert_eq!(DbUrl::parse("sqlite:x.db").unwrap().kind(), DbKind::Sqlite);
        assert_eq!(DbUrl::parse("postgres://u@h/db").unwrap().kind(), DbKind::Postgres);
        assert_eq!(DbUrl::parse("postgresql://u@h/db").unwrap().kind(), DbKind::Postgres);
        let err = DbUrl::parse("mysql://u@h/db").unwrap_err();
        assert!(err.to_string().contains("mysql://u@h/db"), "{err}");
        // A prefix that only looks like one is refused too.
        assert!(DbUrl::parse("postgres:/u@h/db").is_err());
    }

    #[test]
    fn serializes_as_the_url() {
        let url = DbUrl::parse("postgres://u@h/db").unwrap();
        assert_eq!(serde_json::to_string(&url).unwrap(), r#""postgres://u@h/db""#);
        let back: DbUrl = serde_json::from_str(r#""postgres://u@h/db""#).unwrap();
        assert_eq!(back, url);
        assert!(serde_json::from_str::<DbUrl>(r#""ftp://x""#).is_err());
    }
}
