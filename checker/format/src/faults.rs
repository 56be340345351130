//! How nemesis ops name their fault windows: the pairing of a start's `f` and
//! a stop's `f` that `docs/run-format.md` gives, for the harness that writes
//! them ([`fault_ops`]) and the checker that reads them ([`fault_edge`]).
//!
//! A window's family is `kill` for every fault that a kill starts and a
//! restart ends (a worker's kill, a database's or a broker's restart), `pause`
//! for a pause that a resume ends, and any other fault's own name, whose ops
//! are `start-NAME` and `stop-NAME`.

/// The `f` of the op that opens a window of `family`, and of the one that
/// closes it.
pub fn fault_ops(family: &str) -> (String, String) {
    match family {
        "kill" => ("kill".into(), "restart".into()),
        "pause" => ("pause".into(), "resume".into()),
        other => (format!("start-{other}"), format!("stop-{other}")),
    }
}

/// The family a nemesis op's `f` belongs to, and whether it opens (true) or
/// closes its window. An `f` that follows no pairing opens a window of its
/// own name.
pub fn fault_edge(f: &str) -> (&str, bool) {
    match f {
        "kill" => ("kill", true),
        "restart" => ("kill", false),
        "pause" => ("pause", true),
        "resume" => ("pause", false),
        _ => match (f.strip_prefix("start-"), f.strip_prefix("stop-")) {
            (Some(family), _) => (family, true),
            (_, Some(family)) => (family, false),
            _ => (f, true),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{fault_edge, fault_ops};

    #[test]
    fn what_the_harness_writes_the_checker_reads_as_the_same_window() {
        for family in ["kill", "pause", "partition", "ack-loss", "db-error", "clock-skew", "loss"] {
            let (start, stop) = fault_ops(family);
            assert_eq!(fault_edge(&start), (family, true), "{start}");
            assert_eq!(fault_edge(&stop), (family, false), "{stop}");
        }
        assert_eq!(fault_edge("restart"), ("kill", false));
        assert_eq!(fault_edge("heal"), ("heal", true), "an unpaired f opens a window of its name");
    }
}
