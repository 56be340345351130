//! The pass rule: what one run showed, what a row of runs adds up to, and
//! the matrix's verdict with its exit status.

use super::*;

/// One run of one case.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub seed: u64,
    pub run_dir: String,
    pub verdict: String,
    pub passed: bool,
    /// Reported anomalies and their counts.
    pub anomalies: BTreeMap<String, u64>,
    /// Present orders still queued at the end.
    pub pending: u64,
    /// Seconds from the run's start to the first op of the expected anomaly.
    pub first_anomaly_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunRecord {
    pub fn from_results(case: &Case, seed: u64, run_dir: String, results: &Results) -> RunRecord {
        let anomalies = results.failing_anomalies().map(|(n, r)| (n.to_owned(), r.count)).collect();
        let first_anomaly_s = Some(case.expected.name())
            .and_then(|a| results.anomalies.get(a))
            .and_then(|r| r.first_time_ns)
            .map(|ns| ns as f64 / 1e9);
        RunRecord {
            seed,
            run_dir,
            verdict: results.valid.as_str().to_owned(),
            passed: case.passes(results),
            anomalies,
            pending: results.pending,
            first_anomaly_s,
            error: None,
        }
    }

    pub fn failed_to_run(seed: u64, error: String) -> RunRecord {
        RunRecord {
            seed,
            run_dir: String::new(),
            verdict: "error".into(),
            passed: false,
            anomalies: BTreeMap::new(),
            pending: 0,
            first_anomaly_s: None,
            error: Some(error),
        }
    }
}

/// One row of the finished table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub case: Case,
    pub runs: Vec<RunRecord>,
    /// Why the case did not run (no PostgreSQL given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl Row {
    pub fn passed_count(&self) -> usize {
        self.runs.iter().filter(|r| r.passed).count()
    }

    /// Bug modes: caught in at least ⌈0.9·N⌉ runs. The correct build: valid in
    /// every run. A skipped row has not passed: see [`verdict`].
    pub fn ok(&self) -> bool {
        let n = self.runs.len();
        if self.skipped.is_some() || n == 0 {
            return false;
        }
        match self.case.expected {
            Expect::Valid => self.passed_count() == n,
            _ => self.passed_count() * 10 >= n * 9,
        }
    }

    pub(super) fn median_first_anomaly_s(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.runs.iter().filter(|r| r.passed).filter_map(|r| r.first_anomaly_s).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    pub(super) fn reported(&self) -> String {
        let mut total: BTreeMap<&str, u64> = BTreeMap::new();
        for r in &self.runs {
            for (a, n) in &r.anomalies {
                *total.entry(a).or_default() += n;
            }
        }
        if total.is_empty() {
            return "none".into();
        }
        total.iter().map(|(a, n)| format!("{a} ({n})")).collect::<Vec<_>>().join(", ")
    }
}

/// What a whole matrix shows, and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatrixVerdict {
    /// Every row ran and met its bar.
    Passed,
    /// These rows ran and fell below their bar (exit 1), whatever else happened.
    BelowBar(Vec<String>),
    /// These rows did not run (exit 2, "unknown"): a matrix with a row missing
    /// says nothing about that row's bug mode, so it cannot pass. A user who
    /// wants fewer rows asks for them with `--only`.
    Incomplete(Vec<String>),
}

impl MatrixVerdict {
    pub fn exit_code(&self) -> i32 {
        match self {
            MatrixVerdict::Passed => 0,
            MatrixVerdict::BelowBar(_) => 1,
            MatrixVerdict::Incomplete(_) => 2,
        }
    }
}

impl MatrixVerdict {
    /// The verdict in words, as the matrix's last line says it.
    pub fn summary(&self) -> String {
        match self {
            MatrixVerdict::Passed => "every row ran and met its bar".to_owned(),
            MatrixVerdict::BelowBar(rows) => format!("below the bar: {}", rows.join(", ")),
            MatrixVerdict::Incomplete(rows) => format!(
                "UNKNOWN: these rows did not run: {} (give --db and --pg-data, or ask for fewer rows with --only or --backends sqlite)",
                rows.join(", ")
            ),
        }
    }
}

pub fn verdict(rows: &[Row]) -> MatrixVerdict {
    let below: Vec<String> = rows.iter().filter(|r| r.skipped.is_none() && !r.ok()).map(|r| r.case.name()).collect();
    let skipped: Vec<String> = rows.iter().filter(|r| r.skipped.is_some()).map(|r| r.case.name()).collect();
    match (below.is_empty(), skipped.is_empty()) {
        (false, _) => MatrixVerdict::BelowBar(below),
        (true, false) => MatrixVerdict::Incomplete(skipped),
        (true, true) => MatrixVerdict::Passed,
    }
}
