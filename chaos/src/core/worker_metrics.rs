//! The workers' delivery counters, scraped from their `/metrics` while a run
//! goes, for the progress line: redeliveries (`haunt_redeliveries_total`) and
//! duplicates the inbox absorbed (`haunt_deliveries_total{outcome="duplicate"}`),
//! summed over the workers.
//!
//! A worker the nemesis killed or paused does not answer; its last known
//! figures stay in the sum. A worker that restarts counts from zero again, so a
//! counter that goes down is taken as a restart: what the worker had counted
//! before it is kept as an offset, and the sum never goes backwards. These are
//! live estimates; the exact figures are the run directory's.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How often the workers are scraped: often enough that a worker killed and
/// restarted by the nemesis (a hold of a few seconds) loses little of what it
/// counted in between, rarely enough to cost the workers nothing.
const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// How long one scrape may take. A paused worker accepts the connection and
/// never answers; this bounds the wait so the next round starts on time. A
/// worker's `/metrics` waits up to 2 s for the queue depths when the database
/// is slow, and such a round simply keeps the last figures.
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(800);

/// One worker's two counters as one scrape read them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub redeliveries: u64,
    pub duplicates_absorbed: u64,
}

impl Counters {
    fn add(self, other: Counters) -> Counters {
        Counters {
            redeliveries: self.redeliveries + other.redeliveries,
            duplicates_absorbed: self.duplicates_absorbed + other.duplicates_absorbed,
        }
    }
}

/// The two counters from an OpenMetrics (or Prometheus text) exposition. A
/// counter missing from the text (a worker that has not counted one yet) is 0.
pub fn parse(text: &str) -> Counters {
    let mut out = Counters::default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        // `name{labels} value [timestamp] [# exemplar]`: the sample's value is
        // the first field after the name and its labels.
        let (series, rest) = match line.find('}') {
            Some(end) => (&line[..=end], &line[end + 1..]),
            None => match line.split_once(' ') {
                Some((name, rest)) => (name, rest),
                None => continue,
            },
        };
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        // Counters are integers; a float encoding (`3.0`) rounds to the same.
        let value = if value.is_finite() && value > 0.0 { value.round() as u64 } else { 0 };
        if series == "haunt_redeliveries_total" {
            out.redeliveries = value;
        } else if series.starts_with("haunt_deliveries_total{") && series.contains(r#"outcome="duplicate""#) {
            out.duplicates_absorbed = value;
        }
    }
    out
}

/// What one worker counted, across its restarts.
#[derive(Debug, Clone, Copy, Default)]
struct WorkerTally {
    /// Whether any scrape of this worker has answered.
    seen: bool,
    /// The counters as the last answering scrape read them.
    last: Counters,
    /// What earlier incarnations of the worker had counted before restarting.
    offset: Counters,
}

impl WorkerTally {
    fn observe(&mut self, now: Counters) {
        // Each counter on its own: a restarted worker may already have counted
        // past its old redeliveries but not yet past its old duplicates.
        if now.redeliveries < self.last.redeliveries {
            self.offset.redeliveries += self.last.redeliveries;
        }
        if now.duplicates_absorbed < self.last.duplicates_absorbed {
            self.offset.duplicates_absorbed += self.last.duplicates_absorbed;
        }
        self.last = now;
        self.seen = true;
    }

    fn total(&self) -> Counters {
        self.offset.add(self.last)
    }
}

/// The workers' counters summed, one slot per worker in the order given.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    workers: Vec<WorkerTally>,
}

impl Tally {
    pub fn new(workers: usize) -> Self {
        Tally { workers: vec![WorkerTally::default(); workers] }
    }

    /// Records what a scrape of worker `i` read. A worker that did not answer
    /// is simply not observed: its last figures stay.
    pub fn observe(&mut self, i: usize, now: Counters) {
        if let Some(w) = self.workers.get_mut(i) {
            w.observe(now);
        }
    }

    /// The sum over the workers, or `None` while no worker has answered yet
    /// (unknown, not zero).
    pub fn total(&self) -> Option<Counters> {
        self.workers
            .iter()
            .any(|w| w.seen)
            .then(|| self.workers.iter().fold(Counters::default(), |sum, w| sum.add(w.total())))
    }
}

/// Scrapes the workers in the background until dropped.
#[derive(Debug)]
pub struct Watch {
    tally: Arc<Mutex<Tally>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Starts scraping `workers`, (name, base URL) pairs whose `/metrics` is
    /// the worker's.
    pub fn spawn(workers: Vec<(String, String)>) -> Self {
        let tally = Arc::new(Mutex::new(Tally::new(workers.len())));
        let task = tokio::spawn(scrape_loop(workers, tally.clone()));
        Watch { tally, task }
    }

    /// The workers' counters summed, `None` before any worker has answered.
    pub fn total(&self) -> Option<Counters> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner).total()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn scrape_loop(workers: Vec<(String, String)>, tally: Arc<Mutex<Tally>>) {
    let Ok(client) = reqwest::Client::builder().timeout(SCRAPE_TIMEOUT).build() else {
        tracing::warn!("no HTTP client for the workers' metrics; the progress line goes without them");
        return;
    };
    let mut tick = tokio::time::interval(SCRAPE_INTERVAL);
    // A round that ran long is not made up for with a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let rounds = workers.iter().map(|(_, url)| scrape(&client, url));
        let answers = futures_util::future::join_all(rounds).await;
        let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
        for (i, answer) in answers.into_iter().enumerate() {
            if let Some(counters) = answer {
                tally.observe(i, counters);
            }
        }
    }
}

