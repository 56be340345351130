//! What the report takes from `run.json`: the subtitle, the enabled faults and
//! how often each fired. `run.json` is free form (docs/run-format.md) and a
//! run directory another tool wrote may have none, so every field is optional
//! and a field of another type is read as absent.

use std::collections::BTreeMap;
use std::path::Path;

use haunt_format::RUN_FILE;
use serde_json::Value;

/// The part of a run that is not in its results.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunInfo {
    /// Names the run: its directory, seed, revision, backend, workers, faults
    /// and database, as far as `run.json` says.
    pub subtitle: String,
    /// `options.nemesis`: the faults the run enabled.
    pub faults_enabled: Option<Vec<String>>,
    /// `faults_fired`: how often each enabled fault started.
    pub faults_fired: Option<BTreeMap<String, u32>>,
    /// `faults_never_fired`: the enabled faults that never started.
    pub faults_never_fired: Option<Vec<String>>,
}

fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v?.as_array()?.iter().map(|s| s.as_str().map(str::to_owned)).collect()
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl RunInfo {
    /// Reads `run.json` in `run_dir`. A missing or unreadable one gives a
    /// subtitle that says so and no fault coverage.
    pub fn read(run_dir: &Path) -> RunInfo {
        let place = run_dir.display().to_string();
        let path = run_dir.join(RUN_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return RunInfo { subtitle: format!("{place} · no {RUN_FILE}"), ..RunInfo::default() };
            }
            Err(e) => {
                return RunInfo { subtitle: format!("{place} · {RUN_FILE} unreadable: {e}"), ..RunInfo::default() };
            }
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(run) => RunInfo::from_json(&place, &run),
            Err(e) => RunInfo { subtitle: format!("{place} · {RUN_FILE} is not JSON: {e}"), ..RunInfo::default() },
        }
    }

    /// The fields of a parsed `run.json`; `place` names the run directory.
    pub fn from_json(place: &str, run: &Value) -> RunInfo {
        let options = run.get("options");
        let faults_enabled = strings(options.and_then(|o| o.get("nemesis")));
        let mut parts = vec![place.to_owned()];
        let mut part = |label: &str, value: Option<String>, after: &str| {
            if let Some(v) = value {
                parts.push(format!("{label}{v}{after}"));
            }
        };
        part("seed ", text(run.get("seed")), "");
        part("revision ", text(run.get("git_revision")), "");
        part("backend ", text(run.get("backend")), "");
        part("", text(options.and_then(|o| o.get("workers"))), " workers");
        part(
            "nemesis ",
            faults_enabled.as_ref().map(|f| if f.is_empty() { "none".to_owned() } else { f.join(",") }),
            "",
        );
        part("db ", text(run.get("db")), "");
        let faults_fired = run
            .get("faults_fired")
            .and_then(Value::as_object)
            .and_then(|m| m.iter().map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?))).collect());
        RunInfo {
            subtitle: parts.join(" · "),
            faults_enabled,
            faults_fired,
            faults_never_fired: strings(run.get("faults_never_fired")),
        }
    }

    /// The enabled faults that never fired, when that can be known: from
    /// `faults_never_fired`, or from the enabled faults and how often each
    /// fired. `None` when `run.json` does not say which faults were enabled.
    pub fn never_fired(&self) -> Option<Vec<String>> {
        if let Some(never) = &self.faults_never_fired {
            return Some(never.clone());
        }
        let (enabled, fired) = (self.faults_enabled.as_ref()?, self.faults_fired.as_ref()?);
        Some(enabled.iter().filter(|f| fired.get(*f).copied().unwrap_or(0) == 0).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_subtitle_names_what_run_json_says() {
        let run = json!({
            "seed": 7, "git_revision": "abc123", "backend": "local", "db": "sqlite",
            "options": {"workers": 3, "nemesis": ["kill", "pause"]},
        });
        let info = RunInfo::from_json("runs/x", &run);
        assert_eq!(
            info.subtitle,
            "runs/x · seed 7 · revision abc123 · backend local · 3 workers · nemesis kill,pause · db sqlite"
        );
        assert_eq!(info.faults_enabled, Some(vec!["kill".to_owned(), "pause".to_owned()]));
        // Enabled is known, fired is not: nothing can be said of what never fired.
        assert_eq!(info.never_fired(), None);
    }

    #[test]
    fn missing_and_mistyped_fields_are_absent() {
        let info = RunInfo::from_json("d", &json!({"seed": [1], "faults_fired": {"kill": "x"}, "options": 3}));
        assert_eq!(info.subtitle, "d");
        assert_eq!((info.faults_enabled, info.faults_fired, info.faults_never_fired), (None, None, None));
    }

    #[test]
    fn never_fired_comes_from_the_list_or_from_the_enabled_faults_and_their_counts() {
        let listed = RunInfo::from_json("d", &json!({"faults_never_fired": ["delay"]}));
        assert_eq!(listed.never_fired(), Some(vec!["delay".to_owned()]));
        let counted = RunInfo::from_json(
            "d",
            &json!({"options": {"nemesis": ["kill", "delay", "stall"]}, "faults_fired": {"kill": 2, "delay": 0}}),
        );
        assert_eq!(counted.never_fired(), Some(vec!["delay".to_owned(), "stall".to_owned()]));
    }

    #[test]
    fn a_run_directory_without_run_json_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let info = RunInfo::read(dir.path());
        assert!(info.subtitle.ends_with("· no run.json"), "{}", info.subtitle);
        std::fs::write(dir.path().join(RUN_FILE), "{not json").unwrap();
        assert!(RunInfo::read(dir.path()).subtitle.contains("run.json is not JSON"));
    }
}
