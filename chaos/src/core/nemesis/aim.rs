//! Aiming a kill, a pause or a cut at work in flight: a worker's batch at its hold
//! point, or a system-file node's work at one of the points it declares
//! (`docs/admin.md`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haunt_store::Rng;
use serde_json::json;

use super::put;
use crate::core::admin::Admin;
use crate::core::fault::Aiming;
use crate::core::inflight::{InFlight, WorkProbe};

/// Aims a kill or a pause of a node at work in flight. A node is idle most of
/// the time at a modest rate, and a blind SIGKILL then finds nothing in hand
/// and leaves no trace: in five runs of the main job, none of its nine kills
/// and pauses of workers left one. So every other such fault of a kind (the
/// kill's count and the pause's are their own, whichever node they hit),
/// starting with the first, is aimed; the others stay blind, to land wherever
/// the node happens to be (inside a transaction, between batches).
///
/// An aimed strike at a node with hold points (haunt's workers: their batch
/// with its effect committed and its ack not sent, or as `docs/admin.md`
/// says; a system file's `points`, each in turn) first asks it to hold work
/// at its point, waits for it, then acts. A node without hold points but with
/// a probe (a system file's `aim`) is struck at the probe's first yes. At a
/// node with neither that the workload's client calls, it waits for the
/// client's next request to start there and strikes at a random moment within
/// the median time its requests take to the answer's head ([`InFlight`]), so
/// that it lands while the node works on one. Any other node is hit blind, as
/// is one that has no work within [`Aim::WAIT`].
#[derive(Debug)]
pub struct Aim {
    /// The nodes with hold points.
    admin: Option<Admin>,
    /// The nodes with a probe that says when they hold work.
    probes: Vec<(String, Arc<dyn WorkProbe>)>,
    /// The nodes the client calls, with its requests in flight there.
    clients: Vec<(String, Arc<InFlight>)>,
    /// How long the batch holds still (see [`Aim::new`]).
    hold: Duration,
    shots: AtomicU64,
    /// Whether the last aimed shot found no work and landed blind: the next
    /// shot is aimed in its place.
    missed: AtomicBool,
    /// The aimed shots so far, which choose a node's point in turn.
    aimed: AtomicU64,
    /// Where within a request a client-side strike lands.
    rng: Mutex<Rng>,
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
    /// answers at all (one paused by another fault does not); also the
    /// longest a client-side strike waits into a request.
    const ANSWER_MARGIN: Duration = Duration::from_millis(150);

    /// `visibility_timeout`: the lease the held batch has in hand. The hold
    /// only bridges the moments between the worker's answer and the signal,
    /// and lasts a third of the lease (at most a second), so that a hold no
    /// fault follows (a kill that failed) ends with the lease still valid: the
    /// batch then acks as usual, and any redelivery in the window is the
    /// fault's doing, not the hold's.
    pub fn new(admin: Admin, visibility_timeout: Duration) -> Self {
        Aim::with(Some(admin), Vec::new(), Vec::new(), Aiming::Points, visibility_timeout, 0)
    }

    /// What `aiming` allows over the nodes with hold points (`admin`), those
    /// with a probe and those the client calls; `seed` places client-side
    /// strikes.
    pub fn with(
        admin: Option<Admin>,
        probes: Vec<(String, Arc<dyn WorkProbe>)>,
        clients: Vec<(String, Arc<InFlight>)>,
        aiming: Aiming,
        visibility_timeout: Duration,
        seed: u64,
    ) -> Self {
        let hold = (visibility_timeout / 3).clamp(Duration::from_millis(1), Duration::from_secs(1));
        let admin = admin.filter(|_| aiming == Aiming::Points);
        let probes = if aiming == Aiming::Points { probes } else { Vec::new() };
        let clients = if aiming == Aiming::Blind { Vec::new() } else { clients };
        Aim {
            admin,
            probes,
            clients,
            hold,
            shots: Default::default(),
            missed: Default::default(),
            aimed: Default::default(),
            rng: Mutex::new(Rng::new(seed ^ 0x61_696d)),
            last: Mutex::new(None),
        }
    }

