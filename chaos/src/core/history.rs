//! The history recorder: every client op and every fault, in index order, with
//! a monotonic clock that starts with the run.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use haunt_format::{JsonlWriter, Op, OpType, OpValue, Process};

/// Shared by every client task and the nemesis. One lock orders the index, the
/// clock reading and the write, so the file is in index order with monotonic
/// times however the tasks interleave.
#[derive(Debug)]
pub struct Recorder {
    started: Instant,
    started_at_ms: i64,
    inner: Mutex<Inner>,
    ok: AtomicU64,
    fail: AtomicU64,
    info: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    next_index: u64,
    writer: JsonlWriter<BufWriter<File>>,
    error: Option<std::io::Error>,
}

/// Counts of completed client ops, for progress lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
}

impl Recorder {
    pub fn create(path: &Path) -> std::io::Result<Recorder> {
        let file = File::create(path)?;
        Ok(Recorder {
            started: Instant::now(),
            started_at_ms: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0),
            inner: Mutex::new(Inner { next_index: 0, writer: JsonlWriter::new(BufWriter::new(file)), error: None }),
            ok: AtomicU64::new(0),
            fail: AtomicU64::new(0),
            info: AtomicU64::new(0),
        })
    }

    /// Unix time in ms at `time_ns` 0.
    pub fn started_at_ms(&self) -> i64 {
        self.started_at_ms
    }

    pub fn elapsed_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// Appends one op and returns it. A write error is kept and reported by
    /// [`Recorder::finish`]: the run goes on, and its verdict will say the
    /// history is unusable.
    pub fn record(
        &self,
        process: Process,
        kind: OpType,
        f: &str,
        value: OpValue,
        correlation_id: Option<String>,
        error: Option<String>,
    ) -> Op {
        if !process.is_nemesis() {
            match kind {
                OpType::Ok => self.ok.fetch_add(1, Ordering::Relaxed),
                OpType::Fail => self.fail.fetch_add(1, Ordering::Relaxed),
                OpType::Info => self.info.fetch_add(1, Ordering::Relaxed),
                OpType::Invoke => 0,
            };
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let op = Op {
            index: inner.next_index,
            time_ns: self.elapsed_ns(),
            process,
            kind,
            f: f.to_owned(),
            value,
            correlation_id,
            error,
        };
        inner.next_index += 1;
        if inner.error.is_none()
            && let Err(e) = inner.writer.write(&op)
        {
            inner.error = Some(e);
        }
        op
    }

    /// A nemesis op: `info`, with a free-form value naming the target.
    pub fn nemesis(&self, f: &str, value: serde_json::Value) -> Op {
        self.record(Process::Nemesis, OpType::Info, f, OpValue::Other(value), None, None)
    }

    /// Completed client ops so far.
    pub fn tally(&self) -> Tally {
        Tally {
            ok: self.ok.load(Ordering::Relaxed),
            fail: self.fail.load(Ordering::Relaxed),
            info: self.info.load(Ordering::Relaxed),
        }
    }

    pub fn ops(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).next_index
    }

    pub fn flush(&self) -> std::io::Result<()> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).writer.flush()
    }

    /// Flushes and returns the first write error, if any.
    pub fn finish(&self) -> std::io::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = inner.error.take() {
            return Err(e);
        }
        inner.writer.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_indexed_in_order_with_monotonic_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let r = std::sync::Arc::new(Recorder::create(&path).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        r.nemesis("kill", serde_json::json!({"target": format!("t{t}")}));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        r.finish().unwrap();
        let ops: Vec<Op> =
            std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(ops.len(), 400);
        assert!(ops.windows(2).all(|w| w[1].index == w[0].index + 1 && w[1].time_ns >= w[0].time_ns));
    }
}
