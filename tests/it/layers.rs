//! The harness crate's rooms and its module graph (ARCHITECTURE.md):
//!
//! - `chaos/src` has four rooms, `core`, `backends`, `systems` and `suites`,
//!   in that order, and the files beside them (`lib.rs`, `test.rs`,
//!   `assemble.rs`) above all four. A module may name modules of its own room
//!   and of the rooms before it, never of a room after it: `core` knows no
//!   backend, system or suite.
//! - No module, followed through what it names, comes back to itself: the
//!   graph of `crate::ROOM::MODULE` paths has no circle.
//!
//! A module is a room's file or folder (`core::nemesis`, which may be a
//! folder of files, or `systems::system_file`); what a folder's files name of
//! each other stays inside it. Unit tests (`#[cfg(test)]` items) are left
//! out: a test may build what it tests from any room, and links into nothing.
//! Each rule is a function of plain text, and a test below feeds it the
//! violations it must see.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::source::{code_only, rust_files, workspace};

/// The rooms in order: each may use itself and those before it.
const ROOMS: [&str; 4] = ["core", "backends", "systems", "suites"];

/// The rank of a room, or of the top (the files beside the rooms).
fn rank(room: &str) -> usize {
    ROOMS.iter().position(|r| *r == room).unwrap_or(ROOMS.len())
}

/// `room::module` of a file under `chaos/src` (`core/nemesis/aim.rs` is
/// `core::nemesis`), or `top::stem` for a file beside the rooms.
fn module_of(relative: &Path) -> String {
    let parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let stem = |s: &str| s.trim_end_matches(".rs").to_owned();
    match parts.as_slice() {
        [room, file] if ROOMS.contains(&room.as_str()) && file == "mod.rs" => format!("{room}::mod"),
        [room, module, ..] if ROOMS.contains(&room.as_str()) => format!("{room}::{}", stem(module)),
        [file] => format!("top::{}", stem(file)),
        _ => panic!("{} is not where a module of chaos/src can be", relative.display()),
    }
}

/// `code` without its `#[cfg(test)]` items: from each attribute to the end
/// of the braces of the item it marks (braces in string literals are already
/// blanked by `code_only`; a brace in a char literal is skipped).
fn without_tests(code: &str) -> String {
    let bytes = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut at = 0;
    while let Some(found) = code[at..].find("#[cfg(test)]") {
        let start = at + found;
        out.push_str(&code[at..start]);
        let Some(open) = code[start..].find('{').map(|o| start + o) else {
            at = code.len();
            break;
        };
        let mut depth = 0usize;
        let mut end = code.len();
        for (i, &b) in bytes.iter().enumerate().skip(open) {
            let in_char = i > 0 && i + 1 < bytes.len() && bytes[i - 1] == b'\'' && bytes[i + 1] == b'\'';
            match b {
                b'{' if !in_char => depth += 1,
                b'}' if !in_char => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        at = end;
    }
    out.push_str(&code[at.min(code.len())..]);
    out
}

/// The `room::module`s that `code` names by `crate::ROOM::MODULE`, the
/// members of a group (`crate::core::{fault, roles::Node}`) included.
fn names(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code.as_bytes()[at - 1] == b':' {
            continue; // `$crate::`-like or `::crate::`: not a path of ours
        }
        let rest = &code[at + "crate::".len()..];
        let room: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !ROOMS.contains(&room.as_str()) {
            continue;
        }
        let after = rest[room.len()..].trim_start();
        let Some(after) = after.strip_prefix("::") else { continue };
        let after = after.trim_start();
        if let Some(group) = after.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for member in group.split(',') {
                let module: String = member.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !module.is_empty() && module != "self" {
                    out.insert(format!("{room}::{module}"));
                }
            }
        } else {
            let module: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !module.is_empty() {
                out.insert(format!("{room}::{module}"));
            }
        }
    }
    out
}

