//! What haunt can tell from outside a node about the work it has in hand,
//! to aim a kill or a pause of a node that offers no hold point (see
//! [`crate::core::nemesis::Aim`]): a probe the system declares ([`WorkProbe`]),
//! or what the workload's client knows of a node it calls ([`InFlight`]): how
//! many of its requests are in flight there now, and how long they take.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Says whether a node holds work now (a system file's `aim`: rows it has
/// leased and not acked, say).
pub trait WorkProbe: Send + Sync + std::fmt::Debug {
    fn holds_work(&self) -> crate::core::roles::BoxFuture<'_, anyhow::Result<bool>>;
}

/// How many latencies the median is taken over.
const RECENT: usize = 64;

/// The client's requests in flight at one node: from the request's start to
/// the answer's head, the time the node works on it.
#[derive(Debug, Default)]
pub struct InFlight {
    now: AtomicUsize,
    /// Woken at each request's start.
    started: Notify,
    /// The latest requests' latencies.
    recent: Mutex<VecDeque<Duration>>,
}

/// One request in flight; it ends when dropped, however it ended.
#[derive(Debug)]
pub struct Request {
    of: Arc<InFlight>,
    at: Instant,
}

impl Drop for Request {
    fn drop(&mut self) {
        self.of.now.fetch_sub(1, Ordering::AcqRel);
        let mut recent = self.of.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(self.at.elapsed());
    }
}

impl InFlight {
    /// A request starts.
    pub fn begin(self: &Arc<Self>) -> Request {
        self.now.fetch_add(1, Ordering::AcqRel);
        self.started.notify_waiters();
        Request { of: self.clone(), at: Instant::now() }
    }

    /// The requests in flight now.
    pub fn count(&self) -> usize {
        self.now.load(Ordering::Acquire)
    }

    /// The median latency of the latest requests, once one has ended.
    pub fn median(&self) -> Option<Duration> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let mut sorted: Vec<Duration> = recent.iter().copied().collect();
        sorted.sort();
        sorted.get(sorted.len() / 2).copied()
    }

    /// Whether a request starts within `wait`.
    pub async fn next_start(&self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.started.notified()).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn requests_are_counted_and_timed_and_their_starts_awaited() {
        let flight = Arc::new(InFlight::default());
        assert_eq!((flight.count(), flight.median()), (0, None));
        assert!(!flight.next_start(Duration::from_millis(100)).await, "nobody started one");
        for ms in [10, 30, 20] {
            let r = flight.begin();
            assert_eq!(flight.count(), 1);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            drop(r);
        }
        assert_eq!((flight.count(), flight.median()), (0, Some(Duration::from_millis(20))));
        let waiter = {
            let flight = flight.clone();
            tokio::spawn(async move { flight.next_start(Duration::from_secs(1)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _r = flight.begin();
        assert!(waiter.await.unwrap(), "woken by the start");
    }
}
