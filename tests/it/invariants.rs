//! Holds architecture invariants of ARCHITECTURE.md that a test can hold,
//! besides the store's (`store_boundary`):
//!
//! - the checker depends on the format crate alone among the workspace's
//!   crates, and the format crate on none (read from `cargo metadata`);
//! - no process or container is started outside a backend: every `.rs` file
//!   of the workspace is scanned for the ways to start one, and only the files
//!   of [`MAY_SPAWN`] may hold them.
//!
//! Each rule is a function of plain data (the metadata, a file's text), and
//! each has a test that feeds it a violation, so that a rule that stopped
//! seeing anything would fail here rather than pass in silence.

use std::path::{Path, PathBuf};

use crate::source::{code_only, rust_files, without_comments, workspace};

// The checker's dependencies.

/// The crates kept apart from the rest of the workspace, each with the only
/// workspace crates it may depend on (normal and build dependencies).
const ISOLATED: [(&str, &[&str]); 2] = [
    // The checker decides on a run directory that any tool may have written:
    // it knows the format, and nothing of the services or the harness.
    ("haunt-checker", &["haunt-format"]),
    // The contract the harness and the checker meet in: serde and memchr,
    // nothing of haunt's.
    ("haunt-format", &[]),
];

/// Dev-dependencies of an isolated crate on a workspace crate, each with its
/// reason: `(crate, dependency)`. Its tests may use what its code may not, as
/// long as someone said why here. None today: the checker's tests are run
/// directories and generated histories, which need no service to produce.
const DEV_ALLOWED: [(&str, &str); 0] = [];

/// One dependency of a workspace crate on another.
#[derive(Debug, Clone, PartialEq)]
struct Dependency {
    from: String,
    to: String,
    /// `normal`, `dev` or `build`.
    kind: String,
    manifest: String,
}

/// The dependencies between workspace crates in `cargo metadata --no-deps`
/// output, where the packages are the workspace's members.
fn workspace_dependencies(metadata: &serde_json::Value) -> Vec<Dependency> {
    let packages = metadata["packages"].as_array().expect("cargo metadata lists packages");
    let members: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let root = metadata["workspace_root"].as_str().map(|r| format!("{r}/")).unwrap_or_default();
    let mut out = Vec::new();
    for package in packages {
        let from = package["name"].as_str().expect("a package has a name");
        let manifest = package["manifest_path"].as_str().unwrap_or("?");
        let manifest = manifest.strip_prefix(root.as_str()).unwrap_or(manifest);
        for dependency in package["dependencies"].as_array().into_iter().flatten() {
            // `name` is the package's name even when the dependency renames it.
            let to = dependency["name"].as_str().expect("a dependency has a name");
            if members.contains(&to) {
                out.push(Dependency {
                    from: from.to_owned(),
                    to: to.to_owned(),
                    kind: dependency["kind"].as_str().unwrap_or("normal").to_owned(),
                    manifest: manifest.to_owned(),
                });
            }
        }
    }
    out
}

/// The dependencies that break [`ISOLATED`], one line each.
fn isolation_broken(dependencies: &[Dependency]) -> Vec<String> {
    let mut broken = Vec::new();
    for d in dependencies {
        let Some((_, allowed)) = ISOLATED.iter().find(|(name, _)| *name == d.from) else { continue };
        let ok = match d.kind.as_str() {
            "dev" => allowed.contains(&d.to.as_str()) || DEV_ALLOWED.contains(&(d.from.as_str(), d.to.as_str())),
            _ => allowed.contains(&d.to.as_str()),
        };
        if !ok {
            broken.push(format!("{} has a {} dependency on {} ({})", d.from, d.kind, d.to, d.manifest));
        }
    }
    broken
}

fn cargo_metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace())
        .output()
        .unwrap_or_else(|e| panic!("running {cargo} metadata: {e}"));
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

