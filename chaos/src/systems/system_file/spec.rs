//! The system file, read and checked: every field the contract names
//! (`docs/system-format.md`), typed, and every mistake refused before anything
//! starts, with the field and its line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// A system file that does not follow the contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    pub file: PathBuf,
    /// 1-based, when the mistake has a place.
    pub line: Option<usize>,
    /// The field, as a path: `node[2].command`, `client.ok`.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}: {}", self.file.display(), self.field, self.message),
            None => write!(f, "{}: {}: {}", self.file.display(), self.field, self.message),
        }
    }
}

impl std::error::Error for SpecError {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    name: Spanned<String>,
    #[serde(default, rename = "node")]
    nodes: Vec<RawNode>,
    client: Spanned<RawClient>,
    final_state: Spanned<RawFinal>,
    #[serde(default, rename = "variant")]
    variants: Vec<RawVariant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVariant {
    name: Spanned<String>,
    expect: Spanned<String>,
    nemesis: Option<Spanned<String>>,
    #[serde(default)]
    fault_targets: Vec<String>,
    #[serde(default = "no_vars")]
    vars: Spanned<std::collections::BTreeMap<String, String>>,
}

fn no_vars() -> Spanned<std::collections::BTreeMap<String, String>> {
    Spanned::new(0..0, Default::default())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: Spanned<String>,
    count: Option<Spanned<i64>>,
    #[serde(default = "no_command")]
    command: Spanned<Vec<String>>,
    image: Option<Spanned<String>>,
    container: Option<Spanned<String>>,
    port: Option<Spanned<i64>>,
    links: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    ready: Option<Spanned<String>>,
    faults: Option<Spanned<Vec<String>>>,
    admin: Option<Spanned<String>>,
    points: Option<Spanned<Vec<String>>>,
    hooks: Option<Spanned<Vec<String>>>,
    aim: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    #[serde(default = "post")]
    method: Spanned<String>,
    url: Spanned<String>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    body: Option<Spanned<String>>,
    ok: Spanned<Vec<i64>>,
    fail: Option<Spanned<Vec<i64>>>,
    event_id: Option<Spanned<String>>,
}

fn no_command() -> Spanned<Vec<String>> {
    Spanned::new(0..0, Vec::new())
}

fn post() -> Spanned<String> {
    Spanned::new(0..0, "POST".to_owned())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFinal {
    database: Spanned<String>,
    orders: String,
    projection: String,
    applied: Option<String>,
    pending: Option<String>,
    dead_letters: Option<String>,
    quiet: Option<String>,
}

pub use super::decl::{ClientDecl, FinalDecl, NodeDecl, NodeFault, SystemSpec, VariantDecl};
use crate::core::fault::Fault;

/// The switch faults a node of a system file may take on its admin
/// endpoint (its `hooks`); [`hook_field`] names the switch of each.
pub const HOOKS: [Fault; 3] = [Fault::AckLoss, Fault::DbError, Fault::ClockSkew];

/// The field of `POST /admin/faults` that flips a hook's fault.
pub fn hook_field(fault: Fault) -> &'static str {
    match fault {
        Fault::AckLoss => "ack_fail_rate",
        Fault::DbError => "db_error_rate",
        Fault::ClockSkew => "clock_offset_ms",
        _ => unreachable!("{fault} is not a hook"),
    }
}

/// What a `[[variant]]` may expect of its runs: `valid`, a queue that never
/// drains, or one of the checker's anomalies.
pub const EXPECTATIONS: [&str; 9] = [
    "valid",
    "not-drained",
    "lost-order",
    "lost-effect",
    "double-applied",
    "projection-mismatch",
    "failed-but-present",
    "unexpected-effect",
    "reordered",
];

/// The variable that hands a node with `admin` the run's bearer token.
pub const TOKEN_VAR: &str = "HAUNT_ADMIN_TOKEN";

/// A placeholder in a string: `{dir}`, `{port:api}`, …
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placeholder<'a> {
    /// The `haunt` executable running the harness (an addition to the contract).
    Haunt,
    Dir,
    SystemDir,
    N,
    Port(&'a str),
    Addr(&'a str),
    OrderId,
    ItemId,
    Qty,
    /// A value of the run's `[[variant]]`.
    Var(&'a str),
}

/// The pieces of a string: literal text and placeholders. Braces that do not
/// make a placeholder's shape (`{"order_id": …}` in a JSON body) are text.
pub fn pieces(text: &str) -> Result<Vec<Result<&str, Placeholder<'_>>>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        let inner = &after[..close];
        let (key, arg) = match inner.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (inner, None),
        };
        let shaped = !key.is_empty()
            && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            && arg.is_none_or(|a| !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
        if !shaped {
            out.push(Ok(&rest[..open + 1]));
            rest = after;
            continue;
        }
        let placeholder = match (key, arg) {
            ("haunt", None) => Placeholder::Haunt,
            ("dir", None) => Placeholder::Dir,
            ("system_dir", None) => Placeholder::SystemDir,
            ("n", None) => Placeholder::N,
            ("port", Some(name)) => Placeholder::Port(name),
            ("addr", Some(name)) => Placeholder::Addr(name),
            ("var", Some(name)) => Placeholder::Var(name),
            ("order_id", None) => Placeholder::OrderId,
            ("item_id", None) => Placeholder::ItemId,
            ("qty", None) => Placeholder::Qty,
            _ => return Err(format!("unknown placeholder {{{inner}}}")),
        };
        if open > 0 {
            out.push(Ok(&rest[..open]));
        }
        out.push(Err(placeholder));
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Ok(rest));
    }
    Ok(out)
}

