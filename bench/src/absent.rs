//! The benches' functions in a build without the feature `run`: each returns
//! [`crate::NOT_BUILT`] and does nothing else.

use futures_util::future::{BoxFuture, LocalBoxFuture};

use crate::{CheckOptions, HarnessOptions, PipelineOptions, TransportOptions};

fn not_built() -> anyhow::Error {
    anyhow::anyhow!(crate::NOT_BUILT)
}

pub fn check(_: CheckOptions, _: &mut (dyn FnMut(&str) + Send)) -> anyhow::Result<serde_json::Value> {
    Err(not_built())
}

pub fn harness(_: HarnessOptions) -> BoxFuture<'static, anyhow::Result<serde_json::Value>> {
    Box::pin(async { Err(not_built()) })
}

pub fn pipeline(
    _: PipelineOptions,
    _: &mut (dyn FnMut(&str) + Send),
) -> LocalBoxFuture<'_, anyhow::Result<serde_json::Value>> {
    Box::pin(async { Err(not_built()) })
}

pub fn transport(
    _: TransportOptions,
    _: &mut (dyn FnMut(&str) + Send),
) -> BoxFuture<'_, anyhow::Result<serde_json::Value>> {
    Box::pin(async { Err(not_built()) })
}

#[cfg(test)]
mod tests {
    /// A build without the benches refuses each one with the feature that
    /// builds them, and does nothing else.
    #[test]
    fn each_bench_names_the_feature_that_builds_it() {
        let check = super::check(crate::CheckOptions { ops: 10, dir: None, clients: 1 }, &mut |_| {
            panic!("no progress from a bench that is not built")
        });
        assert!(check.unwrap_err().to_string().contains("--features bench"));
        let harness =
            super::harness(crate::HarnessOptions { concurrency: 1, duration: std::time::Duration::from_secs(1) });
        let err = futures_util::FutureExt::now_or_never(harness).expect("ready at once").unwrap_err();
        assert!(err.to_string().contains("--features bench"));
    }
}
