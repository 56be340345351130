//! Architecture invariant: the report never reads the history or the final
//! state, so that no second parser of them stands beside the checker's. Its
//! sources name neither file nor a reader of the format.

#[test]
fn the_report_reads_neither_the_history_nor_the_final_state() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let forbidden = [
        "HISTORY_FILE",
        "FINAL_STATE_FILE",
        "history.jsonl",
        "final-state.jsonl",
        "JsonlReader",
        "FinalLine",
        "OpRef",
        "FinalRef",
        "check_dir",
    ];
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            for word in forbidden {
                if line.contains(word) {
                    found.push(format!("{}:{}: {word}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "the report reads what the checker reads:\n{}", found.join("\n"));
}
