//! `haunt check`: exit statuses, the summary and `--json`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn haunt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_haunt"))
}

/// A copy of a checker test case in a temp dir, since `haunt check` writes
/// `results.json` into the directory it checks.
fn case(name: &str) -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("checker/check/tests/runs").join(name);
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join(name);
    std::fs::create_dir(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    (tmp, dst)
}

#[test]
fn exit_status_follows_the_verdict() {
    for (name, code) in
        [("valid-basic", 0), ("double-applied", 1), ("missing-final-state", 2), ("error-invoke-after-info", 65)]
    {
        let (_tmp, dir) = case(name);
        let out = haunt().arg("check").arg(&dir).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn summary_puts_the_verdict_first_and_writes_results() {
    let (_tmp, dir) = case("double-applied");
    let out = haunt().arg("check").arg(&dir).output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("INVALID"), "{stdout}");
    assert!(stdout.contains("double-applied: 1"), "{stdout}");
    assert!(stdout.contains("order o1 event e1"), "{stdout}");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["valid"], false);
}

#[test]
fn json_flag_prints_the_results() {
    let (_tmp, dir) = case("pending-not-quiesced");
    let out = haunt().args(["check", "--json"]).arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let results: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results["valid"], "unknown");
    assert_eq!(results["pending"], 1);
}

#[test]
fn bad_input_names_file_and_line_on_stderr() {
    let (_tmp, dir) = case("error-final-state-unknown-kind");
    let out = haunt().arg("check").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(65));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("final-state.jsonl:2:"), "{stderr}");
    assert!(!dir.join("results.json").exists(), "nothing is written for bad input");
}

#[test]
fn missing_directory_exits_66() {
    let out = haunt().args(["check", "/nonexistent/haunt-run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(66));
}

#[test]
fn unknown_flags_are_rejected() {
    let out = haunt().args(["check", "--jsn", "x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "usage errors are not the unknown verdict");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--jsn"));
}
