//! A system file once checked: its nodes, its client and where its final
//! state is read, typed ([`super::spec::load`] makes them).

use std::path::PathBuf;

use crate::core::fault::Fault;

/// What the nemesis may do to a node itself (links are faulted where they
/// pass through a fault proxy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeFault {
    Kill,
    Pause,
}

/// One process of the system, once per instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDecl {
    /// `api`, or `worker-1` for the first of a node with `count`.
    pub name: String,
    /// The `[[node]]` it comes from.
    pub base: String,
    /// Its instance number (1 without `count`).
    pub n: u32,
    /// Program and arguments, placeholders not yet filled (but `{n}`); for a
    /// node with an image, the arguments after the image's entrypoint.
    pub command: Vec<String>,
    /// The image the node runs from, as a container (`--backend docker`).
    pub image: Option<String>,
    /// A container that is already running (a name or an id), which haunt
    /// faults but neither starts nor removes: a test's testcontainers, a
    /// compose service.
    pub container: Option<String>,
    /// The port the image's service listens on inside its container, when it
    /// is not `{port:NAME}` itself (a database image's 5432); for a
    /// `container`, the port whose published host port `{port:NAME}` is.
    pub port: Option<u16>,
    /// For a `container`: the nodes it talks to, each link cut with iptables
    /// in its network namespace (`NAME<->OTHER`).
    pub links: Vec<String>,
    pub env: Vec<(String, String)>,
    pub ready: Option<String>,
    pub faults: Vec<NodeFault>,
    /// The base URL of its admin endpoint (`docs/admin.md`), placeholders
    /// not yet filled (but `{n}`).
    pub admin: Option<String>,
    /// The hold points it offers there, by name.
    pub points: Vec<String>,
    /// The switch faults it takes there.
    pub hooks: Vec<Fault>,
    /// A probe that says whether it holds work now, for the aim of kills and
    /// pauses: an `http://` URL (2xx: yes) or an SQL query on the final
    /// state's database (a true or non-zero first value: yes).
    pub aim: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientDecl {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
    pub ok: Vec<u16>,
    pub fail: Vec<u16>,
    /// A JSON pointer into an ok answer.
    pub event_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalDecl {
    pub database: String,
    pub orders: String,
    pub projection: String,
    pub applied: Option<String>,
    pub pending: Option<String>,
    pub dead_letters: Option<String>,
    /// An SQL query, or an `http://` URL whose 2xx answer means quiet (for a
    /// system whose messages are in a broker, which SQL cannot see).
    pub quiet: Option<String>,
}

/// A checked system file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemSpec {
    pub file: PathBuf,
    pub name: String,
    /// The folder that holds the file: `{system_dir}`, and where commands start.
    pub system_dir: PathBuf,
    /// Every instance, in file order.
    pub nodes: Vec<NodeDecl>,
    pub client: ClientDecl,
    pub final_state: FinalDecl,
    /// The file's `[[variant]]`s, in file order (none: one system).
    pub variants: Vec<VariantDecl>,
    /// The variant this run is of ([`SystemSpec::choose`]), whose `vars`
    /// fill `{var:NAME}`.
    pub variant: Option<VariantDecl>,
}

/// One `[[variant]]`: the same system with its `{var:NAME}` filled
/// otherwise, and what a run of it is expected to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantDecl {
    pub name: String,
    /// `valid`, `not-drained`, or the anomaly every run must show.
    pub expect: &'static str,
    /// The faults of its matrix row, as `--nemesis` takes them (`None`:
    /// every fault the file allows).
    pub nemesis: Option<String>,
    /// The targets its matrix row narrows its faults to (`--fault-targets`).
    pub fault_targets: Vec<String>,
    pub vars: Vec<(String, String)>,
}

impl SystemSpec {
    /// Makes this a run of the variant `name`, or of the first when `None`.
    /// A file without variants takes no name.
    pub fn choose(&mut self, name: Option<&str>) -> anyhow::Result<()> {
        let chosen = match (name, self.variants.first()) {
            (None, None) => return Ok(()),
            (Some(name), None) => {
                anyhow::bail!("--variant {name}: {} has no [[variant]]", self.file.display())
            }
            (None, Some(first)) => first.clone(),
            (Some(name), Some(_)) => self.variants.iter().find(|v| v.name == name).cloned().ok_or_else(|| {
                let known: Vec<&str> = self.variants.iter().map(|v| v.name.as_str()).collect();
                anyhow::anyhow!(
                    "--variant {name}: {} has no such variant (it has: {})",
                    self.file.display(),
                    known.join(", ")
                )
            })?,
        };
        self.variant = Some(chosen);
        Ok(())
    }

    /// The value of `{var:NAME}` in the chosen variant.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.variant.as_ref()?.vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}