/// Where a placeholder stands, for what it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A node's command or env; `counted`: the node has `count`.
    Node {
        counted: bool,
    },
    Ready,
    /// A node's admin URL; `counted`: the node has `count`.
    Admin {
        counted: bool,
    },
    Client,
    Database,
}

struct Checker<'a> {
    file: &'a Path,
    text: &'a str,
}

fn line_at(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|b| **b == b'\n').count() + 1
}

impl Checker<'_> {
    fn at(&self, span: std::ops::Range<usize>, field: &str, message: impl Into<String>) -> SpecError {
        let line = (span.end > 0).then(|| line_at(self.text, span.start));
        SpecError { file: self.file.to_owned(), line, field: field.to_owned(), message: message.into() }
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Reads and checks the system file at `path`.
pub fn load(path: &Path) -> Result<SystemSpec, SpecError> {
    let text = std::fs::read_to_string(path).map_err(|e| SpecError {
        file: path.to_owned(),
        line: None,
        field: "(file)".into(),
        message: format!("cannot read it: {e}"),
    })?;
    parse(path, &text)
}

/// Checks the text of a system file; `path` names it in errors and gives `{system_dir}`.
pub fn parse(path: &Path, text: &str) -> Result<SystemSpec, SpecError> {
    let c = Checker { file: path, text };
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_at(text, s.start));
        // toml's message names the field (`missing field `command``, `unknown
        // field `comand`, expected one of …`); its first lines repeat the place.
        let message = e.message().to_owned();
        SpecError { file: path.to_owned(), line, field: field_of_toml_error(&message), message }
    })?;
    let name = raw.name.get_ref();
    if !valid_name(name) {
        return Err(c.at(raw.name.span(), "name", "letters, digits, `-` and `_` only (it names the run directory)"));
    }
    if raw.nodes.is_empty() {
        return Err(c.at(0..0, "node", "no [[node]]: a system has at least one process for haunt to start"));
    }

    // Instances first: placeholders may name any of them.
    let mut instances = Instances::default();
    for (i, node) in raw.nodes.iter().enumerate() {
        let shape = c.node(i, node)?;
        instances.add(&c, i, node, shape)?;
    }
    let variants = c.variants(&raw.variants)?;
    // The names every variant gives a value.
    let vars: BTreeSet<&str> = raw
        .variants
        .first()
        .map(|first| first.vars.get_ref().keys().map(String::as_str))
        .into_iter()
        .flatten()
        .filter(|k| raw.variants.iter().all(|v| v.vars.get_ref().contains_key(*k)))
        .collect();
    let places = Places {
        c: &c,
        vars,
        variants: !variants.is_empty(),
        names: instances.decls.iter().map(|n| n.name.as_str()).collect(),
        counted: &instances.counted,
    };
    for (decl, &i) in instances.decls.iter().zip(&instances.origin) {
        places.node(i, &raw.nodes[i], decl)?;
    }
    c.adoption_and_links(&raw.nodes, &instances)?;
    let client = c.client(raw.client.get_ref(), &places)?;
    let final_state = c.final_state(&raw.final_state, &places)?;

    let system_dir = path.parent().map(Path::to_owned).unwrap_or_default();
    let system_dir = if system_dir.as_os_str().is_empty() { PathBuf::from(".") } else { system_dir };
    Ok(SystemSpec {
        file: path.to_owned(),
        name: name.clone(),
        system_dir,
        nodes: instances.decls,
        client,
        final_state,
        variants,
        variant: None,
    })
}