#[test]
fn the_checker_depends_on_the_format_crate_alone_and_the_format_on_nothing_of_haunts() {
    let dependencies = workspace_dependencies(&cargo_metadata());
    // The reading sees dependencies where there are some: normal and dev.
    let has =
        |from: &str, to: &str, kind: &str| dependencies.iter().any(|d| d.from == from && d.to == to && d.kind == kind);
    assert!(has("haunt-chaos", "haunt-store", "normal"), "{dependencies:#?}");
    assert!(has("haunt-worker", "haunt-testkit", "dev"), "{dependencies:#?}");
    assert!(has("haunt-checker", "haunt-format", "normal"), "{dependencies:#?}");
    for (name, _) in ISOLATED {
        assert!(dependencies.iter().any(|d| d.from == name || d.to == name), "{name} is not in the workspace");
    }
    let broken = isolation_broken(&dependencies);
    assert!(
        broken.is_empty(),
        "the checker depends on haunt-format alone, and haunt-format on nothing of haunt's (ARCHITECTURE.md):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_dependency_rule_refuses_a_service_in_the_checker() {
    let metadata = serde_json::json!({"packages": [
        {"name": "haunt-checker", "manifest_path": "checker/check/Cargo.toml", "dependencies": [
            {"name": "haunt-format", "kind": null},
            {"name": "haunt-store", "kind": null, "rename": "store"},
            {"name": "haunt-testkit", "kind": "dev"},
            {"name": "serde", "kind": null},
        ]},
        {"name": "haunt-format", "manifest_path": "checker/format/Cargo.toml", "dependencies": [
            {"name": "haunt-telemetry", "kind": "build"},
        ]},
        {"name": "haunt-store", "manifest_path": "services/store/Cargo.toml", "dependencies": []},
        {"name": "haunt-testkit", "manifest_path": "services/testkit/Cargo.toml", "dependencies": []},
        {"name": "haunt-telemetry", "manifest_path": "services/telemetry/Cargo.toml", "dependencies": []},
    ]});
    assert_eq!(
        isolation_broken(&workspace_dependencies(&metadata)),
        [
            "haunt-checker has a normal dependency on haunt-store (checker/check/Cargo.toml)",
            "haunt-checker has a dev dependency on haunt-testkit (checker/check/Cargo.toml)",
            "haunt-format has a build dependency on haunt-telemetry (checker/format/Cargo.toml)",
        ]
    );
}

// Who starts processes and containers.

/// The files that may start a process or a container, each with its reason
/// above it.
/// A backend starts the nodes of a cluster and so is here; anything else that
/// starts one needs a reason as good. An entry that no longer starts anything
/// fails the test too: remove it.
const MAY_SPAWN: [&str; 9] = [
    // The backends (the `Backend` role): the cluster's nodes as child
    // processes with a parent-death signal, ...
    "chaos/src/backends/local.rs",
    // ... as containers through the Docker API (bollard, as re-exported by
    // testcontainers: create, kill, pause, logs, networks, the helpers that
    // cut links, removal by label), the backend itself and its dealings with
    // the engine, ...
    "chaos/src/backends/docker/mod.rs",
    "chaos/src/backends/docker/engine.rs",
    // ... and a PostgreSQL server crashed and restarted by its data
    // directory through `pg_ctl` (under `runuser` when run as root).
    "chaos/src/backends/postgres.rs",
    // The matrix (`haunt matrix`) runs each bug mode and seed as a child
    // `haunt run`, which starts its own cluster through a backend: a row is a
    // whole run, not a node of a system under test, and each row's processes
    // die with that child.
    "chaos/src/suites/matrix/child.rs",
    // `haunt guarantees` does the same for each transport and seed, and after
    // a run starts one `haunt worker` on that run's (stopped) database to
    // apply what `reconcile` re-enqueued: no fault touches it, it is killed
    // once the queue is empty, and on drop.
    "chaos/src/suites/guarantees/mod.rs",
    // `haunt bench pipeline` measures one `haunt worker` process from outside
    // (its throughput, peak resident set and CPU time from /proc), optionally
    // under a profiler wrapper that it stops with `kill -INT` so the profile
    // is written; no fault touches it, and it is killed on drop.
    "bench/src/worker_process.rs",
    // The build script asks git for the revision the binary is stamped with;
    // it runs when the binary is built, never during a run.
    "build.rs",
    // A dev-only crate (never linked into `haunt`): with
    // `HAUNT_TEST_POSTGRES=container` it starts a PostgreSQL container per
    // test database through testcontainers.
    "services/testkit/src/lib.rs",
];

/// Names in code that start a process or talk to a container engine: the
/// POSIX calls (through `nix` or `libc`) and the Docker API crates.
const SPAWN_NAMES: [&str; 14] = [
    "fork",
    "vfork",
    "execv",
    "execve",
    "execvp",
    "execvpe",
    "execl",
    "execle",
    "execlp",
    "fexecve",
    "posix_spawn",
    "posix_spawnp",
    "testcontainers",
    "bollard",
];

/// `(line, what)` for each way of starting a process or a container in one
/// file. Seen in code (not in comments, not in the text of a literal such as
/// a log message): `Command::new`; the `Command` type of `std::process` or
/// `tokio::process` named by path or imported in a group (`use
/// std::process::{Child, Command}`), which also catches an alias; the names of
/// [`SPAWN_NAMES`]. Seen in literals too: the Docker engine's socket
/// (`docker.sock`), which an HTTP client could talk to. A `Command` passed in
/// from elsewhere is seen where it was made.
fn spawns(src: &str) -> Vec<(usize, String)> {
    let code = without_comments(src);
    let names = code_only(src);
    let line_of = |offset: usize| 1 + code[..offset].matches('\n').count();
    let mut hits: Vec<(usize, String)> =
        code.match_indices("docker.sock").map(|(at, pattern)| (at, pattern.to_owned())).collect();
    for pattern in ["Command::new", "process::Command"] {
        hits.extend(names.match_indices(pattern).map(|(at, _)| (at, pattern.to_owned())));
    }
    for (at, _) in names.match_indices("process::{") {
        let group = &names[at..names[at..].find('}').map_or(names.len(), |end| at + end)];
        if words(group).iter().any(|(_, w)| *w == "Command") {
            hits.push((at, "process::{…Command…}".to_owned()));
        }
    }
    for (at, word) in words(&names) {
        if SPAWN_NAMES.contains(&word) {
            hits.push((at, word.to_owned()));
        }
    }
    hits.sort();
    hits.into_iter().map(|(at, what)| (line_of(at), what)).collect()
}

/// The identifiers of `code` with their byte offsets.
fn words(code: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (at, c) in code.char_indices().chain([(code.len(), ' ')]) {
        match (start, c.is_alphanumeric() || c == '_') {
            (None, true) => start = Some(at),
            (Some(from), false) => {
                out.push((from, &code[from..at]));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Integration tests (any file under a `tests` directory) are not scanned:
/// they start the binary, and the engines a test needs, and are no part of a
/// run. Unit tests inside `src` are scanned like the code around them.
fn is_integration_test(relative: &Path) -> bool {
    relative.components().any(|c| c.as_os_str() == "tests")
}

#[test]
fn no_process_or_container_is_started_outside_a_backend() {
    let root = workspace();
    let mut files = Vec::new();
    rust_files(&root, &[], 0, &mut files);
    let files: Vec<PathBuf> =
        files.into_iter().filter(|f| !is_integration_test(f.strip_prefix(&root).unwrap())).collect();
    // The walk reached every part the invariant is about, and left the tests out.
    for must in [
        "build.rs",
        "src/cli.rs",
        "chaos/src/lib.rs",
        "chaos/src/core/run.rs",
        "services/worker/src/lib.rs",
        "checker/check/src/lib.rs",
    ] {
        assert!(files.contains(&root.join(must)), "{must} was not scanned");
    }
    assert!(!files.contains(&root.join("tests/it/main.rs")), "integration tests are not scanned");
    let mut hits = Vec::new();
    let mut used = Vec::new();
    for file in &files {
        let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let relative = file.strip_prefix(&root).unwrap();
        let found = spawns(&src);
        if let Some(allowed) = MAY_SPAWN.iter().find(|f| relative == Path::new(f)) {
            if !found.is_empty() {
                used.push(*allowed);
            }
            continue;
        }
        hits.extend(found.into_iter().map(|(line, what)| format!("{}:{line}: {what}", relative.display())));
    }
    let stale: Vec<&str> = MAY_SPAWN.into_iter().filter(|f| !used.contains(f)).collect();
    assert!(stale.is_empty(), "these MAY_SPAWN entries start nothing (or are gone): remove them: {stale:?}");
    assert!(
        hits.is_empty(),
        "only a backend starts processes or containers (ARCHITECTURE.md); start these through \
         a backend (chaos/src/backends/: local.rs, docker/, postgres.rs), or add the file to MAY_SPAWN \
         in tests/it/invariants.rs with the reason it may:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_spawn_scan_sees_each_way_and_skips_comments_and_messages() {
    // Built at run time, so that this file holds no spawn of its own (it is
    // not scanned, but a copy of it elsewhere would be).
    let (c, p) = (["Command", "new"].join("::"), ["process", "Command"].join("::"));
    let src = format!(
        "// {c}(\"sh\") in a comment\n\
         /* {p}\n   in a block comment */\n\
         use std::{p} as Cmd;\n\
         use tokio::process::{{Child,\n    Command}};\n\
         let _ = {c}(\"docker\");\n\
         tracing::warn!(\"cannot fork, exec or {c} here\"); // a message\n\
         match unsafe {{ nix::unistd::fork() }} {{}}\n\
         let url = \"unix:///var/run/docker.sock\";\n\
         let forked = fork_count(); let _ = std::process::id();\n"
    );
    assert_eq!(
        spawns(&src),
        [
            (4, "process::Command".to_owned()),
            (5, "process::{…Command…}".to_owned()),
            (7, "Command::new".to_owned()),
            (9, "fork".to_owned()),
            (10, "docker.sock".to_owned()),
        ]
    );
}

/// `(file, line)` of every start of the `docker` command line in `src`.
fn docker_cli(src: &str) -> Vec<usize> {
    let code = without_comments(src);
    let line_of = |offset: usize| 1 + code[..offset].matches('\n').count();
    code.match_indices("Command::new(\"docker\")").map(|(at, _)| line_of(at)).collect()
}

#[test]
fn docker_is_spoken_to_one_way_through_its_api_never_the_command_line() {
    // Integration tests included: a test that shells out to `docker` checks
    // something other than what the harness does.
    let root = workspace();
    let mut files = Vec::new();
    rust_files(&root, &[], 0, &mut files);
    assert!(files.contains(&root.join("tests/it/docker.rs")), "the container tests were scanned");
    let hits: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let src = std::fs::read_to_string(file).unwrap();
            let relative = file.strip_prefix(&root).unwrap().display().to_string();
            docker_cli(&src).into_iter().map(move |line| format!("{relative}:{line}"))
        })
        .collect();
    assert!(
        hits.is_empty(),
        "talk to Docker through haunt_chaos::backends::docker (bollard, testcontainers), not the CLI:\n{}",
        hits.join("\n")
    );
    assert_eq!(docker_cli("let x = 1;\nstd::process::Command::new(\"docker\").arg(\"ps\");"), [2]);
}