/// One scrape, `None` when the worker did not answer in time or not with 200.
async fn scrape(client: &reqwest::Client, base: &str) -> Option<Counters> {
    let url = format!("{}/metrics", base.trim_end_matches('/'));
    let answer = tokio::time::timeout(SCRAPE_TIMEOUT, async {
        let response = client.get(&url).send().await.ok()?.error_for_status().ok()?;
        response.text().await.ok()
    })
    .await
    .ok()
    .flatten()?;
    Some(parse(&answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape `haunt_telemetry::metrics::encode` gives a worker's registry.
    const EXPOSITION: &str = r#"# HELP haunt_deliveries Deliveries processed by outcome.
# TYPE haunt_deliveries counter
haunt_deliveries_total{outcome="applied"} 4084 # {correlation_id="c-1",trace_id="ab"} 1.0 1796109128.6
haunt_deliveries_total{outcome="duplicate"} 163 # {correlation_id="c-9",trace_id="cd"} 1.0 1796109140.1
haunt_deliveries_total{outcome="lease_lost"} 2
# HELP haunt_redeliveries Deliveries after the first of a message.
# TYPE haunt_redeliveries counter
haunt_redeliveries_total 185
# HELP haunt_delivery_attempt Delivery attempt.
# TYPE haunt_delivery_attempt histogram
haunt_delivery_attempt_bucket{le="1.0"} 4084
# EOF
"#;

    #[test]
    fn the_two_counters_are_read_from_an_exposition() {
        assert_eq!(parse(EXPOSITION), Counters { redeliveries: 185, duplicates_absorbed: 163 });
    }

    #[test]
    fn missing_counters_are_zero_and_floats_round() {
        assert_eq!(parse("# EOF\n"), Counters::default());
        assert_eq!(parse("haunt_redeliveries_total 7.0\nhaunt_redeliveries_created 1.7e9\n").redeliveries, 7);
        // Another counter whose name starts the same is not taken for it.
        assert_eq!(parse("haunt_redeliveries_total_x 9\nhaunt_redeliveries_total 2\n").redeliveries, 2);
    }

    #[test]
    fn nothing_is_known_before_a_worker_answers() {
        let mut tally = Tally::new(2);
        assert_eq!(tally.total(), None);
        tally.observe(1, Counters { redeliveries: 3, duplicates_absorbed: 1 });
        assert_eq!(tally.total(), Some(Counters { redeliveries: 3, duplicates_absorbed: 1 }));
    }

    #[test]
    fn a_silent_worker_keeps_its_last_figures() {
        let mut tally = Tally::new(2);
        tally.observe(0, Counters { redeliveries: 10, duplicates_absorbed: 8 });
        tally.observe(1, Counters { redeliveries: 5, duplicates_absorbed: 5 });
        // Worker 0 is paused: only worker 1 answers.
        tally.observe(1, Counters { redeliveries: 6, duplicates_absorbed: 6 });
        assert_eq!(tally.total(), Some(Counters { redeliveries: 16, duplicates_absorbed: 14 }));
    }

    #[test]
    fn a_restarted_worker_does_not_make_the_total_go_backwards() {
        let mut tally = Tally::new(2);
        tally.observe(0, Counters { redeliveries: 10, duplicates_absorbed: 8 });
        tally.observe(1, Counters { redeliveries: 1, duplicates_absorbed: 1 });
        // Worker 0 killed and started again: its counters start from zero.
        tally.observe(0, Counters { redeliveries: 0, duplicates_absorbed: 0 });
        assert_eq!(tally.total(), Some(Counters { redeliveries: 11, duplicates_absorbed: 9 }));
        tally.observe(0, Counters { redeliveries: 4, duplicates_absorbed: 2 });
        assert_eq!(tally.total(), Some(Counters { redeliveries: 15, duplicates_absorbed: 11 }));
        // And again, after counting past the old duplicates but not the old
        // redeliveries: each counter is judged on its own.
        tally.observe(0, Counters { redeliveries: 3, duplicates_absorbed: 3 });
        assert_eq!(tally.total(), Some(Counters { redeliveries: 18, duplicates_absorbed: 12 }));
        tally.observe(0, Counters { redeliveries: 1, duplicates_absorbed: 1 });
        assert_eq!(tally.total(), Some(Counters { redeliveries: 19, duplicates_absorbed: 13 }));
    }

    #[tokio::test]
    async fn a_worker_that_does_not_answer_does_not_stall_the_scrape() {
        use tokio::io::AsyncWriteExt;
        // One worker that answers, one that accepts and never answers (paused),
        // one whose port is closed (killed).
        let answering = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let answering_url = format!("http://{}", answering.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = answering.accept().await else { return };
                let body = "haunt_redeliveries_total 4\nhaunt_deliveries_total{outcome=\"duplicate\"} 3\n";
                let answer =
                    format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        let paused = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let paused_url = format!("http://{}", paused.local_addr().unwrap());
        let closed_url = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let watch = Watch::spawn(vec![
            ("worker-1".into(), answering_url),
            ("worker-2".into(), paused_url),
            ("worker-3".into(), closed_url),
        ]);
        let started = std::time::Instant::now();
        let total = loop {
            if let Some(total) = watch.total() {
                break total;
            }
            // A round waits for the paused worker its timeout, not forever.
            assert!(started.elapsed() < Duration::from_secs(10), "no scrape round finished");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(total, Counters { redeliveries: 4, duplicates_absorbed: 3 });
        drop(paused);
    }
}