/// What one `[[node]]` declares, checked, before its instances are made.
struct Shape {
    base: String,
    count: Option<u32>,
    image: Option<String>,
    container: Option<String>,
    port: Option<u16>,
    links: Vec<String>,
    faults: Vec<NodeFault>,
    admin: Admin,
}

/// What a node offers on its admin endpoint (`docs/admin.md`).
#[derive(Default)]
struct Admin {
    url: Option<String>,
    points: Vec<String>,
    hooks: Vec<Fault>,
}

/// The nodes' instances, in order, with the `[[node]]` each came from.
#[derive(Default)]
struct Instances {
    decls: Vec<NodeDecl>,
    /// The index of each instance's `[[node]]`.
    origin: Vec<usize>,
    /// The names of the nodes with a count.
    counted: BTreeSet<String>,
}

impl Instances {
    /// The instances of `[[node]]` number `i`: one, or `count` of them named
    /// `NAME-1` … `NAME-count`.
    fn add(&mut self, c: &Checker<'_>, i: usize, node: &RawNode, shape: Shape) -> Result<(), SpecError> {
        let Shape { base, count, image, container, port, links, faults, admin } = shape;
        if count.is_some() {
            self.counted.insert(base.clone());
        }
        for n in 1..=count.unwrap_or(1) {
            let name = if count.is_some() { format!("{base}-{n}") } else { base.clone() };
            if self.decls.iter().any(|d| d.name == name) {
                return Err(c.at(node.name.span(), &format!("node[{i}].name"), format!("a second node named {name}")));
            }
            // `{n}` is filled per instance of a node with a count; anywhere
            // else it stays, and the placeholder check refuses it.
            let fill_n = |s: &String| if count.is_some() { s.replace("{n}", &n.to_string()) } else { s.clone() };
            self.origin.push(i);
            self.decls.push(NodeDecl {
                name,
                base: base.clone(),
                n,
                command: node.command.get_ref().iter().map(fill_n).collect(),
                image: image.clone(),
                container: container.clone(),
                port,
                links: links.clone(),
                env: node.env.iter().map(|(k, v)| (k.clone(), fill_n(v))).collect(),
                ready: node.ready.as_ref().map(|r| fill_n(r.get_ref())),
                faults: faults.clone(),
                admin: admin.url.as_ref().map(fill_n),
                points: admin.points.clone(),
                hooks: admin.hooks.clone(),
                aim: node.aim.as_ref().map(|a| fill_n(a.get_ref())),
            });
        }
        Ok(())
    }
}

/// The placeholders of a system file, checked where they stand.
struct Places<'a> {
    c: &'a Checker<'a>,
    /// The names every variant gives a value (none without variants).
    vars: BTreeSet<&'a str>,
    /// Whether the file has variants at all.
    variants: bool,
    /// Every instance's name.
    names: BTreeSet<&'a str>,
    counted: &'a BTreeSet<String>,
}

