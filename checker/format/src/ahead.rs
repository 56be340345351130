//! Reading a file ahead, on a thread of its own.
//!
//! Checking a long run is reading gigabytes once, front to back, and the
//! kernel's copy of them was about a sixth of the check's time, spent on the
//! thread that folds. [`ReadAhead`] moves it to a second thread, which reads
//! the file in large chunks into buffers that the reader hands back when it
//! is done with them, a few chunks ahead at most.

use std::io::{BufRead, Read};
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// The size of a chunk read at once.
const CHUNK: usize = 4 << 20;
/// Chunks read but not yet taken, at most.
const AHEAD: usize = 2;

/// A chunk: its buffer (always `CHUNK` long) and how much of it was read.
type Chunk = (Vec<u8>, usize);

/// A file read ahead by a thread of its own; see the module's doc. The thread
/// ends at the end of the file, on an error (which the reader then returns),
/// or when the reader is dropped.
#[derive(Debug)]
pub struct ReadAhead {
    /// `None` once dropped, which tells the thread to stop.
    chunks: Option<Receiver<std::io::Result<Chunk>>>,
    spent: SyncSender<Vec<u8>>,
    current: Chunk,
    pos: usize,
    done: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReadAhead {
    pub fn open(path: &Path) -> std::io::Result<ReadAhead> {
        let mut file = std::fs::File::open(path)?;
        let (send, chunks) = sync_channel::<std::io::Result<Chunk>>(AHEAD);
        let (spent, returned) = sync_channel::<Vec<u8>>(AHEAD + 2);
        let thread = std::thread::Builder::new().name("haunt-read-ahead".into()).spawn(move || {
            loop {
                let mut buf = returned.try_recv().unwrap_or_else(|_| vec![0; CHUNK]);
                let read = fill(&mut file, &mut buf);
                let end = matches!(read, Ok(0) | Err(_));
                if send.send(read.map(|n| (buf, n))).is_err() || end {
                    return;
                }
            }
        })?;
        Ok(ReadAhead {
            chunks: Some(chunks),
            spent,
            current: (Vec::new(), 0),
            pos: 0,
            done: false,
            thread: Some(thread),
        })
    }
}

/// Reads into `buf` until it is full or the file ends; how much was read.
fn fill(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl Drop for ReadAhead {
    /// Stops the thread and waits for it: its next send fails, after one
    /// more chunk read at most.
    fn drop(&mut self) {
        self.chunks.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(out.len());
        out[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for ReadAhead {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.pos == self.current.1 && !self.done {
            match self.chunks.as_ref().expect("taken only on drop").recv() {
                Ok(Ok((buf, 0))) => {
                    self.done = true;
                    let _ = self.spent.try_send(buf);
                }
                Ok(Ok(next)) => {
                    let spent = std::mem::replace(&mut self.current, next);
                    if !spent.0.is_empty() {
                        let _ = self.spent.try_send(spent.0);
                    }
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                // The thread ended without a last chunk: it cannot, but then
                // there is nothing more to read.
                Err(_) => self.done = true,
            }
        }
        Ok(&self.current.0[self.pos..self.current.1])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.current.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_reads_what_the_file_holds_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // Three chunks and a bit, lines straddling every boundary.
        let text: String = (0..1_700_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, &text).unwrap();
        let mut read = String::new();
        ReadAhead::open(&path).unwrap().read_to_string(&mut read).unwrap();
        assert_eq!(read.len(), text.len());
        assert!(read == text);
        let lines = std::io::BufReader::new(ReadAhead::open(&path).unwrap()).lines().count();
        assert_eq!(lines, 1_700_000);
    }

    #[test]
    fn an_empty_file_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty");
        std::fs::write(&path, "").unwrap();
        let mut read = Vec::new();
        ReadAhead::open(&path).unwrap().read_to_end(&mut read).unwrap();
        assert!(read.is_empty());
    }

    #[test]
    fn dropping_a_reader_partway_stops_its_thread_without_waiting_for_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![b'x'; 6 * CHUNK]).unwrap();
        let mut ahead = ReadAhead::open(&path).unwrap();
        assert_eq!(ahead.fill_buf().unwrap().len(), CHUNK);
        // The drop joins the thread, which is blocked sending a chunk ahead:
        // it must return, not wait for the file's end or forever.
        let (done, dropped) = sync_channel(1);
        std::thread::spawn(move || {
            drop(ahead);
            done.send(()).unwrap();
        });
        dropped.recv_timeout(std::time::Duration::from_secs(10)).expect("the drop returned");
    }
}
