//! The system-file parser, driven by data: every file under
//! `tests/system_files/good` loads; every file under `bad` is refused with the
//! error its first line names (`# error: TEXT`: the error, after the file's
//! path, must contain TEXT: the line, the field and the reason).

use std::path::{Path, PathBuf};

use haunt_chaos::systems::system_file::spec;

fn files(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/system_files").join(kind);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    out.sort();
    assert!(!out.is_empty(), "no cases in {}", dir.display());
    out
}

#[test]
fn good_files_load() {
    for path in files("good") {
        if let Err(e) = spec::load(&path) {
            panic!("{e}");
        }
    }
}

#[test]
fn bad_files_are_refused_naming_the_field_and_the_line() {
    let mut wrong = Vec::new();
    for path in files("bad") {
        let text = std::fs::read_to_string(&path).unwrap();
        let expected = text.lines().next().and_then(|l| l.strip_prefix("# error: ")).expect("a # error: line first");
        match spec::load(&path) {
            Ok(_) => wrong.push(format!("{}: loaded, expected {expected:?}", path.display())),
            Err(e) => {
                let message = e.to_string();
                let after_path = message.strip_prefix(&path.display().to_string()).unwrap_or(&message);
                if !after_path.contains(expected) {
                    wrong.push(format!("{}:\n  expected {expected:?}\n  got      {after_path:?}", path.display()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn instances_of_a_counted_node_fill_their_number() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/system_files/good/counted-workers.toml");
    let s = spec::load(&path).unwrap();
    let names: Vec<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["api", "worker-1", "worker-2"]);
    assert!(s.nodes[2].command.contains(&"worker-2".to_owned()), "{:?}", s.nodes[2].command);
    assert!(s.nodes[2].command.iter().any(|a| a.ends_with("{port:worker-2}")), "{:?}", s.nodes[2].command);
    assert_eq!(s.nodes[2].ready.as_deref(), Some("tcp://127.0.0.1:{port:worker-2}"));
    assert_eq!(s.client.method, "POST", "the default method");
    assert_eq!(s.system_dir, path.parent().unwrap());
}

#[test]
fn a_node_declares_its_admin_endpoint_points_and_hooks() {
    use haunt_chaos::core::fault::Fault;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/system_files/good/admin-points-hooks.toml");
    let s = spec::load(&path).unwrap();
    let w2 = &s.nodes[2];
    assert_eq!(w2.admin.as_deref(), Some("http://127.0.0.1:{port:worker-2}/"), "{{n}} filled per instance");
    assert_eq!(w2.points, ["after-effect-before-ack", "after-lease"]);
    assert_eq!(w2.hooks, [Fault::AckLoss, Fault::ClockSkew]);
    assert_eq!(s.nodes[0].hooks, [Fault::DbError]);
    assert_eq!(w2.aim.as_deref(), Some("SELECT count(*) FROM queue WHERE lease_owner = 'worker-2'"));
    assert_eq!(s.nodes[0].aim, None);
    assert_eq!(
        haunt_chaos::systems::system_file::faults_allowed(&s),
        [Fault::Kill, Fault::Pause, Fault::Partition, Fault::Delay, Fault::AckLoss, Fault::DbError, Fault::ClockSkew]
    );
}

#[test]
fn a_variant_fills_its_vars_and_is_chosen_by_name() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/systems/tutorial-python/shop.toml");
    let mut s = spec::load(&path).unwrap();
    let names: Vec<&str> = s.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["fixed", "dual-write", "lost-update", "no-inbox", "unfenced"]);
    let dual = &s.variants[1];
    assert_eq!((dual.expect, dual.nemesis.as_deref()), ("lost-effect", Some("kill")));
    assert_eq!(dual.fault_targets, ["api"]);
    s.choose(None).unwrap();
    assert_eq!(s.var("variant"), Some("fixed"), "the first without a name");
    s.choose(Some("lost-update")).unwrap();
    assert_eq!((s.var("variant"), s.var("read_delay_ms")), (Some("lost-update"), Some("5")));
    let err = s.choose(Some("lunch")).unwrap_err().to_string();
    assert!(err.contains("--variant lunch") && err.contains("fixed, dual-write, lost-update"), "{err}");
    let mut plain =
        spec::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/system_files/good/minimal.toml")).unwrap();
    plain.choose(None).unwrap();
    assert!(plain.variant.is_none());
    assert!(plain.choose(Some("a")).unwrap_err().to_string().contains("has no [[variant]]"));
}

/// A variant may expect any anomaly the checker reports, and nothing else.
#[test]
fn a_variant_may_expect_every_anomaly_the_checker_knows() {
    let mut known: Vec<&str> = haunt_checker::results::ANOMALIES.to_vec();
    known.extend([haunt_checker::order::REORDERED, "valid", "not-drained"]);
    let mut expectations = spec::EXPECTATIONS.to_vec();
    known.sort();
    expectations.sort();
    assert_eq!(expectations, known);
}

#[test]
fn the_faults_a_file_allows_follow_its_nodes_and_links() {
    use haunt_chaos::core::fault::Fault;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/system_files/good");
    let minimal = spec::load(&dir.join("minimal.toml")).unwrap();
    assert_eq!(
        haunt_chaos::systems::system_file::faults_allowed(&minimal),
        [Fault::Kill, Fault::Partition, Fault::Delay]
    );
    let counted = spec::load(&dir.join("counted-workers.toml")).unwrap();
    assert_eq!(
        haunt_chaos::systems::system_file::faults_allowed(&counted),
        [Fault::Kill, Fault::Pause, Fault::Partition, Fault::Delay]
    );
    let adopted = spec::load(&dir.join("adopted.toml")).unwrap();
    assert_eq!(adopted.nodes[0].container.as_deref(), Some("shop-db-1"));
    assert_eq!((adopted.nodes[1].port, adopted.nodes[1].links.as_slice()), (Some(8080), &["db".to_owned()][..]));
    assert_eq!(
        haunt_chaos::systems::system_file::faults_allowed(&adopted),
        [Fault::Kill, Fault::Pause, Fault::Partition, Fault::Delay, Fault::Loss]
    );
}
