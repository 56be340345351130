//! `haunt shrink` over a real failing run: without the inbox, an ack the
//! ack-loss fault drops is an event applied twice. The shrunk run keeps the
//! ack loss, loses the windows that did nothing, runs shorter, and still
//! fails the same way.

use std::process::Command;

use crate::run::{haunt_run, latest, read_json};

#[test]
fn a_failing_run_shrinks_to_fewer_windows_that_still_fail_the_same_way() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--bug",
        "no-inbox",
        "--nemesis",
        "delay,ack-loss,clock-skew",
        "--fault-targets",
        "client<->api",
        "--nemesis-interval-s",
        "2",
        "--time-limit-s",
        "16",
        "--seed",
        "4",
        "--quiet",
    ];
    let out = haunt_run(tmp.path(), &args).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "the run fails: {}", String::from_utf8_lossy(&out.stderr));
    let dir = latest(tmp.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("shrink: haunt shrink {}", dir.display())), "the run says how: {stderr}");
    let before = read_json(&dir.join("schedule.json"))["windows"].as_array().unwrap().len();
    assert!(before >= 3, "three kinds of fault struck");

    let out = Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["shrink", "--reruns", "2", "--budget-s", "150", "--confirm", "2", "--quiet"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("double-applied"), "the kinds it kept: {stdout}");
    let shrunk = dir.join("shrunk");
    let report = read_json(&shrunk.join("shrink.json"));
    let after = &report["after"];
    let windows = after["windows"].as_array().unwrap();
    assert!(windows.len() < before, "fewer windows: {report}");
    assert!(windows.iter().any(|w| w["fault"] == "ack-loss"), "the ack loss stays: {report}");
    assert!(after["time_limit_s"].as_u64().unwrap() < 16, "a shorter run: {report}");
    // Every candidate kept along the way failed, and the result is the last of them.
    let kept: Vec<&serde_json::Value> =
        report["steps"].as_array().unwrap().iter().filter(|s| s["fails"] == true).collect();
    assert_eq!(kept.last().map(|s| &s["candidate"]), Some(after), "{report}");
    assert_eq!(read_json(&shrunk.join("schedule.json"))["windows"], after["windows"]);
    // The replay command runs the shrunk schedule.
    let options = read_json(&shrunk.join("options.json"));
    assert_eq!(options["schedule"]["windows"], after["windows"]);
    assert!(stdout.contains("replay: haunt run --options"), "{stdout}");
    assert!(shrunk.join("run").join("results.json").exists(), "the last failing rerun is linked");
}
