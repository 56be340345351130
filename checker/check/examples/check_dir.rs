//! Checks one run directory in process and prints the verdict, the seconds
//! the check took and the process's peak resident memory: the checker
//! alone, for comparing two builds on the same files (`docs/performance.md`).
//! Given a second path, it writes the results there as JSON, so that two
//! builds' figures can be compared byte for byte.
//!
//! ```sh
//! cargo run --release -p haunt-checker --example check_dir -- /tmp/bench20m [RESULTS_JSON]
//! ```

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(dir) = std::env::args().nth(1) else {
        return Err("usage: check_dir RUN_DIR [RESULTS_JSON]".into());
    };
    let started = Instant::now();
    let results = haunt_checker::check_dir(std::path::Path::new(&dir))?;
    let seconds = started.elapsed().as_secs_f64();
    let client_ops = results.counts.client_ops as f64;
    println!(
        "{} in {seconds:.2} s ({:.2} M client ops/s), peak RSS {:.0} MiB",
        results.valid.as_str(),
        client_ops / seconds / 1e6,
        peak_rss_mib().unwrap_or(f64::NAN)
    );
    if let Some(out) = std::env::args().nth(2) {
        std::fs::write(&out, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}

/// The process's high-water mark of resident memory (Linux), in MiB. Its own
/// copy of `haunt_checker::stats::peak_rss_mib`: this file is copied into the
/// build before's tree to time both on the same files, and needs only
/// `check_dir` there.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