impl Places<'_> {
    /// `{var:NAME}`: every variant gives NAME a value.
    fn var(&self, name: &str, span: std::ops::Range<usize>, field: &str) -> Result<(), SpecError> {
        if !self.variants {
            return Err(self.c.at(span, field, format!("{{var:{name}}}: no [[variant]] gives it a value")));
        }
        if !self.vars.contains(name) {
            let why = format!("{{var:{name}}}: not every [[variant]] gives it a value in `vars`");
            return Err(self.c.at(span, field, why));
        }
        Ok(())
    }

    fn check(&self, s: &str, span: std::ops::Range<usize>, field: &str, place: Place) -> Result<(), SpecError> {
        let c = self.c;
        for piece in pieces(s).map_err(|m| c.at(span.clone(), field, m))? {
            let Err(p) = piece else { continue };
            if let Placeholder::Var(name) = p {
                self.var(name, span.clone(), field)?;
                continue;
            }
            let allowed = match (&p, place) {
                (Placeholder::Dir | Placeholder::SystemDir | Placeholder::Haunt, _) => true,
                (Placeholder::N, Place::Node { counted } | Place::Admin { counted }) => counted,
                (Placeholder::Port(_), Place::Node { .. } | Place::Ready | Place::Admin { .. } | Place::Database) => {
                    true
                }
                (Placeholder::Addr(_), Place::Node { .. } | Place::Client) => true,
                (Placeholder::OrderId | Placeholder::ItemId | Placeholder::Qty, Place::Client) => true,
                _ => false,
            };
            if !allowed {
                let why = match p {
                    Placeholder::N => "{n} is only for the command, env and admin of a node with count",
                    Placeholder::Addr(_) => {
                        "{addr:NAME} is for nodes' commands and env and the client (the harness reads \
                                             the database and polls readiness directly: use {port:NAME})"
                    }
                    Placeholder::Port(_) => "the client reaches a node through {addr:NAME}, so its link can be faulted",
                    _ => "{order_id}, {item_id} and {qty} are only for the client",
                };
                return Err(c.at(span.clone(), field, why));
            }
            if let Placeholder::Port(name) | Placeholder::Addr(name) = p
                && !self.names.contains(name)
            {
                let message = if self.counted.contains(name) {
                    format!("{name} has a count: name one instance ({name}-1, or {name}-{{n}} in its own command)")
                } else {
                    let known: Vec<&str> = self.names.iter().copied().collect();
                    format!("names an unknown node {name:?} (nodes: {})", known.join(", "))
                };
                return Err(c.at(span.clone(), field, message));
            }
        }
        Ok(())
    }

    /// An instance's command, env and readiness check.
    fn node(&self, i: usize, node: &RawNode, decl: &NodeDecl) -> Result<(), SpecError> {
        let place = Place::Node { counted: node.count.is_some() };
        for arg in &decl.command {
            self.check(arg, node.command.span(), &format!("node[{i}].command"), place)?;
        }
        for (k, v) in &decl.env {
            self.check(v, node.name.span(), &format!("node[{i}].env.{k}"), place)?;
        }
        if let (Some(ready), Some(raw_ready)) = (&decl.ready, &node.ready) {
            self.check(ready, raw_ready.span(), &format!("node[{i}].ready"), Place::Ready)?;
        }
        if let (Some(admin), Some(raw_admin)) = (&decl.admin, &node.admin) {
            let place = Place::Admin { counted: node.count.is_some() };
            self.check(admin, raw_admin.span(), &format!("node[{i}].admin"), place)?;
        }
        if let (Some(aim), Some(raw_aim)) = (&decl.aim, &node.aim) {
            let field = format!("node[{i}].aim");
            if aim.trim().is_empty() {
                return Err(self.c.at(raw_aim.span(), &field, "empty: an http://… URL or an SQL query"));
            }
            self.check(aim, raw_aim.span(), &field, Place::Admin { counted: node.count.is_some() })?;
        }
        Ok(())
    }
}

