//! Streaming JSON Lines: a reader that names the file and line of every error,
//! and a writer.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A line that does not follow the format, or a file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{}:{line}: {message}", file.display())]
    Line { file: PathBuf, line: u64, message: String },
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl FormatError {
    pub fn line(file: &Path, line: u64, message: impl Into<String>) -> Self {
        FormatError::Line { file: file.to_owned(), line, message: message.into() }
    }
}

/// What the reader yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Line<T> {
    /// A parsed line with its 1-based line number.
    Item { line: u64, value: T },
    /// The last line of the file has no newline and is not a complete JSON
    /// value: the writer was interrupted mid-line. The reader stops here.
    Truncated { line: u64 },
}

/// Whether a last line without a newline that did not parse was cut off by
/// its writer: true unless it is a complete JSON value (a complete line that
/// breaks the format is an error, not truncation).
pub fn is_cut_off(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err()
}

/// Reads one JSON value a line. Blank lines are skipped.
#[derive(Debug)]
pub struct JsonlReader<R, T> {
    inner: R,
    file: PathBuf,
    line: u64,
    /// A line that did not fit in what the reader had buffered, copied.
    buf: Vec<u8>,
    /// Bytes of the reader's buffer lent out as the last line, consumed on the
    /// next call.
    lent: usize,
    done: bool,
    _item: std::marker::PhantomData<fn() -> T>,
}

impl<R: BufRead, T> JsonlReader<R, T> {
    /// `file` is only used to name the source in errors.
    pub fn new(inner: R, file: impl Into<PathBuf>) -> Self {
        JsonlReader {
            inner,
            file: file.into(),
            line: 0,
            // Lines of a history are short; this avoids regrowing for most of them.
            buf: Vec::with_capacity(512),
            lent: 0,
            done: false,
            _item: std::marker::PhantomData,
        }
    }

    pub fn file(&self) -> &Path {
        &self.file
    }
}

impl<T> JsonlReader<std::io::BufReader<std::fs::File>, T> {
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let file = std::fs::File::open(path).map_err(|source| FormatError::Io { file: path.to_owned(), source })?;
        // A large buffer: histories are read front to back once.
        let reader = std::io::BufReader::with_capacity(1 << 20, file);
        Ok(JsonlReader::new(reader, path))
    }
}

/// One line as bytes, for readers that parse into borrowed types.
#[derive(Debug, Clone, Copy)]
pub struct RawLine<'a> {
    /// 1-based.
    pub line: u64,
    pub bytes: &'a [u8],
    /// False for a last line without a newline: if it does not parse and is
    /// not a complete JSON value ([`is_cut_off`]), the writer was cut off,
    /// which is truncation rather than an error.
    pub complete: bool,
}

impl<R: BufRead, T> JsonlReader<R, T> {
    /// The next non-blank line: borrowed from the reader's buffer when it lies
    /// whole inside it (no copy), else copied out.
    pub fn next_raw(&mut self) -> Option<Result<RawLine<'_>, FormatError>> {
        self.inner.consume(std::mem::take(&mut self.lent));
        while !self.done {
            let io = |file: &Path, source| Some(Err(FormatError::Io { file: file.to_owned(), source }));
            let available = match self.inner.fill_buf() {
                Ok(available) => available,
                Err(source) => {
                    self.done = true;
                    return io(&self.file, source);
                }
            };
            if available.is_empty() {
                self.done = true;
                return None;
            }
            self.line += 1;
            if let Some(newline) = memchr::memchr(b'\n', available) {
                let len = newline + 1;
                if available[..len].iter().all(u8::is_ascii_whitespace) {
                    self.inner.consume(len);
                    continue;
                }
                self.lent = len;
                let bytes = &self.inner.fill_buf().expect("buffered above")[..len];
                return Some(Ok(RawLine { line: self.line, bytes, complete: true }));
            }
            // The line runs past the buffered bytes (or is the last, without a newline).
            self.buf.clear();
            if let Err(source) = self.inner.read_until(b'\n', &mut self.buf) {
                self.done = true;
                return io(&self.file, source);
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let complete = self.buf.last() == Some(&b'\n');
            return Some(Ok(RawLine { line: self.line, bytes: &self.buf, complete }));
        }
        None
    }

    /// Stops reading (after an error or truncation).
    pub fn stop(&mut self) {
        self.done = true;
    }
}

impl<R: BufRead, T: DeserializeOwned> Iterator for JsonlReader<R, T> {
    type Item = Result<Line<T>, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        let file = self.file.clone();
        let raw = match self.next_raw()? {
            Ok(raw) => raw,
            Err(e) => return Some(Err(e)),
        };
        let (line, cut) = (raw.line, !raw.complete && is_cut_off(raw.bytes));
        let parsed = serde_json::from_slice::<T>(raw.bytes);
        Some(match parsed {
            Ok(value) => Ok(Line::Item { line, value }),
            Err(_) if cut => {
                self.stop();
                Ok(Line::Truncated { line })
            }
            Err(e) => {
                self.stop();
                Err(FormatError::line(&file, line, e.to_string()))
            }
        })
    }
}

/// Writes one JSON value a line.
#[derive(Debug)]
pub struct JsonlWriter<W> {
    inner: W,
}

impl<W: Write> JsonlWriter<W> {
    pub fn new(inner: W) -> Self {
        JsonlWriter { inner }
    }

    pub fn write<T: Serialize>(&mut self, value: &T) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.inner, value)?;
        self.inner.write_all(b"\n")
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Vec<Result<Line<serde_json::Value>, String>> {
        JsonlReader::new(text.as_bytes(), "t.jsonl").map(|r| r.map_err(|e| e.to_string())).collect()
    }

    #[test]
    fn numbers_lines_and_skips_blank_ones() {
        let got = read("{\"a\":1}\n\n{\"a\":2}\n");
        assert_eq!(got.len(), 2);
        assert!(matches!(got[1], Ok(Line::Item { line: 3, .. })));
    }

    #[test]
    fn last_line_without_newline_still_counts_when_it_parses() {
        let got = read("{\"a\":1}\n{\"a\":2}");
        assert!(matches!(got[1], Ok(Line::Item { line: 2, .. })));
    }

    #[test]
    fn a_cut_last_line_is_truncation_not_an_error() {
        let got = read("{\"a\":1}\n{\"a\":");
        assert_eq!(got[1], Ok(Line::Truncated { line: 2 }));
    }

    #[test]
    fn a_whole_last_line_without_newline_that_breaks_the_format_is_an_error() {
        let got: Vec<_> = JsonlReader::<_, Vec<u8>>::new("[1]\n{\"a\":2}".as_bytes(), "t.jsonl")
            .map(|r| r.map_err(|e| e.to_string()))
            .collect();
        let err = got[1].clone().unwrap_err();
        assert!(err.starts_with("t.jsonl:2:"), "{err}");
    }

    #[test]
    fn a_bad_complete_line_names_file_and_line() {
        let got = read("{\"a\":1}\nnot json\n{\"a\":3}\n");
        let err = got[1].clone().unwrap_err();
        assert!(err.starts_with("t.jsonl:2:"), "{err}");
        assert_eq!(got.len(), 2, "the reader stops at the first error");
    }

    #[test]
    fn writer_writes_one_value_a_line() {
        let mut w = JsonlWriter::new(Vec::new());
        w.write(&serde_json::json!({"a": 1})).unwrap();
        w.write(&serde_json::json!({"b": 2})).unwrap();
        assert_eq!(String::from_utf8(w.into_inner()).unwrap(), "{\"a\":1}\n{\"b\":2}\n");
    }
}
