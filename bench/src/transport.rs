//! `haunt bench transport`: what haunt's relay and consumers make of a
//! broker, against a client of the same broker doing the same work without
//! the database.
//!
//! One transport and mode, on PostgreSQL, its broker started as a local
//! process of its own. Each of haunt's phases is paired with a bare one:
//!
//! - **publish**: haunt's relay publishing `events` outbox rows (lease a
//!   batch, publish it, wait for the broker's confirmation, delete the rows)
//!   until the outbox is empty, against the transport's publisher sending the
//!   same number of envelopes from memory, a batch at a time, each batch
//!   confirmed;
//! - **drain**: haunt's workers (`consumers` consume loops, each applying a
//!   batch through the inbox, the projection and the ledger in one
//!   transaction, then acking it in the row's mode) until every event is
//!   applied, against as many of the transport's consumers receiving the same
//!   number of messages a batch at a time and acking each batch (not at all
//!   where the mode settles on receipt).
//!
//! The bare client is haunt's transport module without the relay, the
//! worker or the database: the broker's own client library and haunt's
//! envelope, so what is left in the ratio is what the database and the
//! pipeline's protocol cost. Phases alternate, bare, haunt, bare, … bare,
//! and each haunt phase is divided by the mean of the bare phases on either
//! side of it, as the pipeline bench pairs its drains.
//!
//! Before the rounds, one bare phase and one haunt phase are run and not
//! counted (`warmup`): a broker on the JVM (Kafka, the Pub/Sub emulator)
//! ran its first phase far below its later ones, before its code was
//! compiled (Kafka's bare drain at 8,437 to 61,061 events/s against
//! 72,365 to 185,319 after), and that phase weighed on the first pair alone.
//!
//! A broker that keeps nothing for a consumer that is not there (Redis
//! Pub/Sub, core NATS, MQTT at QoS 0) cannot be filled first: there the
//! consumers start first, and the drain is the time from the first publish
//! to the last message in, with what arrived counted (an at-most-once mode
//! may lose some).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use haunt_chaos::systems::brokers::{Broker, LocalServer};
use haunt_store::{Baseline, Bug, Store, StoreOptions};
use haunt_telemetry::metrics::{OutcomeLabels, WorkerMetrics};
use haunt_transport::{Envelope, Options, TransportSpec};
use serde_json::json;

use crate::TransportOptions;
use crate::pipeline::{Record, ensure_empty, verify_drained};

/// Distinct items of the events (the projection's rows).
const ITEMS: usize = 100;

/// A phase that takes longer than this has failed.
const PHASE_LIMIT: Duration = Duration::from_secs(600);

/// A client that does not connect (or stop) within this has failed.
const CONNECT_LIMIT: Duration = Duration::from_secs(60);

/// haunt's worker in every phase: its consume loops are `WORKER_ID-SLOT`,
/// the names the bare consumers take too.
const WORKER_ID: &str = "bench";

/// How long a live drain waits after the last message before it counts what
/// arrived (an at-most-once mode may have lost the rest).
const LIVE_QUIET: Duration = Duration::from_secs(3);

/// One phase's rates, in events per second (for a live drain, of what
/// arrived).
#[derive(Debug, Clone, Copy)]
struct Rates {
    publish: f64,
    drain: f64,
    /// Events over the time to publish and drain them (live: the drain's,
    /// which spans the publish): the mode's rate, end to end.
    both: f64,
    /// Messages the drain got, of the events published.
    received: usize,
}

pub fn transport(
    options: TransportOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> futures_util::future::BoxFuture<'_, anyhow::Result<serde_json::Value>> {
    // Boxed in this crate, as `haunt_chaos::assemble::run_interruptible` says why.
    Box::pin(transport_run(options, progress))
}

