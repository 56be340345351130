//! The reduced matrix: one short run per bug mode and of the correct build.
//! A change that blinds the checker or breaks a bug mode fails here.

use std::path::Path;
use std::process::Command;

use crate::run::PrivatePostgres;

#[test]
fn the_reduced_matrix_catches_every_bug_mode_and_passes_the_correct_build() {
    let tmp = tempfile::tempdir().unwrap();
    let pg = PrivatePostgres::start();
    let mut command = Command::new(env!("CARGO_BIN_EXE_haunt"));
    command.arg("matrix").arg("--store").arg(tmp.path()).args(["--seeds", "1", "--time-limit-s", "8"]);
    if let Some(pg) = &pg {
        command.args(["--db", &pg.url]).arg("--pg-data").arg(&pg.dir);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let matrix_dir = std::fs::read_dir(tmp.path().join("matrix")).unwrap().next().unwrap().unwrap().path();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(matrix_dir.join("matrix.json")).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12, "ten bug modes and the correct build twice");
    for row in rows {
        let name = row["case"]["bug"].as_str().unwrap();
        if row["skipped"].is_string() {
            assert!(pg.is_none(), "{name} skipped although PostgreSQL was given");
            continue;
        }
        let runs = row["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{name}");
        match (name, row["case"]["expected"].as_str().unwrap()) {
            ("correct", expected) => {
                assert_eq!(expected, "valid");
                assert_eq!(runs[0]["verdict"], "true", "{name}: {row}")
            }
            (_, "not-drained") => {
                assert_eq!(runs[0]["verdict"], "unknown", "{name}: {row}");
                assert!(runs[0]["pending"].as_u64().unwrap() > 0, "{name}: {row}");
                assert_eq!(runs[0]["anomalies"], serde_json::json!({}), "{name}: {row}");
            }
            (_, anomaly) => {
                assert!(
                    runs[0]["anomalies"][anomaly].as_u64().unwrap_or(0) > 0,
                    "{name} not caught as {anomaly}: {row}"
                )
            }
        }
    }
    assert!(Path::new(&matrix_dir.join("matrix.md")).exists());
    assert!(stdout.contains("| no-inbox | ack-loss | `double-applied` | 1/1 |"), "{stdout}");
}