impl Checker<'_> {
    /// `[[node]]` number `i`, alone.
    fn node(&self, i: usize, node: &RawNode) -> Result<Shape, SpecError> {
        let field = |f: &str| format!("node[{i}].{f}");
        let base = node.name.get_ref().clone();
        if !valid_name(&base) {
            return Err(self.at(node.name.span(), &field("name"), "letters, digits, `-` and `_` only"));
        }
        let count = match &node.count {
            None => None,
            Some(n) if (1..=64).contains(n.get_ref()) => Some(*n.get_ref() as u32),
            Some(n) => return Err(self.at(n.span(), &field("count"), "between 1 and 64")),
        };
        let image = match &node.image {
            Some(image) if image.get_ref().trim().is_empty() => {
                return Err(self.at(image.span(), &field("image"), "empty: name the image the node runs from"));
            }
            Some(image) => Some(image.get_ref().clone()),
            None => None,
        };
        let command_empty = node.command.get_ref().first().is_none_or(String::is_empty);
        let container = self.container(i, node, image.is_some(), command_empty)?;
        let links = match &node.links {
            Some(links) if container.is_none() => {
                return Err(self.at(
                    links.span(),
                    &field("links"),
                    "only for a container: a node haunt starts names its links with {addr:NAME}",
                ));
            }
            Some(links) => links.get_ref().clone(),
            None => Vec::new(),
        };
        if image.is_none() && container.is_none() && command_empty {
            let span = if node.command.span().end > 0 { node.command.span() } else { node.name.span() };
            return Err(self.at(span, &field("command"), "empty: give the program and its arguments (or an image)"));
        }
        let port = match &node.port {
            None => None,
            Some(p) if image.is_none() && container.is_none() => {
                return Err(self.at(
                    p.span(),
                    &field("port"),
                    "only for a node with an image or a container: its port inside",
                ));
            }
            Some(p) => match u16::try_from(*p.get_ref()) {
                Ok(port) if port > 0 => Some(port),
                _ => return Err(self.at(p.span(), &field("port"), "a TCP port, 1 to 65535")),
            },
        };
        if let Some(ready) = &node.ready
            && !(ready.get_ref().starts_with("http://") || ready.get_ref().starts_with("tcp://"))
        {
            return Err(self.at(ready.span(), &field("ready"), "an http://… URL polled until 2xx, or tcp://HOST:PORT"));
        }
        let faults = self.node_faults(i, node)?;
        let admin = self.admin(i, node, container.is_some())?;
        Ok(Shape { base, count, image, container, port, links, faults, admin })
    }

    /// A node's `container`: a running container haunt adopts as it is, so
    /// nothing that would start one may stand beside it.
    fn container(
        &self,
        i: usize,
        node: &RawNode,
        has_image: bool,
        command_empty: bool,
    ) -> Result<Option<String>, SpecError> {
        let Some(name) = &node.container else { return Ok(None) };
        let field = format!("node[{i}].container");
        if name.get_ref().trim().is_empty() {
            return Err(self.at(name.span(), &field, "empty: name or id of a running container"));
        }
        let clash = if has_image {
            Some("image")
        } else if !command_empty {
            Some("command")
        } else if node.count.is_some() {
            Some("count")
        } else if !node.env.is_empty() {
            Some("env")
        } else {
            None
        };
        if let Some(other) = clash {
            return Err(self.at(
                name.span(),
                &field,
                format!("a running container has no {other}: haunt adopts it as it is"),
            ));
        }
        Ok(Some(name.get_ref().clone()))
    }

    /// A node's admin endpoint, its hold points and its fault hooks.
    fn admin(&self, i: usize, node: &RawNode, adopted: bool) -> Result<Admin, SpecError> {
        let field = |f: &str| format!("node[{i}].{f}");
        let Some(url) = &node.admin else {
            for (name, listed) in [("points", &node.points), ("hooks", &node.hooks)] {
                if let Some(listed) = listed {
                    let why = "needs `admin`, the URL where the node answers for them (docs/admin.md)";
                    return Err(self.at(listed.span(), &field(name), why));
                }
            }
            return Ok(Admin::default());
        };
        if !url.get_ref().starts_with("http://") {
            return Err(self.at(url.span(), &field("admin"), "an http://… URL, such as http://127.0.0.1:{port:NAME}"));
        }
        if adopted {
            let why = "a running container cannot be handed haunt's admin token: start it from an image instead";
            return Err(self.at(url.span(), &field("admin"), why));
        }
        if node.env.contains_key(TOKEN_VAR) {
            let why = format!("{TOKEN_VAR} is set by haunt for a node with `admin`: leave it out");
            return Err(self.at(url.span(), &field("env"), why));
        }
        let mut points: Vec<String> = Vec::new();
        if let Some(listed) = &node.points {
            for point in listed.get_ref() {
                let named = !point.is_empty()
                    && point.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
                if !named {
                    let why = format!("{point:?}: a point's name is lowercase letters, digits, `-` and `_`");
                    return Err(self.at(listed.span(), &field("points"), why));
                }
                if points.contains(point) {
                    return Err(self.at(listed.span(), &field("points"), format!("{point:?} twice")));
                }
                points.push(point.clone());
            }
        }
        let mut hooks = Vec::new();
        if let Some(listed) = &node.hooks {
            for hook in listed.get_ref() {
                let fault = HOOKS.iter().find(|f| f.name() == hook).copied().ok_or_else(|| {
                    let known: Vec<&str> = HOOKS.iter().map(|f| f.name()).collect();
                    let why = format!("{hook:?} is not a fault a node takes on its switches ({})", known.join(", "));
                    self.at(listed.span(), &field("hooks"), why)
                })?;
                if hooks.contains(&fault) {
                    return Err(self.at(listed.span(), &field("hooks"), format!("{hook:?} twice")));
                }
                hooks.push(fault);
            }
        }
        Ok(Admin { url: Some(url.get_ref().clone()), points, hooks })
    }

    fn node_faults(&self, i: usize, node: &RawNode) -> Result<Vec<NodeFault>, SpecError> {
        let Some(listed) = &node.faults else { return Ok(Vec::new()) };
        let field = format!("node[{i}].faults");
        listed
            .get_ref()
            .iter()
            .map(|f| match f.as_str() {
                "kill" => Ok(NodeFault::Kill),
                "pause" => Ok(NodeFault::Pause),
                "partition" | "delay" => Err(self.at(
                    listed.span(),
                    &field,
                    format!("{f:?} is a fault of links, not of nodes: any link through {{addr:NAME}} can take it"),
                )),
                other => {
                    Err(self.at(listed.span(), &field, format!("{other:?} is not a fault a node takes (kill, pause)")))
                }
            })
            .collect()
    }

    /// All of a system's nodes are adopted containers or none are, and each
    /// container's links name another node.
    fn adoption_and_links(&self, raw: &[RawNode], instances: &Instances) -> Result<(), SpecError> {
        let nodes = &instances.decls;
        let adopted = nodes.iter().filter(|n| n.container.is_some()).count();
        for (decl, &i) in nodes.iter().zip(&instances.origin) {
            let node = &raw[i];
            if adopted > 0 && decl.container.is_none() {
                return Err(self.at(
                    node.name.span(),
                    &format!("node[{i}].container"),
                    "missing: other nodes are running containers, and haunt adopts all of a system's nodes or none",
                ));
            }
            let span = node.links.as_ref().map_or(node.name.span(), |l| l.span());
            for link in &decl.links {
                let Some(peer) = nodes.iter().find(|n| &n.name == link) else {
                    let known: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
                    let known: Vec<&str> = known.into_iter().collect();
                    let message = format!("names an unknown node {link:?} (nodes: {})", known.join(", "));
                    return Err(self.at(span, &format!("node[{i}].links"), message));
                };
                if peer.name == decl.name {
                    return Err(self.at(span, &format!("node[{i}].links"), "a node has no link to itself"));
                }
            }
        }
        Ok(())
    }

    /// The `[[variant]]`s: unique names, a known expectation, and nothing in
    /// `nemesis` but faults.
    fn variants(&self, raw: &[RawVariant]) -> Result<Vec<VariantDecl>, SpecError> {
        let mut out: Vec<VariantDecl> = Vec::new();
        for (i, v) in raw.iter().enumerate() {
            let field = |f: &str| format!("variant[{i}].{f}");
            let name = v.name.get_ref();
            if !valid_name(name) {
                return Err(self.at(v.name.span(), &field("name"), "letters, digits, `-` and `_` only"));
            }
            if out.iter().any(|o| &o.name == name) {
                return Err(self.at(v.name.span(), &field("name"), format!("a second variant named {name}")));
            }
            let expect = EXPECTATIONS.iter().copied().find(|e| e == v.expect.get_ref()).ok_or_else(|| {
                let why = format!("{:?}: one of {}", v.expect.get_ref(), EXPECTATIONS.join(", "));
                self.at(v.expect.span(), &field("expect"), why)
            })?;
            if let Some(nemesis) = &v.nemesis
                && let Err(e) = Fault::parse_list(nemesis.get_ref(), &Fault::ALL)
            {
                return Err(self.at(nemesis.span(), &field("nemesis"), format!("{e:#}")));
            }
            for key in v.vars.get_ref().keys() {
                if !valid_name(key) {
                    return Err(self.at(
                        v.vars.span(),
                        &field("vars"),
                        format!("{key:?}: letters, digits, `-` and `_` only"),
                    ));
                }
            }
            out.push(VariantDecl {
                name: name.clone(),
                expect,
                nemesis: v.nemesis.as_ref().map(|n| n.get_ref().clone()),
                fault_targets: v.fault_targets.clone(),
                vars: v.vars.get_ref().iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            });
        }
        Ok(out)
    }

    fn client(&self, client: &RawClient, places: &Places<'_>) -> Result<ClientDecl, SpecError> {
        let method = client.method.get_ref().to_ascii_uppercase();
        if !["GET", "POST", "PUT", "PATCH"].contains(&method.as_str()) {
            return Err(self.at(client.method.span(), "client.method", "GET, POST, PUT or PATCH"));
        }
        if !client.url.get_ref().starts_with("http://") {
            return Err(self.at(client.url.span(), "client.url", "an http://… URL (through {addr:NAME})"));
        }
        places.check(client.url.get_ref(), client.url.span(), "client.url", Place::Client)?;
        if let Some(body) = &client.body {
            places.check(body.get_ref(), body.span(), "client.body", Place::Client)?;
        }
        let ok = self.statuses(&client.ok, "client.ok")?;
        let no_fail = Spanned::new(0..0, Vec::new());
        let fail_list = client.fail.as_ref().unwrap_or(&no_fail);
        let fail = self.statuses(fail_list, "client.fail")?;
        if ok.is_empty() {
            return Err(self.at(client.ok.span(), "client.ok", "empty: which statuses mean the order was committed?"));
        }
        if let Some(both) = ok.iter().find(|s| fail.contains(s)) {
            return Err(self.at(fail_list.span(), "client.fail", format!("{both} is also in client.ok")));
        }
        if let Some(pointer) = &client.event_id
            && !pointer.get_ref().starts_with('/')
        {
            return Err(self.at(pointer.span(), "client.event_id", "a JSON pointer, such as /event_id"));
        }
        Ok(ClientDecl {
            method,
            url: client.url.get_ref().clone(),
            headers: client.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            body: client.body.as_ref().map(|b| b.get_ref().clone()),
            ok,
            fail,
            event_id: client.event_id.as_ref().map(|p| p.get_ref().clone()),
        })
    }

    fn statuses(&self, list: &Spanned<Vec<i64>>, field: &str) -> Result<Vec<u16>, SpecError> {
        list.get_ref()
            .iter()
            .map(|s| match u16::try_from(*s) {
                Ok(s) if (100..=599).contains(&s) => Ok(s),
                _ => Err(self.at(list.span(), field, format!("{s} is not an HTTP status"))),
            })
            .collect()
    }

    fn final_state(&self, raw: &Spanned<RawFinal>, places: &Places<'_>) -> Result<FinalDecl, SpecError> {
        let fin = raw.get_ref();
        let db = fin.database.get_ref();
        // Its placeholders are filled at layout; the scheme is known now.
        if haunt_store::DbUrl::parse(db).is_err() {
            return Err(self.at(fin.database.span(), "final_state.database", "sqlite://PATH or postgres://…"));
        }
        places.check(db, fin.database.span(), "final_state.database", Place::Database)?;
        if let Some(url) = fin.quiet.as_deref().filter(|q| q.starts_with("http://")) {
            places.check(url, raw.span(), "final_state.quiet", Place::Ready)?;
        }
        for (field, query) in [("final_state.orders", &fin.orders), ("final_state.projection", &fin.projection)] {
            if query.trim().is_empty() {
                return Err(self.at(raw.span(), field, "empty: a SELECT"));
            }
        }
        Ok(FinalDecl {
            database: db.clone(),
            orders: fin.orders.clone(),
            projection: fin.projection.clone(),
            applied: fin.applied.clone(),
            pending: fin.pending.clone(),
            dead_letters: fin.dead_letters.clone(),
            quiet: fin.quiet.clone(),
        })
    }
}

/// The field a toml/serde message is about: `missing field `x``, `unknown
/// field `x``, `invalid type: … for key `x``.
fn field_of_toml_error(message: &str) -> String {
    message
        .split('`')
        .nth(1)
        .filter(|_| message.contains("field") || message.contains("key"))
        .map_or_else(|| "(syntax)".to_owned(), str::to_owned)
}
