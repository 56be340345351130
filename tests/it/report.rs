//! `report.html` from `haunt check`, for hand-made run directories: the page
//! is rendered from the results alone (`haunt_report::write`), plus the
//! directory's `run.json` when it has one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A copy of a checker test case in a temp dir, with `run_json` as its
/// `run.json` when given, checked by `haunt check` (which writes
/// `results.json` and `report.html` there).
fn checked_case(name: &str, run_json: Option<serde_json::Value>) -> (tempfile::TempDir, PathBuf) {
    let (tmp, dir) = case(name);
    if let Some(run) = run_json {
        std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
    }
    check(&dir);
    (tmp, dir)
}

fn case(name: &str) -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("checker/check/tests/runs").join(name);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
}

fn haunt_check(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_haunt")).arg("check").arg(dir).output().unwrap()
}

fn check(dir: &Path) {
    let out = haunt_check(dir);
    assert!(out.status.code().is_some_and(|c| c <= 2), "haunt check: {}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.join("results.json").is_file());
}

/// The report `haunt check` wrote.
fn render(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("report.html")).expect("haunt check writes report.html")
}

/// The text of every `<text>` element of the page's SVG.
fn svg_texts(html: &str) -> Vec<String> {
    html.split("<text ")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_owned()))
        .collect()
}

