//! `haunt shrink`: its arguments, and the call of
//! [`haunt_chaos::suites::shrink::shrink`], which searches for a smaller run
//! that fails as a failing run did.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use haunt_chaos::suites::shrink::ShrinkOptions;

#[derive(Debug, clap::Args)]
pub struct ShrinkArgs {
    /// The failing run's directory (it holds run.json, schedule.json and results.json).
    pub dir: PathBuf,
    /// Reruns of each candidate: it still fails when one of them shows one of
    /// the run's anomaly kinds.
    #[arg(long, default_value_t = 3)]
    pub reruns: u32,
    /// Wall time for the search, in seconds; it ends with the smallest
    /// failing run found by then.
    #[arg(long, default_value_t = 900)]
    pub budget_s: u64,
    /// Reruns of the result, after the search, for its reproduction rate (0: none).
    #[arg(long, default_value_t = 10)]
    pub confirm: u32,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
}

pub async fn shrink(args: ShrinkArgs) -> anyhow::Result<i32> {
    // Each candidate runs as a child of this very executable.
    let haunt = std::env::current_exe().context("finding the haunt executable")?;
    let options = ShrinkOptions {
        dir: args.dir,
        reruns: args.reruns,
        budget: Duration::from_secs(args.budget_s),
        confirm: args.confirm,
        haunt,
        quiet: args.quiet,
    };
    let report = haunt_chaos::suites::shrink::shrink(&options).await?;
    println!("{}: {} → {}", report.kinds.join(", "), report.before.describe(), report.after.describe());
    let ended = if report.finished { "the search ended" } else { "the budget ran out" };
    println!("{} tries in {:.0} s; {ended}", report.tries, report.wall_s);
    for aside in &report.set_aside {
        let (failed, of) = aside.reproduced;
        println!("set aside: {} (reproduced in {failed} of {of} reruns)", aside.candidate);
    }
    if let Some((failed, of)) = report.reproduced {
        println!("reproduced in {failed} of {of} reruns");
    }
    let out = options.dir.join("shrunk");
    println!("replay: {}", report.replay);
    println!("shrunk: {}", out.display());
    Ok(0)
}
