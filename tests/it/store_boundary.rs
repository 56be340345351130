//! Holds the architecture invariant "only `services/store` reads or writes the
//! pipeline's tables": every `.rs` file of the workspace outside
//! `services/store` is scanned for SQL that names one of the six tables.
//!
//! Tests are scanned too, with no exemption: none needs the tables today (they
//! read the end state through `Store::final_state_lines`, `queue_stats` and
//! `projection`), and a test that wrote them behind the store's back would
//! pin the schema outside the one crate that owns it. The store's own tests
//! live under `services/store` and may.
//!
//! What counts as SQL naming a table: inside a string literal (raw or not;
//! comments are skipped), one of `FROM`, `INTO`, `UPDATE`, `JOIN`, `TRUNCATE`,
//! `TABLE`, any case, followed by the table's name (after `TABLE`, `ONLY`,
//! `IF [NOT] EXISTS` or a `public.` schema). A table name spliced in at run
//! time cannot be read, so a statement that splices one in is reported as
//! such: a literal that starts with `SELECT`, `INSERT`, `UPDATE`, `DELETE` or
//! `TRUNCATE` and has a `{…}` placeholder where a table goes
//! (`format!("DELETE FROM {table}")`). A name built any other way (a table
//! name in a `&str` concatenated with `+`, say) is not seen.

use std::path::Path;

use crate::source::{rust_files, string_literals, workspace};

const TABLES: [&str; 6] =
    ["orders", "queue_messages", "inbox_processed", "inventory_projection", "projection_ledger", "dead_letters"];

/// Words that may stand between a keyword and the table it names.
const FILLER: [&str; 6] = ["table", "only", "if", "not", "exists", "public"];
const KEYWORDS: [&str; 6] = ["from", "into", "update", "join", "truncate", "table"];
/// First words of a statement that reads or writes rows.
const VERBS: [&str; 5] = ["select", "insert", "update", "delete", "truncate"];
/// What a placeholder where a table goes is reported as.
const SPLICED: &str = "{a table spliced in}";

/// `(line offset within the literal, keyword, table)` for each table named
/// after an SQL keyword.
fn tables_named(text: &str) -> Vec<(usize, String, &'static str)> {
    let mut words = Vec::new();
    let mut line = 0;
    let mut word = String::new();
    for c in text.chars().chain([' ']) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c.to_ascii_lowercase());
            continue;
        }
        if !word.is_empty() {
            words.push((line, std::mem::take(&mut word)));
        }
        if c == '{' {
            words.push((line, "{".to_owned()));
        }
        line += usize::from(c == '\n');
    }
    let statement = words.first().is_some_and(|(_, w)| VERBS.contains(&w.as_str()));
    let mut hits = Vec::new();
    // The word index of the last table reported: `TRUNCATE TABLE t` names t once.
    let mut reported = None;
    for (k, (line, keyword)) in words.iter().enumerate() {
        if !KEYWORDS.contains(&keyword.as_str()) {
            continue;
        }
        let Some(at) = words[k + 1..].iter().position(|(_, w)| !FILLER.contains(&w.as_str())).map(|p| k + 1 + p) else {
            continue;
        };
        let spliced = statement && words[at].1 == "{";
        if let Some(table) = TABLES.iter().find(|t| **t == words[at].1).copied().or(spliced.then_some(SPLICED))
            && reported != Some(at)
        {
            reported = Some(at);
            hits.push((*line, keyword.to_uppercase(), table));
        }
    }
    hits
}

/// `(line, KEYWORD, table)` for each table named in SQL in one file.
fn scan_file(src: &str) -> Vec<(usize, String, &'static str)> {
    let mut hits = Vec::new();
    for literal in string_literals(src) {
        for (offset, keyword, table) in tables_named(&literal.text) {
            hits.push((literal.line + offset, keyword, table));
        }
    }
    hits
}