async fn transport_run(
    options: TransportOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> anyhow::Result<serde_json::Value> {
    let spec = options.spec;
    anyhow::ensure!(
        spec.is_broker(),
        "the transport bench needs a broker; the database queue is `haunt bench pipeline`"
    );
    anyhow::ensure!(options.db.is_postgres(), "the transport bench runs on PostgreSQL: --db postgres://…");
    anyhow::ensure!(options.events > 0 && options.batch_size > 0 && options.consumers > 0 && options.rounds > 0);
    // Migrated, and refused unless empty, before anything starts: the bench
    // empties its tables after each phase.
    let store = Store::connect(&options.db, StoreOptions::default()).await?;
    let empty = ensure_empty(&store, &options.db).await;
    store.close().await;
    empty?;
    let baseline = Baseline::connect(&options.db, 4).await?;
    let dir = tempfile::tempdir()?;
    let name = spec.server().context("no broker server")?;
    let broker = Broker::from_name(name).with_context(|| format!("no broker server for {spec}"))?;
    let server = LocalServer::start(broker, dir.path()).await?;
    let url = server.url(spec);
    // The queue, stream or topic and its group, as a run declares them
    // before its relay and workers start (Kafka creates no topic on use).
    haunt_transport::inspector(spec, &url).await?.declare().await.context("declaring the broker's queue")?;
    let live = !spec.keeps_for_absent_consumers();
    let measured = rounds(&options, &baseline, &url, live, progress).await;
    // Whatever happened, the database is left empty, its housekeeping on
    // (a failed phase must not leave rows that refuse the next bench).
    let cleaned = async {
        baseline.reset().await?;
        baseline.housekeeping_back_on().await
    }
    .await;
    drop(server);
    let measured = measured?;
    cleaned?;
    report(&options, live, &measured)
}

/// What the rounds measured: the warm-up's pairs (not counted), then the
/// bare phases and haunt's between them.
struct Measured {
    warmup: Vec<(Rates, Rates)>,
    bare: Vec<Rates>,
    haunt: Vec<Rates>,
}

/// The warm-up's pairs, then the rounds: bare, haunt, bare, … bare.
async fn rounds(
    options: &TransportOptions,
    baseline: &Baseline,
    url: &str,
    live: bool,
    progress: &mut (dyn FnMut(&str) + Send),
) -> anyhow::Result<Measured> {
    let spec = options.spec;
    let mut m = Measured { warmup: Vec::new(), bare: Vec::new(), haunt: Vec::new() };
    // A phase's number names its messages and ids (the warm-up's first), so
    // that no two phases share one.
    for phase in 0..options.warmup {
        let b = bare_phase(options, url, phase, live).await.context("the bare warm-up")?;
        progress(&format!("bare {spec} warm-up: publish {:.0} events/s, drain {:.0} events/s", b.publish, b.drain));
        let h = haunt_phase(options, baseline, url, phase, live).await.context("haunt's warm-up")?;
        progress(&format!("haunt {spec} warm-up: relay {:.0} events/s, workers {:.0} events/s", h.publish, h.drain));
        m.warmup.push((b, h));
    }
    for round in 0..=options.rounds {
        let phase = options.warmup + round;
        let r = bare_phase(options, url, phase, live).await.with_context(|| format!("bare round {}", round + 1))?;
        progress(&format!(
            "bare {spec} {}: publish {:.0} events/s, drain {:.0} events/s ({} of {})",
            round + 1,
            r.publish,
            r.drain,
            r.received,
            options.events
        ));
        m.bare.push(r);
        if round == options.rounds {
            break;
        }
        let h = haunt_phase(options, baseline, url, phase, live)
            .await
            .with_context(|| format!("haunt round {}", round + 1))?;
        progress(&format!(
            "haunt {spec} {}: relay {:.0} events/s, workers {:.0} events/s ({} of {})",
            round + 1,
            h.publish,
            h.drain,
            h.received,
            options.events
        ));
        m.haunt.push(h);
    }
    Ok(m)
}

fn report(options: &TransportOptions, live: bool, m: &Measured) -> anyhow::Result<serde_json::Value> {
    let (spec, bare, haunt) = (options.spec, &m.bare, &m.haunt);
    let paired = |of: fn(&Rates) -> f64| -> Vec<f64> {
        haunt.iter().enumerate().map(|(i, h)| of(h) / ((of(&bare[i]) + of(&bare[i + 1])) / 2.0)).collect()
    };
    let publish_ratios = paired(|r| r.publish);
    let drain_ratios = paired(|r| r.drain);
    let rates = |rs: &[Rates], of: fn(&Rates) -> f64| rs.iter().map(of).collect::<Vec<_>>();
    Ok(json!({
        "bench": "transport",
        "machine": crate::machine(),
        "transport": spec.to_string(),
        "claim": spec.claim().name(),
        "live": live,
        "inbox": !options.no_inbox,
        "events": options.events,
        "batch_size": options.batch_size,
        "consumers": options.consumers,
        "rounds": options.rounds,
        "warmup": {
            "bare_publish_events_per_s": m.warmup.iter().map(|(b, _)| b.publish).collect::<Vec<_>>(),
            "bare_drain_events_per_s": m.warmup.iter().map(|(b, _)| b.drain).collect::<Vec<_>>(),
            "relay_events_per_s": m.warmup.iter().map(|(_, h)| h.publish).collect::<Vec<_>>(),
            "workers_events_per_s": m.warmup.iter().map(|(_, h)| h.drain).collect::<Vec<_>>(),
            "applied": m.warmup.iter().map(|(_, h)| h.received).collect::<Vec<_>>(),
        },
        "bare": {
            "publish_events_per_s": rates(bare, |r| r.publish),
            "drain_events_per_s": rates(bare, |r| r.drain),
            "received": bare.iter().map(|r| r.received).collect::<Vec<_>>(),
        },
        "haunt": {
            "relay_events_per_s": rates(haunt, |r| r.publish),
            "workers_events_per_s": rates(haunt, |r| r.drain),
            "applied": haunt.iter().map(|r| r.received).collect::<Vec<_>>(),
        },
        "ratios": {
            "relay_vs_bare_publish_paired": publish_ratios,
            "workers_vs_bare_drain_paired": drain_ratios,
            "relay_vs_bare_publish": median(&publish_ratios),
            "workers_vs_bare_drain": median(&drain_ratios),
        },
        "bare_publish_events_per_s": median(&rates(bare, |r| r.publish)),
        "bare_drain_events_per_s": median(&rates(bare, |r| r.drain)),
        "bare_events_per_s": median(&rates(bare, |r| r.both)),
        "haunt_events_per_s": median(&rates(haunt, |r| r.both)),
    }))
}

/// The median of the finite `values`, unrounded: unlike the checker's
/// quantiles (`haunt_checker::stats::quantile`, three decimals), a ratio of
/// one round here is exactly that round's, which the suite checks.
fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 })
}

