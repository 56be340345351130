//! The page from results alone: what a run directory's results hold is
//! drawn, what they do not is said.

use std::path::Path;

use haunt_checker::Results;
use haunt_report::RunInfo;

fn checked(case: &str) -> Results {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../check/tests/runs").join(case);
    haunt_checker::check_dir(&dir).unwrap()
}

#[test]
fn every_time_plot_shades_and_names_the_fault_windows() {
    let html = haunt_report::render(&checked("delivery-evidence-in-windows"), &RunInfo::default());
    for plot in ["client op latency over time", "ops invoked per second by outcome", "applications over time"] {
        let start = html.find(&format!(r#"aria-label="{plot}">"#)).unwrap_or_else(|| panic!("no plot {plot}"));
        let svg = &html[start..start + html[start..].find("</figure>").unwrap()];
        assert!(svg.contains("kill worker-1\n</text>") && svg.contains("pause worker-2\n</text>"), "{plot}: {svg}");
        // Shaded in the faults' colours, a quarter opaque.
        assert!(
            svg.contains(r##"opacity="0.25" fill="#E57373""##) && svg.contains(r##"opacity="0.25" fill="#64B5F6""##),
            "{plot}: {svg}"
        );
    }
}

#[test]
fn write_puts_the_page_in_the_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("run.json"), r#"{"seed": 42, "faults_never_fired": ["stall"]}"#).unwrap();
    let path = haunt_report::write(dir.path(), &checked("valid-basic")).unwrap();
    assert_eq!(path, dir.path().join("report.html"));
    let html = std::fs::read_to_string(path).unwrap();
    assert!(html.contains("seed 42"), "{html}");
    assert!(html.contains("stall was enabled but never fired"), "{html}");
}

#[test]
fn a_run_json_that_names_the_enabled_faults_but_not_their_counts_says_so() {
    let run = RunInfo::from_json("d", &serde_json::json!({"options": {"nemesis": ["kill", "delay"]}}));
    let html = haunt_report::render(&checked("valid-basic"), &run);
    assert!(
        html.contains("Enabled faults: kill, delay. <code>run.json</code> does not say how often each started."),
        "{html}"
    );
    assert!(!html.contains("never fired"), "unknown is not never: {html}");
}
