//! A file's lines in chunks, split, checked and parsed ahead of their reader.
//!
//! Checking a long run is folding two files of tens of millions of lines, in
//! order, into one table. Reading the file, finding the line ends, checking
//! the UTF-8 and reading each line through the fast path ([`crate::fast`])
//! need nothing from that table, and they were more than half of the folding
//! thread's time. [`ParseAhead`] does them on a thread of its own, a few
//! chunks ahead: the folding thread is left with the table.
//!
//! A [`Chunk`] holds whole lines only, its text once, and for each non-blank
//! line either what the parser read from it, as offsets into the line
//! ([`Span`]) that the reader turns back into borrowed fields at no cost, or
//! nothing, for the reader to parse the slow way (an escape, an unknown key,
//! a nemesis op, a broken line: whatever the fast path leaves to serde). The
//! lines are numbered, blank lines skipped and a last line without a newline
//! marked, exactly as [`crate::JsonlReader::next_raw`] does, so an error
//! names the same line either way.
//!
//! [`Splitter`] is the splitting itself, which also runs without a thread
//! over any reader (for a history given as a stream).

use std::io::Read;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use crate::jsonl::RawLine;

/// The bytes read at once, about: a chunk is this much and the end of the
/// line it cut (a line longer than a chunk makes the chunk grow to hold it).
/// 512 KiB and 4 MiB checked 20 M ops equally fast (three runs each,
/// alternating, 2026-12-06); the smaller holds less memory.
const CHUNK: usize = 512 << 10;
/// Chunks parsed but not yet taken, at most: enough to keep the folding
/// thread fed across the parser's uneven pace, few enough to keep the memory
/// of a check independent of its files' size.
const AHEAD: usize = 4;

/// A part of a line, as offsets into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    start: u32,
    end: u32,
}

impl Span {
    /// Where `part`, a slice of `line`, lies in it; `None` when it is not a
    /// slice of it (an owned string) or the line is too long for the offsets.
    pub fn of(line: &str, part: &str) -> Option<Span> {
        let start = (part.as_ptr() as usize).checked_sub(line.as_ptr() as usize)?;
        let end = start + part.len();
        (end <= line.len()).then_some(())?;
        Some(Span { start: u32::try_from(start).ok()?, end: u32::try_from(end).ok()? })
    }

    /// The part of `line` this span was taken from.
    pub fn get<'a>(&self, line: &'a str) -> &'a str {
        &line[self.start as usize..self.end as usize]
    }
}

/// One non-blank line of a chunk.
#[derive(Debug)]
enum Entry<P> {
    /// Read by the parser.
    Parsed { line: u64, start: usize, end: usize, parsed: P },
    /// Left for the reader to parse.
    Raw { line: u64, start: usize, end: usize, complete: bool },
}

/// A chunk's text: checked as UTF-8 once, as a whole, or not UTF-8 (then
/// every line of it is left raw, and the reader's own check names the line).
#[derive(Debug)]
enum Text {
    Checked(String),
    Unchecked(Vec<u8>),
}

impl Text {
    fn bytes(&self) -> &[u8] {
        match self {
            Text::Checked(s) => s.as_bytes(),
            Text::Unchecked(b) => b,
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        match self {
            Text::Checked(s) => s.into_bytes(),
            Text::Unchecked(b) => b,
        }
    }
}

/// Whole lines of a file; see the module's doc.
#[derive(Debug)]
pub struct Chunk<P> {
    text: Text,
    entries: Vec<Entry<P>>,
}

/// A line of a chunk, as its reader sees it.
#[derive(Debug)]
pub enum Item<'c, P> {
    /// A line the parser read: its number, its text and what was read.
    Parsed { line: u64, text: &'c str, parsed: &'c P },
    /// A line to parse the slow way.
    Raw(RawLine<'c>),
}

impl<P> Chunk<P> {
    /// The chunk's lines, in order.
    pub fn items(&self) -> impl Iterator<Item = Item<'_, P>> {
        self.entries.iter().map(|entry| match *entry {
            Entry::Parsed { line, start, end, ref parsed } => {
                let Text::Checked(text) = &self.text else { unreachable!("only a checked chunk's lines are parsed") };
                Item::Parsed { line, text: &text[start..end], parsed }
            }
            Entry::Raw { line, start, end, complete } => {
                Item::Raw(RawLine { line, bytes: &self.text.bytes()[start..end], complete })
            }
        })
    }
}