/// The envelopes of a bare phase, like the outbox's rows of a haunt phase.
fn envelopes(round: usize, n: usize) -> Vec<Envelope> {
    (0..n)
        .map(|i| {
            let (order_id, event_id, item_id) = (format!("bare-{round}-{i}"), format!("eb-{round}-{i}"), i % ITEMS);
            Envelope {
                message_id: format!("mb-{round}-{i}"),
                payload:
                    json!({"event_id": event_id, "order_id": order_id, "item_id": format!("item-{item_id}"), "qty": 1})
                        .to_string(),
                event_id,
                headers: json!({"correlation_id": order_id}).to_string(),
                enqueued_at_ms: 0,
                key: Some(format!("item-{item_id}")),
            }
        })
        .collect()
}

fn transport_options(client_id: String) -> Options {
    Options { client_id, visibility_timeout: Duration::from_secs(30), ..Options::default() }
}

/// The bare phase's consumers, connected.
async fn bare_consumers(
    options: &TransportOptions,
    url: &str,
) -> anyhow::Result<Vec<Box<dyn haunt_transport::Consumer>>> {
    let mut consumers = Vec::new();
    for c in 0..options.consumers {
        // The names of haunt's consume loops (`WORKER_ID-SLOT`): a broker
        // that keeps a session per name (MQTT) then has no session that
        // outlives its phase and takes a share of the next one's messages.
        let o = transport_options(format!("{WORKER_ID}-{c}"));
        let connect = haunt_transport::consumer(options.spec, url, &o);
        consumers.push(tokio::time::timeout(CONNECT_LIMIT, connect).await.context("connecting a consumer")??);
    }
    Ok(consumers)
}

