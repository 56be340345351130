//! Data driven: every folder under `tests/runs/` is a run directory with an
//! `expect.json` that states what the checker must conclude (or which input
//! error it must report, with file and line; `at` checks any figure by JSON
//! pointer, `summary_contains` and `summary_lacks` the text `haunt check`
//! prints). The full results of every case are
//! also kept as insta snapshots, so a change in wording or statistics is reviewed.

use std::path::{Path, PathBuf};

use haunt_checker::{InputError, Results, check_dir};
use haunt_format::FormatError;
use serde_json::Value;

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runs");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/runs exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 30, "expected the case folder, found {} cases", dirs.len());
    dirs
}

fn check_expectation(dir: &Path, expect: &Value, results: &Results) -> Result<(), String> {
    let json = serde_json::to_value(results).unwrap();
    if let Some(valid) = expect.get("valid")
        && &json["valid"] != valid
    {
        return Err(format!("valid: expected {valid}, got {}", json["valid"]));
    }
    if let Some(want) = expect.get("anomalies").and_then(Value::as_object) {
        for name in haunt_checker::ANOMALIES {
            let want_n = want.get(name).and_then(Value::as_u64).unwrap_or(0);
            let got_n = results.anomalies[name].count;
            if want_n != got_n {
                return Err(format!("anomaly {name}: expected {want_n}, got {got_n}"));
            }
        }
    }
    if let Some(want) = expect.get("examples").and_then(Value::as_object) {
        for (name, ids) in want {
            let got: Vec<Value> =
                results.anomalies[name].examples.iter().map(|e| serde_json::json!([e.order_id, e.event_id])).collect();
            if &Value::Array(got.clone()) != ids {
                return Err(format!("examples of {name}: expected {ids}, got {got:?}"));
            }
        }
    }
    if let Some(want) = expect.get("counts").and_then(Value::as_object) {
        for (field, n) in want {
            if &json["counts"][field] != n {
                return Err(format!("counts.{field}: expected {n}, got {}", json["counts"][field]));
            }
        }
    }
    for field in ["recovered", "dead_lettered", "pending"] {
        if let Some(n) = expect.get(field)
            && &json[field] != n
        {
            return Err(format!("{field}: expected {n}, got {}", json[field]));
        }
    }
    if let Some(want) = expect.get("delivery")
        && &json["delivery"]["histogram"] != want
    {
        return Err(format!("delivery histogram: expected {want}, got {}", json["delivery"]["histogram"]));
    }
    if let Some(want) = expect.get("fault_windows") {
        let got: Vec<Value> =
            results.faults.iter().map(|w| serde_json::json!([w.fault, w.target, w.start_ns, w.end_ns])).collect();
        if &Value::Array(got.clone()) != want {
            return Err(format!("fault windows: expected {want}, got {got:?}"));
        }
    }
    // Any other figure, by JSON pointer into results.json: `null` stands for
    // absent as well as null.
    if let Some(want) = expect.get("at").and_then(Value::as_object) {
        for (pointer, value) in want {
            let got = json.pointer(pointer).unwrap_or(&Value::Null);
            if got != value {
                return Err(format!("{pointer}: expected {value}, got {got}"));
            }
        }
    }
    let summary = haunt_checker::summary::render(results);
    if let Some(want) = expect.get("summary_contains").and_then(Value::as_str)
        && !summary.contains(want)
    {
        return Err(format!("the summary does not say {want:?}:\n{summary}"));
    }
    if let Some(unwanted) = expect.get("summary_lacks").and_then(Value::as_str)
        && summary.contains(unwanted)
    {
        return Err(format!("the summary says {unwanted:?}:\n{summary}"));
    }
    let _ = dir;
    Ok(())
}

fn check_error(expect: &Value, err: &InputError) -> Result<(), String> {
    let want = &expect["error"];
    let InputError::Format(FormatError::Line { file, line, message }) = err else {
        return Err(format!("expected a line error, got {err}"));
    };
    let want_file = want["file"].as_str().unwrap();
    if file.file_name().and_then(|f| f.to_str()) != Some(want_file) {
        return Err(format!("error file: expected {want_file}, got {}", file.display()));
    }
    if Some(*line) != want["line"].as_u64() {
        return Err(format!("error line: expected {}, got {line} ({message})", want["line"]));
    }
    let contains = want["contains"].as_str().unwrap();
    if !message.contains(contains) {
        return Err(format!("error message {message:?} does not contain {contains:?}"));
    }
    Ok(())
}

#[test]
fn every_case_concludes_what_it_expects() {
    let mut failures = Vec::new();
    for dir in cases() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let expect: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expect.json")).unwrap()).unwrap();
        let outcome = match (check_dir(&dir), expect.get("error").is_some()) {
            (Ok(results), false) => {
                let json = serde_json::to_string_pretty(&results).unwrap();
                insta::assert_snapshot!(name.clone(), json);
                check_expectation(&dir, &expect, &results)
            }
            (Ok(results), true) => Err(format!("expected an input error, got verdict {:?}", results.valid)),
            (Err(e), true) => {
                insta::assert_snapshot!(name.clone(), e.to_string().replace(&*dir.to_string_lossy(), "RUN"));
                check_error(&expect, &e)
            }
            (Err(e), false) => Err(format!("unexpected input error: {e}")),
        };
        if let Err(why) = outcome {
            failures.push(format!("{name}: {why}"));
        }
    }
    assert!(failures.is_empty(), "cases that failed:\n{}", failures.join("\n"));
}

#[test]
fn a_missing_directory_is_its_own_error() {
    let err = check_dir(Path::new("/nonexistent/run")).unwrap_err();
    assert_eq!(err.exit_code(), 66);
}

#[test]
fn a_missing_history_is_bad_input() {
    let dir = std::env::temp_dir().join(format!("haunt-empty-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = check_dir(&dir).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(err.exit_code(), 65, "{err}");
    assert!(err.to_string().contains("history.jsonl"), "{err}");
}
