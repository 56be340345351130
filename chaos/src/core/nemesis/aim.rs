//! Aiming a kill or a pause at work in flight: a worker's batch at its hold
//! point, or a system-file node's work at one of the points it declares
//! (`docs/admin.md`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;

use super::put;
use crate::core::admin::Admin;

/// Aims a kill or a pause of a worker at a batch in flight. A worker is idle
/// most of the time at a modest rate, and a blind SIGKILL then finds no lease
/// in hand and leaves no trace: in five runs of the main job, none of its nine
/// kills and pauses of workers left one. So every other such fault of a kind
/// (the kill's count and the pause's are their own, whichever worker they hit),
/// starting with the first, first asks the worker to hold its next batch at its
/// hold point (its effect committed and its ack not sent; with the ack in the
/// apply's transaction, its lease in hand; with the ack sent on receipt, acked
/// and not applied), waits for it, then acts. The others stay blind, to land
/// wherever the worker happens to be (inside a transaction, between batches).
/// A node of a system file that declares hold points is aimed the same way,
/// at each of its points in turn. A node without an admin endpoint is always
/// hit blind, as is one that has no work at its point within [`Aim::WAIT`].
#[derive(Debug)]
pub struct Aim {
    admin: Admin,
    /// How long the batch holds still (see [`Aim::new`]).
    hold: Duration,
    shots: AtomicU64,
    /// The aimed shots so far, which choose a node's point in turn.
    aimed: AtomicU64,
    /// The last aimed shot's answer, until the history takes it.
    last: Mutex<Option<serde_json::Value>>,
}

impl Aim {
    /// How long a fault waits for a batch before it acts anyway. With the
    /// answer's margin it stays within [`super::ACT_ALLOWANCE`], so an aimed fault
    /// fits the schedule a blind one fits: a worker polls an empty queue every
    /// 50 ms, and at the default rate one of its loops has a batch within a
    /// few polls.
    const WAIT: Duration = Duration::from_millis(250);
    /// How late the answer may come after [`Aim::WAIT`] on a worker that
    /// answers at all (one paused by another fault does not).
    const ANSWER_MARGIN: Duration = Duration::from_millis(150);

    /// `visibility_timeout`: the lease the held batch has in hand. The hold
    /// only bridges the moments between the worker's answer and the signal,
    /// and lasts a third of the lease (at most a second), so that a hold no
    /// fault follows (a kill that failed) ends with the lease still valid: the
    /// batch then acks as usual, and any redelivery in the window is the
    /// fault's doing, not the hold's.
    pub fn new(admin: Admin, visibility_timeout: Duration) -> Self {
        let hold = (visibility_timeout / 3).clamp(Duration::from_millis(1), Duration::from_secs(1));
        Aim { admin, hold, shots: Default::default(), aimed: Default::default(), last: Mutex::new(None) }
    }

    /// Whether this shot is aimed: the first of each kind and every other after it.
    pub(super) fn takes_aim(&self) -> bool {
        self.shots.fetch_add(1, Ordering::Relaxed).is_multiple_of(2)
    }

    /// Before a fault on `target`: whether a batch of it now holds still.
    /// An aimed shot's answer is kept for [`Nemesis::take_aim`].
    pub(super) async fn at_batch(aim: Option<&Aim>, target: &str) -> bool {
        let Some(aim) = aim.filter(|a| a.admin.has(target)) else { return false };
        if !aim.takes_aim() {
            return false;
        }
        let point = aim.next_point(target);
        let answer = match aim.admin.hold(target, point.as_deref(), Aim::WAIT, Aim::ANSWER_MARGIN, aim.hold).await {
            Ok(answer) => answer,
            // A worker that does not answer (already down, paused) is hit blind.
            Err(e) => {
                tracing::info!(target, error = %e, "no hold; the fault lands blind");
                json!({"held": false})
            }
        };
        let held = answer["held"] == json!(true);
        put(&aim.last, answer);
        held
    }

    /// The point an aimed shot at `target` asks for: its points in turn,
    /// one per aimed shot (of this fault, whichever node), or none where the
    /// node holds at its only point (haunt's own workers).
    fn next_point(&self, target: &str) -> Option<String> {
        let points = self.admin.points(target);
        let turn = self.aimed.fetch_add(1, Ordering::Relaxed) as usize;
        (!points.is_empty()).then(|| points[turn % points.len()].clone())
    }

    pub(super) fn take(aim: Option<&Aim>) -> Option<serde_json::Value> {
        aim.and_then(|a| a.last.lock().unwrap_or_else(|p| p.into_inner()).take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::admin::AdminNode;

    #[test]
    fn the_first_shot_of_a_kind_and_every_other_after_it_is_aimed() {
        let admin = Admin::new("t".into(), vec![AdminNode::new("worker-1", "http://127.0.0.1:9")]).unwrap();
        let aim = Aim::new(admin, Duration::from_secs(2));
        let shots: Vec<bool> = (0..5).map(|_| aim.takes_aim()).collect();
        assert_eq!(shots, [true, false, true, false, true]);
    }

    #[test]
    fn an_aimed_batch_holds_for_a_third_of_its_lease_at_most_a_second() {
        let admin = || Admin::new("t".into(), Vec::new()).unwrap();
        for (lease_ms, hold_ms) in [(300, 100), (1_500, 500), (2_000, 666), (30_000, 1_000), (1, 1)] {
            let aim = Aim::new(admin(), Duration::from_millis(lease_ms));
            assert_eq!(aim.hold.as_millis(), hold_ms, "lease {lease_ms} ms");
        }
        // The wait and the answer's margin stay within what the schedule allows.
        assert!(Aim::WAIT + Aim::ANSWER_MARGIN < super::super::ACT_ALLOWANCE);
    }

    /// A worker that does not answer (here, no one listens) is hit blind.
    #[tokio::test]
    async fn a_worker_that_does_not_answer_a_hold_is_hit_blind() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let aim =
            Aim::new(Admin::new("t".into(), vec![AdminNode::new("worker-1", base)]).unwrap(), Duration::from_secs(2));
        assert!(!Aim::at_batch(Some(&aim), "worker-1").await);
        assert_eq!(Aim::take(Some(&aim)), Some(json!({"held": false})), "the history says the aim missed");
        assert_eq!(Aim::take(Some(&aim)), None, "once");
        assert!(!Aim::at_batch(Some(&aim), "worker-2").await, "not one of the workers: blind");
    }
}