/// The transport's own client: publish from memory, then drain (or, live,
/// drain while publishing). Before a drain of what the broker holds, its
/// consumers connect once and end as a crash would, so that every
/// subscription, session and group is in place; the drain then connects
/// them again, on the clock, as haunt's workers do. What the drain got is
/// counted by message id: a fan-out (Redis Pub/Sub) gives every consumer
/// every message.
async fn bare_phase(options: &TransportOptions, url: &str, round: usize, live: bool) -> anyhow::Result<Rates> {
    let n = options.events;
    let batch = options.batch_size as usize;
    let received: Arc<Mutex<HashSet<String>>> = Arc::default();
    let count = |received: &Mutex<HashSet<String>>| received.lock().unwrap_or_else(|p| p.into_inner()).len();
    let ours = format!("mb-{round}-");
    let drain = |consumers: Vec<Box<dyn haunt_transport::Consumer>>| {
        let mut tasks = tokio::task::JoinSet::new();
        for mut consumer in consumers {
            let (received, ours) = (received.clone(), ours.clone());
            tasks.spawn(async move {
                let mut last = Instant::now();
                while count(&received) < n {
                    let got = receive_and_ack(&mut *consumer, batch, Duration::from_millis(100)).await?;
                    if got.is_empty() {
                        if live && last.elapsed() > LIVE_QUIET {
                            break;
                        }
                        continue;
                    }
                    last = Instant::now();
                    // Only this round's: a redelivery of an earlier phase's
                    // message is acked and not counted.
                    let mut seen = received.lock().unwrap_or_else(|p| p.into_inner());
                    seen.extend(got.into_iter().filter(|id| id.starts_with(&ours)));
                }
                // Off the clock: what is still on its way to this consumer
                // (a session's in-flight window) is taken and acked, so that
                // the next phase, under the same names, starts with nothing.
                while !receive_and_ack(&mut *consumer, batch, Duration::from_millis(300)).await?.is_empty() {}
                anyhow::Ok(last)
            });
        }
        tasks
    };
    let all = envelopes(round, n);
    let (published, started, last) = if live {
        let consumers = bare_consumers(options, url).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        let mut tasks = drain(consumers);
        let published = publish_all(options, url, round, &all).await?;
        (published, started, join_last(&mut tasks).await?)
    } else {
        for consumer in bare_consumers(options, url).await? {
            consumer.crash().await;
        }
        let published = publish_all(options, url, round, &all).await?;
        let started = Instant::now();
        let mut tasks = drain(bare_consumers(options, url).await?);
        (published, started, join_last(&mut tasks).await?)
    };
    forget_sessions(options, url).await?;
    let got = count(&received).min(n);
    anyhow::ensure!(live || got >= n, "the bare drain got {got} of {n} messages");
    let drained = last.saturating_duration_since(started).as_secs_f64().max(1e-6);
    let both = if live { got as f64 / drained } else { got as f64 / (published + drained) };
    Ok(Rates { publish: n as f64 / published, drain: got as f64 / drained, both, received: got })
}

/// Ends the phase's MQTT sessions, where the mode keeps them (QoS 1 and 2),
/// with what they still hold: each name connects once with a clean session,
/// which the broker takes as the end of the old one. The bare client and
/// haunt's workers share these names (a session under another name would
/// take its turn in the shared subscription while its owner is away), so
/// whatever a phase left in one (every message was received, so a resend,
/// or one whose ack the broker never had) would otherwise go to the next
/// phase under that name: over 2,000 events, haunt's drain after a bare one
/// applied 2,079 (QoS 1) and 2,023 (QoS 2), and the bench stopped.
async fn forget_sessions(options: &TransportOptions, url: &str) -> anyhow::Result<()> {
    if options.spec.kind != haunt_transport::Kind::Mqtt || !options.spec.keeps_for_absent_consumers() {
        return Ok(());
    }
    let clean: TransportSpec = "mqtt:qos0".parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    for c in 0..options.consumers {
        let o = transport_options(format!("{WORKER_ID}-{c}"));
        let connect = haunt_transport::consumer(clean, url, &o);
        let consumer = tokio::time::timeout(CONNECT_LIMIT, connect).await.context("ending a session")??;
        consumer.crash().await;
    }
    Ok(())
}