/// Literals that name a table after a keyword but are not SQL anyone runs,
/// each with its reason: `(file, table, a piece of its line)`.
const NOT_SQL: [(&str, &str, &str); 1] = [
    // An injection attempt the API must refuse as a bad item_id (422): it is a
    // field value in a request body, and the test asserts it never runs.
    ("services/api/tests/it/validation.rs", "orders", "case(\"item_id sql\""),
];

fn allowed(file: &Path, line: &str, table: &str) -> bool {
    NOT_SQL.iter().any(|(f, t, piece)| file == Path::new(f) && *t == table && line.contains(piece))
}

#[test]
fn only_the_store_names_the_pipeline_tables_in_sql() {
    let root = workspace();
    let mut files = Vec::new();
    // examples/ holds systems seen from outside, as a user writes them: their
    // system files read the final state with SQL of their own, which is the
    // contract of docs/system-format.md, not a way around the store.
    rust_files(&root, &[root.join("services/store"), root.join("examples")], 0, &mut files);
    // The walk reached every part the invariant is about.
    for must in [
        "bench/src/pipeline.rs",
        "chaos/src/core/run.rs",
        "services/api/src/orders.rs",
        "services/worker/src/lib.rs",
        "services/telemetry/src/lib.rs",
        "checker/check/src/lib.rs",
        "tests/it/main.rs",
    ] {
        assert!(files.contains(&root.join(must)), "{must} was not scanned");
    }
    assert!(!files.iter().any(|f| f.starts_with(root.join("services/store")) || f.starts_with(root.join("examples"))));
    let mut hits = Vec::new();
    let mut allowances_used = 0;
    for file in &files {
        let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let relative = file.strip_prefix(&root).unwrap();
        for (line, keyword, table) in scan_file(&src) {
            if allowed(relative, src.lines().nth(line - 1).unwrap_or(""), table) {
                allowances_used += 1;
                continue;
            }
            hits.push(format!("{}:{line}: {keyword} {table}", relative.display()));
        }
    }
    // An allowance that no longer matches anything is stale: remove it.
    assert_eq!(allowances_used, NOT_SQL.len(), "an entry of NOT_SQL matches nothing");
    assert!(
        hits.is_empty(),
        "only services/store may read or write the pipeline's tables (ARCHITECTURE.md); \
         move these statements behind a store method:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_scan_finds_the_stores_own_statements() {
    // The store's SQL is where the tables are named: if the scan found nothing
    // there, it would find nothing anywhere.
    let path = workspace().join("services/store/src/sql.rs");
    let hits = scan_file(&std::fs::read_to_string(&path).unwrap());
    for table in TABLES {
        assert!(hits.iter().any(|(_, _, t)| *t == table), "no statement on {table} found: {hits:#?}");
    }
}

#[test]
fn the_scan_reads_literals_not_comments() {
    // Built at run time, so that this file holds no statement of its own.
    // The placeholders' names are no SQL keywords, for the same reason.
    let (d, t) = (["DELETE", "FROM"].join(" "), ["truncate", "TABLE"].join(" "));
    let src = format!(
        "// {d} orders (a comment)\n\
         /* {d} orders\n (a block comment) */\n\
         fn f<'a>(x: &'a str) -> char {{ let _ = r#\"\n{d}\n  queue_messages\"#; '\"' }}\n\
         const S: &str = \"one\\n{t} IF EXISTS public.dead_letters\";\n\
         const E: &str = \"reading from the orders\"; // English, not SQL\n\
         const B: &[u8] = b\"SELECT 1 {d} projection_ledger\";\n\
         let _ = format!(\"{d} {{table}}\"); let _ = format!(\"copying from {{path}}\");\n"
    );
    let hits = scan_file(&src);
    let hits: Vec<(usize, &str, &str)> = hits.iter().map(|(l, k, t)| (*l, k.as_str(), *t)).collect();
    assert_eq!(
        hits,
        [
            (5, "FROM", "queue_messages"),
            (7, "TRUNCATE", "dead_letters"),
            (9, "FROM", "projection_ledger"),
            (10, "FROM", SPLICED),
        ]
    );
}