/// The module graph: each module and what it names, itself left out.
fn graph(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, src) in files {
        let named = names(&without_tests(&code_only(src)));
        out.entry(module.clone()).or_default().extend(named.into_iter().filter(|n| n != module));
    }
    out
}

/// Every arrow from a room to a later one, as `from -> to`.
fn arrows_up(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let room = |m: &str| m.split("::").next().unwrap_or("").to_owned();
    let mut out = Vec::new();
    for (from, tos) in graph {
        for to in tos {
            if rank(&room(to)) > rank(&room(from)) {
                out.push(format!("{from} -> {to}"));
            }
        }
    }
    out
}

/// One circle of the graph, if it has one: the modules in order, the first
/// again at the end.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // Depth first, with the path on a stack; a module on the path met again
    // closes a circle.
    fn visit(
        at: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| m == at) {
            let mut found = path[start..].to_vec();
            found.push(at.to_owned());
            return Some(found);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_owned());
        for next in graph.get(at).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(at.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

fn chaos_files() -> Vec<(String, String)> {
    let root = workspace().join("chaos/src");
    let mut files = Vec::new();
    rust_files(&root, &[], 0, &mut files);
    files
        .iter()
        .map(|f| {
            let src = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (module_of(f.strip_prefix(&root).unwrap()), src)
        })
        .collect()
}

#[test]
fn the_harness_rooms_point_only_down_and_its_modules_make_no_circle() {
    let graph = graph(&chaos_files());
    // The reading sees the graph: the run's phases use the roles, and the
    // rooms are all there.
    assert!(graph["core::run"].contains("core::roles"), "{graph:#?}");
    for room in ROOMS {
        assert!(graph.keys().any(|m| m.starts_with(&format!("{room}::"))), "no module of {room}");
    }
    let up = arrows_up(&graph);
    assert!(
        up.is_empty(),
        "a room uses only itself and the rooms before it ({}; ARCHITECTURE.md): move the type to the room \
         that needs it, or give the seam a small trait of its own:\n{}",
        ROOMS.join(" < "),
        up.join("\n")
    );
    if let Some(found) = circle(&graph) {
        panic!("the modules of chaos/src make a circle: {}", found.join(" -> "));
    }
}

#[test]
fn the_room_rules_see_an_arrow_up_a_group_a_circle_and_skip_tests() {
    let files = vec![
        ("core::run".to_owned(), "use crate::core::roles::Node;\nuse crate::systems::pipeline::Pipeline;".to_owned()),
        (
            "core::roles".to_owned(),
            "use crate::core::{fault, run::Roles};\n#[cfg(test)]\nmod tests { use crate::backends::local; \
             fn f() { let _ = '{'; } }\nfn after() {}"
                .to_owned(),
        ),
        ("core::fault".to_owned(), "// crate::core::run in a comment\nlet s = \"crate::suites::matrix\";".to_owned()),
        ("systems::pipeline".to_owned(), "use crate::core::run;".to_owned()),
    ];
    let graph = graph(&files);
    assert_eq!(graph["core::roles"], BTreeSet::from(["core::fault".to_owned(), "core::run".to_owned()]));
    assert!(graph["core::fault"].is_empty(), "comments and literals name nothing");
    assert_eq!(arrows_up(&graph), ["core::run -> systems::pipeline"]);
    let found = circle(&graph).expect("run -> roles -> run");
    assert_eq!(found.first(), found.last());
    assert!(found.contains(&"core::roles".to_owned()) && found.contains(&"core::run".to_owned()), "{found:?}");
    assert!(without_tests("a\n#[cfg(test)]\nmod t { b { c } }\nd").contains('d'));
    assert_eq!(module_of(Path::new("core/nemesis/aim.rs")), "core::nemesis");
    assert_eq!(module_of(Path::new("systems/system_file/spec.rs")), "systems::system_file");
    assert_eq!(module_of(Path::new("test.rs")), "top::test");
}