/// Receives up to `max` and acks them (where the mode does not settle on
/// receipt); their message ids.
async fn receive_and_ack(
    consumer: &mut dyn haunt_transport::Consumer,
    max: usize,
    wait: Duration,
) -> anyhow::Result<Vec<String>> {
    let got = consumer.receive(max, wait).await?;
    if !got.is_empty() && !consumer.acks_on_receipt() {
        let receipts: Vec<_> = got.iter().map(|d| d.receipt.clone()).collect();
        consumer.ack(&receipts).await?;
    }
    Ok(got.into_iter().map(|d| d.envelope.message_id).collect())
}

/// Connects the transport's publisher and publishes `all` a batch at a
/// time, each batch confirmed; its seconds, the connection included (as the
/// relay's are).
async fn publish_all(options: &TransportOptions, url: &str, round: usize, all: &[Envelope]) -> anyhow::Result<f64> {
    let started = Instant::now();
    let publish = async {
        let o = transport_options(format!("bare-pub-{round}"));
        let mut publisher = haunt_transport::publisher(options.spec, url, &o).await?;
        for chunk in all.chunks(options.batch_size as usize) {
            publisher.publish(chunk).await.context("publishing")?;
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(PHASE_LIMIT, publish)
        .await
        .map_err(|_| anyhow::anyhow!("not published in {PHASE_LIMIT:?}"))??;
    Ok(started.elapsed().as_secs_f64())
}

/// Waits for every consumer task; the latest moment one of them got a message.
async fn join_last(tasks: &mut tokio::task::JoinSet<anyhow::Result<Instant>>) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + PHASE_LIMIT;
    let mut last: Option<Instant> = None;
    while let Some(done) = tokio::time::timeout_at(deadline.into(), tasks.join_next())
        .await
        .map_err(|_| anyhow::anyhow!("not drained in {PHASE_LIMIT:?}"))?
    {
        let at = done.context("a consumer panicked")??;
        last = Some(last.map_or(at, |l| l.max(at)));
    }
    last.context("no consumer")
}

/// haunt's relay and workers over the same broker: the outbox filled, the
/// relay publishing it, then the workers applying it (live: the workers
/// first). Before a drain of what the broker holds, the workers connect
/// once and stop, as the bare consumers do.
async fn haunt_phase(
    options: &TransportOptions,
    baseline: &Baseline,
    url: &str,
    round: usize,
    live: bool,
) -> anyhow::Result<Rates> {
    let n = options.events;
    // Ids of their own: a broker that deduplicates by message id would
    // drop a round's messages under an earlier round's ids.
    baseline.enqueue_from(round * n, n, ITEMS).await?;
    if !baseline.settle().await? {
        eprintln!("warning: no checkpoint before the relay (CHECKPOINT needs a superuser or pg_checkpoint)");
    }
    let workers = Workers::new(options, url).await?;
    let watcher = Store::connect(&options.db, StoreOptions::default()).await?;
    let (published, started, (applied, last)) = if live {
        let running = workers.start();
        running.connected().await?;
        let started = Instant::now();
        // The applications are watched while the relay publishes.
        let (published, drained) =
            tokio::join!(relay_all(options, url, &watcher), running.until_applied(n, Some(LIVE_QUIET)));
        (published?, started, drained?)
    } else {
        let running = workers.start();
        running.connected().await?;
        let workers = running.stop().await?;
        let published = relay_all(options, url, &watcher).await?;
        let started = Instant::now();
        (published, started, workers.start().until_applied(n, None).await?)
    };
    watcher.close().await;
    forget_sessions(options, url).await?;
    if !live && !options.no_inbox {
        verify_drained(baseline, n, "haunt's drain", Record::Numbered).await?;
    }
    baseline.reset().await?;
    let drained = last.saturating_duration_since(started).as_secs_f64().max(1e-6);
    let both = if live { applied as f64 / drained } else { applied as f64 / (published + drained) };
    Ok(Rates { publish: n as f64 / published, drain: applied as f64 / drained, both, received: applied })
}

/// Runs haunt's relay until the outbox is empty; its seconds.
async fn relay_all(options: &TransportOptions, url: &str, watcher: &Store) -> anyhow::Result<f64> {
    let store = Store::connect(&options.db, StoreOptions::default()).await?;
    store.warm(2).await?;
    let config = haunt_relay::RelayConfig {
        batch_size_max: options.batch_size,
        visibility_timeout: Duration::from_secs(30),
        poll_interval: Duration::from_millis(5),
        ..haunt_relay::RelayConfig::new(options.spec, url.to_owned())
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let relay = tokio::spawn(haunt_relay::run(
        None,
        store,
        config,
        Box::pin(async move {
            let _ = stopped.await;
        }),
    ));
    let result = async {
        loop {
            if watcher.queue_is_empty().await? {
                return anyhow::Ok(started.elapsed().as_secs_f64());
            }
            anyhow::ensure!(!relay.is_finished(), "the relay stopped before the outbox was empty");
            anyhow::ensure!(started.elapsed() < PHASE_LIMIT, "the outbox not empty in {PHASE_LIMIT:?}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    .await;
    let _ = stop.send(());
    let stopped = tokio::time::timeout(CONNECT_LIMIT, relay).await.context("the relay did not stop")?;
    stopped.context("the relay panicked")?.context("the relay")?;
    result
}

/// haunt's workers of one phase: one worker with `consumers` consume loops.
struct Workers {
    worker: haunt_worker::Worker,
    metrics: Arc<WorkerMetrics>,
}

struct Running {
    workers: Workers,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Workers {
    async fn new(options: &TransportOptions, url: &str) -> anyhow::Result<Workers> {
        let store = Store::connect(&options.db, StoreOptions::default()).await?;
        store.warm(2 * options.consumers as u32).await?;
        let config = haunt_worker::WorkerConfig {
            worker_id: WORKER_ID.into(),
            batch_size_max: options.batch_size,
            concurrency: options.consumers,
            poll_interval: Duration::from_millis(5),
            visibility_timeout: Duration::from_secs(30),
            bug: options.no_inbox.then_some(Bug::NoInbox),
            broker: Some(haunt_worker::BrokerSource { spec: options.spec, url: url.to_owned() }),
            ..haunt_worker::WorkerConfig::default()
        };
        let metrics = Arc::new(WorkerMetrics::default());
        let worker = haunt_worker::Worker::new(store, config, Arc::default(), metrics.clone());
        Ok(Workers { worker, metrics })
    }

    fn start(self) -> Running {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let worker = self.worker.clone();
        let task = tokio::spawn(async move { worker.run(stopped).await });
        Running { workers: self, stop, task }
    }
}

impl Running {
    fn applied(&self) -> usize {
        self.workers.metrics.deliveries.get_or_create(&OutcomeLabels { outcome: "applied" }).get().0 as usize
    }

    /// Waits until every consume loop is connected to the broker.
    async fn connected(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        while !self.workers.worker.links().ready() {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "the workers did not connect in 60 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A subscription is in place a moment after its connection.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }

    /// Stops the workers (each loop finishes its batch); they may start again.
    async fn stop(self) -> anyhow::Result<Workers> {
        let _ = self.stop.send(true);
        let stopped = tokio::time::timeout(CONNECT_LIMIT, self.task).await.context("the workers did not stop")?;
        stopped.context("a worker panicked")?;
        Ok(self.workers)
    }

    /// Until `n` are applied (or, live, nothing more for `quiet` once
    /// something was, or for ten times `quiet` if nothing ever is); how many
    /// were, and when the last was. Stops the workers.
    async fn until_applied(self, n: usize, quiet: Option<Duration>) -> anyhow::Result<(usize, Instant)> {
        let started = Instant::now();
        let (mut seen, mut last) = (0, Instant::now());
        loop {
            let applied = self.applied();
            if applied != seen {
                (seen, last) = (applied, Instant::now());
            }
            let quiet_now = quiet.is_some_and(|q| last.elapsed() > if seen > 0 { q } else { 10 * q });
            if applied >= n || quiet_now {
                break;
            }
            anyhow::ensure!(!self.task.is_finished(), "the workers stopped before the drain ended");
            anyhow::ensure!(started.elapsed() < PHASE_LIMIT, "{applied} of {n} applied in {PHASE_LIMIT:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.stop().await?;
        Ok((seen, last))
    }
}