/// Splits a reader's bytes into chunks of whole lines and parses each line
/// with `parse`; see the module's doc.
#[derive(Debug)]
pub struct Splitter<R, P> {
    source: R,
    parse: fn(&str) -> Option<P>,
    /// The last line's number.
    line: u64,
    /// The start of a line the last chunk cut, for the next one.
    carry: Vec<u8>,
    end: bool,
    /// A read that failed after whole lines: they come first, then this.
    failed: Option<std::io::Error>,
}

impl<R: Read, P> Splitter<R, P> {
    pub fn new(source: R, parse: fn(&str) -> Option<P>) -> Self {
        Splitter { source, parse, line: 0, carry: Vec::new(), end: false, failed: None }
    }

    /// The next chunk, or `None` at the file's end. `spent` is a chunk the
    /// reader is done with, whose memory is reused.
    pub fn next_chunk(&mut self, spent: Option<Chunk<P>>) -> std::io::Result<Option<Chunk<P>>> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let (mut buf, mut entries) = match spent {
            Some(chunk) => (chunk.text.into_bytes(), chunk.entries),
            None => (Vec::with_capacity(CHUNK + CHUNK / 4), Vec::new()),
        };
        buf.clear();
        entries.clear();
        buf.append(&mut self.carry);
        // Fill to a chunk, then cut after its last newline; without one, the
        // line is longer than a chunk, and the chunk grows to hold it.
        let mut size = CHUNK.max(buf.len() * 2);
        let mut searched = 0;
        let whole = loop {
            if !self.end {
                let want = size.saturating_sub(buf.len());
                // Into the vector's spare room, without zeroing it first; what
                // a failed read got before its error is in it too.
                match (&mut self.source).take(want as u64).read_to_end(&mut buf) {
                    Ok(read) => self.end = read < want,
                    Err(e) => {
                        // The whole lines read before the error are folded
                        // first, as a line reader would: one of them may be
                        // the error to report.
                        let Some(last) = memchr::memrchr(b'\n', &buf) else { return Err(e) };
                        self.failed = Some(e);
                        break last + 1;
                    }
                }
            }
            if self.end {
                break buf.len();
            }
            if let Some(last) = memchr::memrchr(b'\n', &buf[searched..]) {
                break searched + last + 1;
            }
            searched = buf.len();
            size *= 2;
        };
        if whole == 0 {
            return Ok(None);
        }
        self.carry.extend_from_slice(&buf[whole..]);
        buf.truncate(whole);
        let text = match String::from_utf8(buf) {
            Ok(text) => Text::Checked(text),
            Err(e) => Text::Unchecked(e.into_bytes()),
        };
        let bytes = text.bytes();
        let mut start = 0;
        while start < bytes.len() {
            let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |n| start + n + 1);
            self.line += 1;
            let line = self.line;
            if !bytes[start..end].iter().all(u8::is_ascii_whitespace) {
                let parsed = match &text {
                    Text::Checked(text) => (self.parse)(&text[start..end]),
                    Text::Unchecked(_) => None,
                };
                entries.push(match parsed {
                    Some(parsed) => Entry::Parsed { line, start, end, parsed },
                    None => Entry::Raw { line, start, end, complete: bytes[end - 1] == b'\n' },
                });
            }
            start = end;
        }
        Ok(Some(Chunk { text, entries }))
    }
}

/// A file's chunks, split and parsed by a thread of its own; see the module's
/// doc. The thread ends at the end of the file, on an error (which the reader
/// then gets), or when this is dropped.
#[derive(Debug)]
pub struct ParseAhead<P> {
    /// `None` once dropped, which tells the thread to stop.
    chunks: Option<Receiver<std::io::Result<Chunk<P>>>>,
    spent: SyncSender<Chunk<P>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<P: Send + 'static> ParseAhead<P> {
    pub fn open(path: &Path, parse: fn(&str) -> Option<P>) -> std::io::Result<Self> {
        let file = std::fs::File::open(path)?;
        let (send, chunks) = sync_channel(AHEAD);
        let (spent, returned) = sync_channel::<Chunk<P>>(AHEAD + 2);
        let thread = std::thread::Builder::new().name("haunt-parse-ahead".into()).spawn(move || {
            let mut splitter = Splitter::new(file, parse);
            loop {
                let next = splitter.next_chunk(returned.try_recv().ok());
                let end = !matches!(next, Ok(Some(_)));
                let next = next.transpose();
                if next.is_some_and(|next| send.send(next).is_err()) || end {
                    return;
                }
            }
        })?;
        Ok(ParseAhead { chunks: Some(chunks), spent, thread: Some(thread) })
    }
}