    /// Whether this shot is aimed: the first of each kind and every other
    /// after it; and the one after an aimed shot that found no work, which
    /// landed blind already. (Kafka's group moves for seconds after each
    /// consumer kill: in a suite run of 2026-12-06 both aimed kills of three
    /// came while it moved and found nothing, and the run had no aimed kill.)
    pub(super) fn takes_aim(&self) -> bool {
        self.missed.swap(false, Ordering::Relaxed) || self.shots.fetch_add(1, Ordering::Relaxed).is_multiple_of(2)
    }

    /// Keeps an aimed shot's answer for the history; one that held nothing
    /// passes the aim on to the next shot.
    fn answered(&self, answer: serde_json::Value) -> bool {
        let held = answer["held"] == json!(true);
        self.missed.store(!held, Ordering::Relaxed);
        put(&self.last, answer);
        held
    }

    /// Before a fault on `target`: whether it now has work in flight (a batch
    /// holds still at its point, or a request of the client is under way).
    /// An aimed shot's answer is kept for [`Nemesis::take_aim`].
    pub(super) async fn at_batch(aim: Option<&Aim>, target: &str) -> bool {
        let Some(aim) = aim else { return false };
        let by_point = aim.admin.as_ref().filter(|a| a.has(target));
        let by_probe = aim.probes.iter().find(|(n, _)| n == target).map(|(_, p)| p);
        let by_client = aim.clients.iter().find(|(n, _)| n == target).map(|(_, f)| f);
        if (by_point.is_none() && by_probe.is_none() && by_client.is_none()) || !aim.takes_aim() {
            return false;
        }
        let answer = match (by_point, by_probe, by_client) {
            (Some(admin), _, _) => aim.hold_at_point(admin, target).await,
            (None, Some(probe), _) => Aim::until_probed(probe.as_ref(), target).await,
            (None, None, Some(flight)) => aim.during_request(flight).await,
            (None, None, None) => unreachable!("checked above"),
        };
        aim.answered(answer)
    }

    /// Before a cut of the link between `ends` (`worker-1<->redis`): whether
    /// one of its ends now holds work at a point. Every other cut is aimed
    /// (their own count, as for kills and pauses), at the first end that
    /// declares hold points: it holds at its next point, and the cut lands
    /// while it holds, so that what it does next (publish, ack, answer)
    /// meets the cut link. The answer names the end (`end`).
    pub(super) async fn at_link(aim: Option<&Aim>, ends: [&str; 2]) -> bool {
        let Some(aim) = aim else { return false };
        let Some(admin) = aim.admin.as_ref() else { return false };
        let Some(end) = ends.into_iter().find(|e| admin.has(e)) else { return false };
        if !aim.takes_aim() {
            return false;
        }
        let mut answer = aim.hold_at_point(admin, end).await;
        answer["end"] = json!(end);
        aim.answered(answer)
    }

    /// Asks `target` to hold work at its next point and waits for the answer.
    async fn hold_at_point(&self, admin: &Admin, target: &str) -> serde_json::Value {
        let point = self.next_point(admin, target);
        match admin.hold(target, point.as_deref(), Aim::WAIT, Aim::ANSWER_MARGIN, self.hold).await {
            Ok(answer) => answer,
            // A node that does not answer (already down, paused) is hit blind.
            Err(e) => {
                tracing::info!(target, error = %e, "no hold; the fault lands blind");
                json!({"held": false})
            }
        }
    }

    /// Asks `probe` every few milliseconds, for up to [`Aim::WAIT`], whether
    /// `target` holds work; strikes at the first yes.
    async fn until_probed(probe: &dyn WorkProbe, target: &str) -> serde_json::Value {
        let started = tokio::time::Instant::now();
        while started.elapsed() < Aim::WAIT {
            match probe.holds_work().await {
                Ok(true) => {
                    return json!({"held": true, "probe": true, "after_ms": started.elapsed().as_millis() as u64});
                }
                Ok(false) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => {
                    tracing::info!(target, error = %e, "the aim's probe failed; the fault lands blind");
                    return json!({"held": false, "probe": true, "error": format!("{e:#}")});
                }
            }
        }
        json!({"held": false, "probe": true})
    }

