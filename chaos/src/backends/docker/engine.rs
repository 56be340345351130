//! What the Docker backend asks of the engine beside running its nodes: a
//! helper container in a node's network namespace, a container's output,
//! and finding and removing what a run labelled.

use std::collections::HashMap;

use bollard::Docker;
use bollard::errors::Error as ApiError;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, ListNetworksOptions, LogsOptions, RemoveContainerOptions,
    WaitContainerOptions,
};
use futures_util::StreamExt;

use super::{RUN_LABEL, blocking, not_running, said};

/// A short-lived container of the tools image in `target`'s network namespace.
pub(super) struct Helper<'a> {
    pub(super) tools_image: &'a str,
    pub(super) labels: HashMap<String, String>,
    pub(super) target: String,
}

impl Helper<'_> {
    pub(super) async fn run(self, docker: &Docker, script: &str) -> anyhow::Result<String> {
        let body = ContainerCreateBody {
            image: Some(self.tools_image.to_owned()),
            entrypoint: Some(vec!["sh".into(), "-c".into()]),
            cmd: Some(vec![script.to_owned()]),
            user: Some("root".into()),
            labels: Some(self.labels),
            host_config: Some(HostConfig {
                network_mode: Some(format!("container:{}", self.target)),
                cap_add: Some(vec!["NET_ADMIN".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let helper = docker
            .create_container(None::<CreateContainerOptions>, body)
            .await
            .map_err(|e| anyhow::anyhow!("creating a helper: {}", said(&e)))?
            .id;
        let outcome = async {
            docker.start_container(&helper, None).await.map_err(|e| anyhow::anyhow!("{}", said(&e)))?;
            let mut wait = docker.wait_container(&helper, None::<WaitContainerOptions>);
            let code = match wait.next().await {
                Some(Ok(done)) => done.status_code,
                Some(Err(ApiError::DockerContainerWaitError { code, .. })) => code,
                Some(Err(e)) => anyhow::bail!("{}", said(&e)),
                None => anyhow::bail!("the helper's wait ended without a status"),
            };
            let output = logs(docker, &helper).await;
            anyhow::ensure!(code == 0, "exit status {code}: {}", output.trim());
            Ok(output)
        }
        .await;
        let remove = RemoveContainerOptions { force: true, ..Default::default() };
        let _ = docker.remove_container(&helper, Some(remove)).await;
        outcome
    }
}

/// A container's output so far, both streams.
pub(super) async fn logs(docker: &Docker, container: &str) -> String {
    let options = LogsOptions { stdout: true, stderr: true, ..Default::default() };
    let mut stream = docker.logs(container, Some(options));
    let mut text = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        text.extend_from_slice(&chunk.into_bytes());
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Removes the containers (with their anonymous volumes) and networks that
/// carry `label` (`key` or `key=value`). Returns how many of each.
pub(super) fn remove_labelled(label: &str) -> anyhow::Result<(usize, usize)> {
    blocking(|docker| async move {
        let (containers, networks) = labelled(&docker, label).await?;
        for (id, _) in &containers {
            let options = RemoveContainerOptions { force: true, v: true, ..Default::default() };
            match docker.remove_container(id, Some(options)).await {
                Err(e) if !not_running(&e) => anyhow::bail!("removing container {id}: {}", said(&e)),
                _ => {}
            }
        }
        for (id, name) in &networks {
            docker.remove_network(id).await.map_err(|e| anyhow::anyhow!("removing network {name}: {}", said(&e)))?;
        }
        Ok((containers.len(), networks.len()))
    })
}

/// The `(id, name)` of every container and every network carrying `label`.
async fn labelled(docker: &Docker, label: &str) -> anyhow::Result<(Vec<(String, String)>, Vec<(String, String)>)> {
    let filters = HashMap::from([("label".to_owned(), vec![label.to_owned()])]);
    let options = ListContainersOptions { all: true, filters: Some(filters.clone()), ..Default::default() };
    let containers = docker.list_containers(Some(options)).await.map_err(|e| anyhow::anyhow!("{}", said(&e)))?;
    let containers = containers
        .into_iter()
        .filter_map(|c| {
            let name = c.names.unwrap_or_default().first().map(|n| n.trim_start_matches('/').to_owned());
            Some((c.id?, name.unwrap_or_default()))
        })
        .collect();
    let networks = docker
        .list_networks(Some(ListNetworksOptions { filters: Some(filters) }))
        .await
        .map_err(|e| anyhow::anyhow!("{}", said(&e)))?;
    let networks = networks.into_iter().filter_map(|n| Some((n.id?, n.name.unwrap_or_default()))).collect();
    Ok((containers, networks))
}

/// `haunt clean`: removes every container and network any haunt run created.
pub fn clean() -> anyhow::Result<(usize, usize)> {
    remove_labelled(RUN_LABEL)
}

/// The names of what a haunt run left: containers, then `network NAME`s
/// (for tests and `haunt clean --dry-run`).
pub fn leftovers() -> anyhow::Result<Vec<String>> {
    leftovers_of(RUN_LABEL)
}

/// [`leftovers`] of one run.
pub fn leftovers_of_run(run_id: &str) -> anyhow::Result<Vec<String>> {
    leftovers_of(&format!("{RUN_LABEL}={run_id}"))
}

fn leftovers_of(label: &str) -> anyhow::Result<Vec<String>> {
    let label = label.to_owned();
    blocking(|docker| async move {
        let (containers, networks) = labelled(&docker, &label).await?;
        let names = containers.into_iter().map(|(_, name)| name);
        Ok(names.chain(networks.into_iter().map(|(_, name)| format!("network {name}"))).collect())
    })
}

/// What the engine reports, for tests: whether it answers and has `image`.
pub fn has_image(image: &str) -> anyhow::Result<bool> {
    let image = image.to_owned();
    blocking(|docker| async move { Ok(docker.inspect_image(&image).await.is_ok()) })
}