/// The cells of every row of the table with class `class`, tags stripped.
fn table_rows(html: &str, class: &str) -> Vec<Vec<String>> {
    let start = html.find(&format!(r#"<table class="{class}">"#)).unwrap_or_else(|| panic!("no {class} table"));
    let table = &html[start..start + html[start..].find("</table>").unwrap()];
    table
        .split("<tr>")
        .skip(1)
        .filter(|row| row.contains("<td"))
        .map(|row| row.split("<td").skip(1).map(|cell| text_of(cell.split_once('>').unwrap().1)).collect())
        .collect()
}

fn text_of(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.trim().to_owned()
}

/// A kill of worker-1 (10 to 41 ms) and a pause of worker-2 (60 to 81 ms),
/// with delivery evidence on every order line: e2 delivered 3 times (2
/// duplicates absorbed), e4 applied twice.
const WINDOWS_CASE: &str = "delivery-evidence-in-windows";

#[test]
fn the_fault_table_gives_each_windows_figures() {
    let (_tmp, dir) = checked_case(WINDOWS_CASE, None);
    let html = render(&dir);
    let rows = table_rows(&html, "faults");
    // fault, target, start, end, ops invoked, of them failed and
    // indeterminate, events affected, events redelivered, duplicates absorbed,
    // applied twice, p99 inside, p99 outside, trace: the figures of the
    // checker's expect.json for this case (both windows left one).
    assert_eq!(
        rows,
        [
            ["kill", "worker-1", "0.01", "0.04", "2", "0", "0", "2", "1", "2", "0", "5.0", "5.0", ""],
            ["pause", "worker-2", "0.06", "0.08", "1", "0", "1", "1", "1", "0", "1", "13.0", "5.0", ""],
        ]
    );
    // The double application is marked, and the slow p99 inside the pause.
    assert!(html.contains(r#"<td class="bad">1</td><td class="slow">13.0</td>"#), "{html}");
}

/// The checker's case with a kill that caught nothing in flight, a kill of
/// the API that failed an op, a pause that made a redelivery, and a pause
/// still open at the end: only the first is marked as leaving no trace.
#[test]
fn a_window_that_left_no_trace_is_marked() {
    let (_tmp, dir) = checked_case("fault-windows-traces", None);
    let rows = table_rows(&render(&dir), "faults");
    let traces: Vec<[&str; 3]> = rows.iter().map(|r| [r[0].as_str(), r[1].as_str(), r[13].as_str()]).collect();
    assert_eq!(
        traces,
        [["kill", "worker-1", "none"], ["kill", "api", ""], ["pause", "worker-2", ""], ["pause", "worker-3", ""]]
    );
}

#[test]
fn the_deliveries_plot_marks_redeliveries_and_absorbed_duplicates() {
    let (_tmp, dir) = checked_case(WINDOWS_CASE, None);
    let html = render(&dir);
    assert!(html.contains(r#"aria-label="applications over time""#));
    assert!(html.contains(r#"aria-label="redeliveries and absorbed duplicates over time""#));
    // In buckets of 1 ms: e2 applied on attempt 3 at 45 ms, with its two
    // duplicates (drawn at e2's application), and e4's second application,
    // on attempt 2, at 66 ms.
    assert_eq!(table_rows(&html, "redeliveries"), [["0.045", "0.046", "1", "2"], ["0.066", "0.067", "1", "0"]]);
    // The windows are named over the plot, and in its legend.
    let texts = svg_texts(&html);
    assert!(texts.iter().any(|t| t == "kill worker-1") && texts.iter().any(|t| t == "pause worker-2"), "{texts:?}");
    assert!(html.contains(r#"</span>kill</span>"#) && html.contains(r#"</span>pause</span>"#), "{html}");
    let figures: Vec<Vec<String>> = table_rows(&html, "figures");
    let figure = |name: &str| -> String {
        let row = html.split("<tr><th>").find(|r| r.starts_with(name)).unwrap_or_else(|| panic!("no row {name}"));
        text_of(row.split("<td").nth(1).unwrap().split_once('>').unwrap().1.split("</td>").next().unwrap())
    };
    assert_eq!(figures.len(), 8);
    assert_eq!(figure("deliveries<"), "8");
    assert_eq!(figure("redeliveries<"), "3");
    assert_eq!(figure("duplicates absorbed by the inbox"), "2");
    assert_eq!(figure("most deliveries of one event"), "3");
    assert_eq!(figure("events applied more than once"), "1");
}

#[test]
fn every_enabled_fault_that_never_fired_gets_a_line() {
    let run = serde_json::json!({
        "seed": 1,
        "faults_fired": {"kill": 1, "pause": 1, "delay": 0, "ack-loss": 0},
        "faults_never_fired": ["delay", "ack-loss"],
    });
    let (_tmp, dir) = checked_case(WINDOWS_CASE, Some(run));
    let html = render(&dir);
    for fault in ["delay", "ack-loss"] {
        let line = format!("{fault} was enabled but never fired");
        // Under the verdict, and again with the faults.
        assert_eq!(html.matches(&line).count(), 2, "{fault}: {html}");
    }
    assert!(!html.contains("kill was enabled but never fired"));
    assert!(html.contains("ack-loss ×0, delay ×0, kill ×1, pause ×1"), "{html}");

    let every_one = serde_json::json!({"faults_fired": {"kill": 1, "pause": 1}, "faults_never_fired": []});
    let (_tmp, dir) = checked_case(WINDOWS_CASE, Some(every_one));
    assert!(!render(&dir).contains("never fired"));
}

#[test]
fn a_foreign_run_directory_without_the_new_fields_still_renders() {
    // No delivery evidence on its order lines, no run.json.
    let (_tmp, dir) = checked_case("delivery-evidence-absent", None);
    let html = render(&dir);
    assert!(html.contains("records no delivery evidence"), "{html}");
    assert!(html.contains("does not record the duplicates the inbox absorbed"), "{html}");
    assert!(!html.contains("never fired"));
    // Nothing absorbed is drawn: the redeliveries are, their duplicates unknown.
    assert_eq!(table_rows(&html, "redeliveries"), [["0.045", "0.046", "1", "–"], ["0.066", "0.067", "1", "–"]]);
    assert!(html.contains("how often each event was delivered is not known"), "{html}");
    // Its windows are listed; the evidence-based figures are unknown, not 0.
    let rows = table_rows(&html, "faults");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0][..9], ["kill", "worker-1", "0.01", "0.04", "2", "0", "0", "2", "–"]);
    assert!(html.ends_with("</body></html>\n"));

    // And without a meta line there is no clock to place the applications on.
    let final_state = std::fs::read_to_string(dir.join("final-state.jsonl")).unwrap();
    let without_meta: String =
        final_state.lines().filter(|l| !l.contains("\"meta\"")).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("final-state.jsonl"), without_meta).unwrap();
    check(&dir);
    let html = render(&dir);
    assert!(html.contains("cannot be placed on the history's clock"), "{html}");
    assert!(!html.contains(r#"aria-label="applications over time""#));
    assert!(html.contains(r#"aria-label="client op latency over time""#));
}

#[test]
fn haunt_check_writes_a_report_for_a_hand_made_run_directory() {
    let (_tmp, dir) = case("valid-basic");
    assert!(!dir.join("report.html").exists());
    let out = haunt_check(&dir);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains(&format!("report: {}", dir.join("report.html").display())), "{stdout}");
    let html = render(&dir);
    assert!(html.starts_with("<!doctype html>") && html.ends_with("</body></html>\n"));
    assert!(html.contains("VALID: no acknowledged order lost"), "{html}");
    // No run.json: the subtitle says so, and nothing is said of the faults' coverage.
    assert!(html.contains(&format!("{} · no run.json", dir.display())), "{html}");
    assert!(html.contains(r#"aria-label="client op latency over time""#), "{html}");
    // --json prints the results alone, and writes the report all the same.
    std::fs::remove_file(dir.join("report.html")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_haunt")).args(["check", "--json"]).arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout is the results alone");
    assert!(dir.join("report.html").is_file());
}

#[test]
fn a_report_that_cannot_be_written_is_an_error_but_the_results_stand() {
    let (_tmp, dir) = case("valid-basic");
    // A directory where the report would go: writing it fails.
    std::fs::create_dir(dir.join("report.html")).unwrap();
    let out = haunt_check(&dir);
    assert_eq!(out.status.code(), Some(73), "not a verdict");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("writing") && stderr.contains("report.html"), "{stderr}");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["valid"], true);
}

/// With the order check, the report has its section: the figures, the
/// overtaken orders over time, one key's orders acknowledged against
/// applied, and the fault table's column of overtaken orders (the kill of
/// worker-1 holds the one overtaken order's application). Without `key_seq`
/// there is no such section and no such column.
#[test]
fn the_order_section_shows_the_overtaken_orders_in_time_and_for_one_key() {
    let (_tmp, dir) = checked_case("order-overtaken-inside-a-window", None);
    let html = render(&dir);
    assert!(html.contains("<h2>Order within a key</h2>"), "{html}");
    assert!(html.contains("<b>1</b> orders were overtaken"), "{html}");
    assert!(html.contains("1 were overtaken by an order that took effect only on a redelivery"), "{html}");
    assert!(html.contains("The other 0 were overtaken on first deliveries"), "{html}");
    assert!(html.contains(r#"aria-label="overtaken orders over time""#), "{html}");
    assert!(html.contains(r#"aria-label="one key: acknowledged against applied""#), "{html}");
    assert!(html.contains("<code>o2</code> on key <code>i1</code> took effect 1 in the key's order"), "{html}");
    let rows = table_rows(&html, "faults");
    let overtaken: Vec<&str> = rows.iter().map(|r| r.last().unwrap().as_str()).collect();
    assert_eq!(overtaken, ["1", "0"], "{rows:?}");

    let (_tmp, dir) = checked_case(WINDOWS_CASE, None);
    let html = render(&dir);
    assert!(!html.contains("Order within a key") && !html.contains("<th>overtaken</th>"));
}