    /// Waits for the client's next request to `flight`'s node, then a random
    /// share of the requests' median latency: the answer says how many were
    /// in flight as the strike came.
    async fn during_request(&self, flight: &InFlight) -> serde_json::Value {
        let Some(median) = flight.median() else { return json!({"held": false, "client": true}) };
        if !flight.next_start(Aim::WAIT).await {
            return json!({"held": false, "client": true});
        }
        let share = self.rng.lock().unwrap_or_else(|p| p.into_inner()).unit();
        let after = median.mul_f64(share).min(Aim::ANSWER_MARGIN);
        // The timer counts whole milliseconds: a request quicker than that
        // would be over before the shortest sleep, so the strike comes at once.
        if after >= Duration::from_millis(1) {
            tokio::time::sleep(after).await;
        }
        let in_flight = flight.count();
        json!({"held": in_flight > 0, "client": true, "in_flight": in_flight, "after_ms": after.as_millis() as u64})
    }

    /// The point an aimed shot at `target` asks for: its points in turn,
    /// one per aimed shot (of this fault, whichever node), or none where the
    /// node holds at its only point (haunt's own workers).
    fn next_point(&self, admin: &Admin, target: &str) -> Option<String> {
        let points = admin.points(target);
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

    /// An aimed shot at a worker that does not answer lands blind, and the
    /// next shot takes the aim; once one holds, the turns go on as before.
    #[tokio::test]
    async fn an_aimed_shot_that_holds_nothing_passes_its_aim_to_the_next() {
        // Nothing listens on port 9: the hold fails and the shot lands blind.
        let admin = Admin::new("t".into(), vec![AdminNode::new("worker-1", "http://127.0.0.1:9")]).unwrap();
        let aim = Aim::new(admin, Duration::from_secs(2));
        assert!(!Aim::at_batch(Some(&aim), "worker-1").await, "the first shot is aimed and holds nothing");
        assert_eq!(Aim::take(Some(&aim)), Some(json!({"held": false})));
        assert!(!Aim::at_batch(Some(&aim), "worker-1").await, "the second is aimed in its place, and misses too");
        assert_eq!(Aim::take(Some(&aim)), Some(json!({"held": false})), "an aimed shot leaves its answer");
        // A shot that held: the alternation resumes from where it was.
        assert!(aim.answered(json!({"held": true})));
        let shots: Vec<bool> = (0..3).map(|_| aim.takes_aim()).collect();
        assert_eq!(shots, [false, true, false]);
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

    /// A node without hold points that the client calls: the strike waits for
    /// the client's next request and lands while it is in flight; under
    /// `--aim blind` it does not wait at all.
    #[tokio::test(start_paused = true)]
    async fn a_node_the_client_calls_is_struck_while_a_request_is_in_flight() {
        let flight = Arc::new(InFlight::default());
        let aim = Aim::with(
            None,
            Vec::new(),
            vec![("api".into(), flight.clone())],
            Aiming::Points,
            Duration::from_secs(2),
            7,
        );
        assert!(!Aim::at_batch(Some(&aim), "api").await, "no request has ended: no latency to aim within");
        assert_eq!(Aim::take(Some(&aim)), Some(json!({"held": false, "client": true})));
        {
            let _r = flight.begin();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let client = {
            let flight = flight.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _r = flight.begin();
                tokio::time::sleep(Duration::from_millis(100)).await;
            })
        };
        // The first shot held nothing, so the second takes its aim.
        assert!(Aim::at_batch(Some(&aim), "api").await, "the second is aimed, and a request is in flight");
        let answer = Aim::take(Some(&aim)).unwrap();
        assert_eq!((answer["client"].clone(), answer["in_flight"].clone()), (json!(true), json!(1)), "{answer}");
        assert!(answer["after_ms"].as_u64().unwrap() < 100, "within the median latency: {answer}");
        client.await.unwrap();
        assert!(!aim.takes_aim(), "it held, so the turns go on: the third shot is blind");
        assert!(!Aim::at_batch(Some(&aim), "worker-1").await, "a node the client does not call: blind");

        let blind = Aim::with(None, Vec::new(), vec![("api".into(), flight)], Aiming::Blind, Duration::from_secs(2), 7);
        assert!(!Aim::at_batch(Some(&blind), "api").await);
        assert_eq!(Aim::take(Some(&blind)), None, "--aim blind asks nothing");
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