impl<P> ParseAhead<P> {
    /// The next chunk, `None` after the last.
    pub fn next_chunk(&mut self) -> Option<std::io::Result<Chunk<P>>> {
        match self.chunks.as_ref().expect("taken only on drop").recv() {
            Ok(next) => Some(next),
            Err(_) => {
                // The thread has ended: at the file's end, or by a panic,
                // which is a bug of the parser and must not read as the end
                // of the file (the fold would judge half a run).
                if let Some(thread) = self.thread.take()
                    && let Err(panic) = thread.join()
                {
                    std::panic::resume_unwind(panic);
                }
                None
            }
        }
    }

    /// Hands a chunk back once read, for its memory to be reused.
    pub fn give_back(&self, chunk: Chunk<P>) {
        let _ = self.spent.try_send(chunk);
    }
}

impl<P> Drop for ParseAhead<P> {
    /// Stops the thread and waits for it: its next send fails, after one
    /// more chunk at most.
    fn drop(&mut self) {
        self.chunks.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Chunks from a thread reading ahead or split on the reader's own thread.
#[derive(Debug)]
pub enum Chunks<R, P> {
    Ahead(ParseAhead<P>),
    Inline(Splitter<R, P>, Option<Chunk<P>>),
}

impl<R: Read, P> Chunks<R, P> {
    /// The next chunk, `None` after the last.
    pub fn next_chunk(&mut self) -> Option<std::io::Result<Chunk<P>>> {
        match self {
            Chunks::Ahead(ahead) => ahead.next_chunk(),
            Chunks::Inline(splitter, spent) => splitter.next_chunk(spent.take()).transpose(),
        }
    }

    /// Hands a chunk back once read, for its memory to be reused.
    pub fn give_back(&mut self, chunk: Chunk<P>) {
        match self {
            Chunks::Ahead(ahead) => ahead.give_back(chunk),
            Chunks::Inline(_, spent) => *spent = Some(chunk),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JsonlReader;

    /// A parser that reads lines starting with `{"n":`, and leaves the others.
    fn number(line: &str) -> Option<Span> {
        let rest = line.strip_prefix("{\"n\":")?;
        let digits = &rest[..rest.find('}')?];
        Span::of(line, digits)
    }

    /// What a splitter gives for `text`, line by line, as the reader would
    /// see it: (line, parsed text or raw bytes, complete).
    fn split(text: &[u8]) -> Vec<(u64, String, bool)> {
        let mut chunks = Chunks::<_, Span>::Inline(Splitter::new(text, number), None);
        let mut seen = Vec::new();
        while let Some(chunk) = chunks.next_chunk() {
            let chunk = chunk.unwrap();
            for item in chunk.items() {
                seen.push(match item {
                    Item::Parsed { line, text, parsed } => (line, format!("n={}", parsed.get(text)), true),
                    Item::Raw(raw) => as_reader_sees(raw),
                });
            }
            chunks.give_back(chunk);
        }
        seen
    }

    /// What the line reader gives for `text`, in the same form.
    fn read(text: &[u8]) -> Vec<(u64, String, bool)> {
        let mut reader = JsonlReader::<_, ()>::new(text, "t");
        let mut seen = Vec::new();
        while let Some(raw) = reader.next_raw() {
            seen.push(as_reader_sees(raw.unwrap()));
        }
        seen
    }

    /// A raw line as the fold takes it: parsed when it is UTF-8 and parses.
    fn as_reader_sees(raw: RawLine<'_>) -> (u64, String, bool) {
        let text = std::str::from_utf8(raw.bytes).ok();
        match text.and_then(|t| number(t).map(|s| s.get(t))) {
            Some(n) => (raw.line, format!("n={n}"), true),
            None => (raw.line, String::from_utf8_lossy(raw.bytes).into_owned(), raw.complete),
        }
    }

    #[test]
    fn it_numbers_skips_and_marks_lines_as_the_line_reader_does() {
        let cases: [&[u8]; 7] = [
            b"{\"n\":1}\n\n  \n{\"x\":2}\n{\"n\":3}\n",
            b"{\"n\":1}\n{\"n\":2}",
            b"{\"n\":1}\n{\"n\":",
            b"",
            b"\n\n",
            b"{\"n\":1}\n\xff\xfe\n{\"n\":3}\n",
            b"   {\"n\":1}\n",
        ];
        for text in cases {
            assert_eq!(split(text), read(text), "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn lines_across_chunks_and_longer_than_a_chunk_come_whole() {
        let mut text = Vec::new();
        for i in 0..600_000 {
            text.extend_from_slice(format!("{{\"n\":{i}}}\n").as_bytes());
            if i == 300_000 {
                // A raw line of three chunks.
                text.extend_from_slice(b"{\"x\":\"");
                text.extend(std::iter::repeat_n(b'a', 3 * CHUNK));
                text.extend_from_slice(b"\"}\n");
            }
        }
        let got = split(&text);
        assert_eq!(got.len(), 600_001);
        assert_eq!(got, read(&text));
        assert_eq!(got[300_001].1.len(), 3 * CHUNK + 9);
        assert_eq!(got[600_000], (600_001, "n=599999".to_owned(), true));
    }

    #[test]
    fn a_file_read_ahead_gives_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let text: String = (0..1_700_000).map(|i| format!("{{\"n\":{i}}}\n")).collect();
        std::fs::write(&path, &text).unwrap();
        let mut ahead = ParseAhead::open(&path, number).unwrap();
        let (mut lines, mut sum) = (0u64, 0u64);
        while let Some(chunk) = ahead.next_chunk() {
            let chunk = chunk.unwrap();
            for item in chunk.items() {
                let Item::Parsed { line, text, parsed } = item else { panic!("every line parses") };
                lines += 1;
                assert_eq!(line, lines);
                sum += parsed.get(text).parse::<u64>().unwrap();
            }
            ahead.give_back(chunk);
        }
        assert_eq!(lines, 1_700_000);
        assert_eq!(sum, (0..1_700_000u64).sum::<u64>());
    }

    #[test]
    fn dropping_a_reader_partway_stops_its_thread_without_waiting_for_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"{\"n\":1}\n".repeat(6 * CHUNK / 8)).unwrap();
        let mut ahead = ParseAhead::open(&path, number).unwrap();
        assert!(ahead.next_chunk().unwrap().is_ok());
        // The drop joins the thread, which is blocked sending a chunk ahead:
        // it must return, not wait for the file's end or forever.
        let (done, dropped) = sync_channel(1);
        std::thread::spawn(move || {
            drop(ahead);
            done.send(()).unwrap();
        });
        dropped.recv_timeout(std::time::Duration::from_secs(10)).expect("the drop returned");
    }

    /// Gives `text`, then fails.
    struct FailsAfter<'a>(&'a [u8]);

    impl Read for FailsAfter<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Err(std::io::Error::other("the disk is gone"));
            }
            let n = self.0.len().min(out.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn the_whole_lines_read_before_a_failed_read_come_before_its_error() {
        let mut splitter = Splitter::new(FailsAfter(b"{\"n\":1}\nnot json\n{\"n\""), number);
        let chunk = splitter.next_chunk(None).unwrap().expect("the lines before the error");
        let got: Vec<_> = chunk.items().map(|i| matches!(i, Item::Parsed { .. })).collect();
        assert_eq!(got, [true, false]);
        let err = splitter.next_chunk(Some(chunk)).expect_err("then the error");
        assert_eq!(err.to_string(), "the disk is gone");
        // Nothing whole before it: the error at once.
        assert!(Splitter::new(FailsAfter(b"{\"n\""), number).next_chunk(None).is_err());
    }

    #[test]
    fn a_panic_of_the_parsing_thread_is_not_the_end_of_the_file() {
        fn panics(_: &str) -> Option<()> {
            panic!("a parser's bug")
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "{}\n").unwrap();
        let mut ahead = ParseAhead::open(&path, panics).unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ahead.next_chunk().is_none()));
        let message = caught.expect_err("the panic comes to the reader");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"a parser's bug"));
    }

    #[test]
    fn a_span_is_only_of_a_slice_of_its_line() {
        let line = "{\"n\":12}";
        assert_eq!(Span::of(line, &line[5..7]).map(|s| s.get(line)), Some("12"));
        assert_eq!(Span::of(line, &String::from("12")), None);
    }
}
