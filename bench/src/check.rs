//! `haunt bench check`: the checker on a synthetic run.

use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use haunt_checker::stats::peak_rss_mib;
use serde_json::json;

use crate::CheckOptions;

/// Reads every line of `path` into a `serde_json::Value` and drops it: the cost
/// of merely deserializing the file.
fn deserialize_only(path: &Path) -> anyhow::Result<u64> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::with_capacity(512);
    let mut n = 0;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(n);
        }
        let value: serde_json::Value = serde_json::from_slice(&line)?;
        std::hint::black_box(&value);
        n += 1;
    }
}

/// The checker on a synthetic run of `options.ops` client ops, against merely
/// deserializing the same files with serde_json. `progress` gets a line before
/// the run is written. The synthetic run must check valid: if it does not, the
/// error holds the report.
pub fn check(options: CheckOptions, progress: &mut (dyn FnMut(&str) + Send)) -> anyhow::Result<serde_json::Value> {
    let tmp;
    let dir = match &options.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_owned()
        }
    };
    progress(&format!("writing a synthetic run of {} client ops to {}", options.ops, dir.display()));
    let t = Instant::now();
    let written = haunt_chaos::suites::synthetic::write_run(&dir, options.ops, options.clients, 1)?;
    let generate_s = t.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(dir.join(haunt_format::HISTORY_FILE))?.len()
        + std::fs::metadata(dir.join(haunt_format::FINAL_STATE_FILE))?.len();

    let t = Instant::now();
    let lines = deserialize_only(&dir.join(haunt_format::HISTORY_FILE))?
        + deserialize_only(&dir.join(haunt_format::FINAL_STATE_FILE))?;
    let deserialize_s = t.elapsed().as_secs_f64();
    let rss_after_deserialize = peak_rss_mib();

    let t = Instant::now();
    let results = haunt_checker::check_dir(&dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let check_s = t.elapsed().as_secs_f64();
    let rss_after_check = peak_rss_mib();

    let report = json!({
        "bench": "check",
        "machine": crate::machine(),
        "ops": written.ops,
        "orders": written.orders,
        "lines": lines,
        "bytes": bytes,
        "generate_s": generate_s,
        "deserialize_only_s": deserialize_s,
        "check_s": check_s,
        "check_over_deserialize": check_s / deserialize_s,
        "peak_rss_mib_after_deserialize": rss_after_deserialize,
        "peak_rss_mib_after_check": rss_after_check,
        "verdict": results.valid.as_str(),
    });
    anyhow::ensure!(
        results.valid == haunt_checker::Verdict::Valid,
        "the synthetic run must check valid: {}",
        serde_json::to_string_pretty(&report)?
    );
    Ok(report)
}
