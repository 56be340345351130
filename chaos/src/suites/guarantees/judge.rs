//! Each row judged against its transport's claims: the delivery claim
//! (what it may lose or duplicate), then the order claim.

use haunt_transport::{Guarantee, OrderClaim};

use super::FaultRun;

/// Whether the measurement matches the claim, and what is worth saying.
///
/// `no_promise`: the faults under which the claim promises nothing
/// (`TransportSpec::no_promise_under`). A loss only in runs where one of
/// them struck is reported as measured, and matches the claim.
pub(super) fn judge(
    claim: Guarantee,
    no_promise: &[&str],
    lost: u64,
    delivered_twice: Option<u64>,
    applied_twice: u64,
    runs: &[&FaultRun],
) -> (Option<bool>, Option<String>) {
    let seeds_with = |f: &dyn Fn(&FaultRun) -> bool| -> String {
        let s: Vec<String> = runs.iter().filter(|r| f(r)).map(|r| r.seed.to_string()).collect();
        format!("seed {}", s.join(", "))
    };
    let lost_at = || seeds_with(&|r| r.lost > 0);
    let twice_at = || seeds_with(&|r| r.delivered_more_than_once.unwrap_or(0) > 0 || r.applied_more_than_once > 0);
    // Deliveries are recorded by the inbox; without one, an application
    // twice is the evidence of a delivery twice.
    let duplicated = delivered_twice.map_or(applied_twice > 0, |d| d > 0);
    let excused = |r: &FaultRun| no_promise.iter().any(|f| r.faults_fired[*f].as_u64().unwrap_or(0) > 0);
    let promised_lost = runs.iter().any(|r| r.lost > 0 && !excused(r));
    match claim {
        Guarantee::AtLeastOnce | Guarantee::ExactlyOnce if lost > 0 && !promised_lost => (
            Some(true),
            Some(format!(
                "promises nothing under {}, and lost {lost} acknowledged effects in runs where they struck ({})",
                no_promise.join(", "),
                lost_at()
            )),
        ),
        Guarantee::AtMostOnce if duplicated => (
            Some(false),
            Some(format!(
                "claims at-most-once, yet events reached a consumer or were applied more than once ({})",
                twice_at()
            )),
        ),
        Guarantee::AtMostOnce if lost == 0 => {
            (Some(true), Some("allowed to lose, and these faults made it lose nothing".into()))
        }
        Guarantee::AtMostOnce => (Some(true), None),
        Guarantee::AtLeastOnce | Guarantee::ExactlyOnce if lost > 0 => (
            Some(false),
            Some(format!("claims {}, yet lost {lost} acknowledged effects ({})", claim.name(), lost_at())),
        ),
        Guarantee::ExactlyOnce if applied_twice > 0 => (
            Some(false),
            Some(format!(
                "claims exactly-once, yet applied {applied_twice} events twice ({}): the broker's promise ends at the broker",
                twice_at()
            )),
        ),
        Guarantee::AtLeastOnce if !duplicated => {
            (Some(true), Some("allowed to duplicate, and these faults delivered nothing twice".into()))
        }
        _ => (Some(true), None),
    }
}

/// The order claim judged after the delivery claim (`delivery`): a key's
/// orders overtaken contradict `per-key`, and so does a run that checked no
/// pair (nothing was measured); under `none` they are figures.
pub(super) fn judge_order(
    claim: OrderClaim,
    pairs: u64,
    overtaken: u64,
    runs: &[&FaultRun],
    delivery: (Option<bool>, Option<String>),
) -> (Option<bool>, Option<String>) {
    if claim != OrderClaim::PerKey {
        return delivery;
    }
    let (matches, finding) = delivery;
    let join = |more: String| Some(finding.as_ref().map_or(more.clone(), |f| format!("{f}; {more}")));
    if overtaken > 0 {
        let seeds: Vec<String> = runs.iter().filter(|r| r.overtaken > 0).map(|r| r.seed.to_string()).collect();
        return (
            Some(false),
            join(format!(
                "claims each key's order, yet {overtaken} orders were applied before an order acknowledged \
                 before them (of {pairs} pairs; seed {})",
                seeds.join(", ")
            )),
        );
    }
    if pairs == 0 {
        // A contradiction of the delivery claim stands; only a row that
        // matched it is left unmeasured.
        let unmeasured = "claims each key's order, and no pair of orders was fixed in real time to check it";
        return (matches.filter(|m| !m), join(unmeasured.into()));
    }
    (matches, finding)
}
