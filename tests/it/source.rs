//! Reading the workspace's Rust source for the tests that hold architecture
//! invariants (`store_boundary`, `invariants`): the files, their string
//! literals, and their code with the comments taken out. A lexer, not a
//! parser: it knows comments, strings (raw, byte, C), chars and lifetimes,
//! which is all a scan for words needs.

use std::path::{Path, PathBuf};

/// Directory levels below the workspace root: the deepest source file is four
/// levels down (`services/api/tests/it/x.rs`); 16 stops a symlink loop.
const DEPTH_MAX: usize = 16;

/// A string literal: the line it starts on and its text, with escapes turned
/// into spaces (an escaped newline stays a newline, so lines still count).
#[derive(Debug, PartialEq)]
pub struct Literal {
    pub line: usize,
    pub text: String,
    /// Where the text stands in the source, quotes and hashes excluded.
    pub span: std::ops::Range<usize>,
}

/// A source file cut into what the scans read: its string literals, and the
/// byte ranges of its comments (doc comments too).
#[derive(Debug, Default)]
struct Lexed {
    literals: Vec<Literal>,
    comments: Vec<std::ops::Range<usize>>,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// The string literals of a Rust source file, comments skipped.
pub fn string_literals(src: &str) -> Vec<Literal> {
    lex(src).literals
}

/// `src` with every comment blanked out (newlines kept, so lines and byte
/// offsets still count): the code and its literals, not what is said about
/// them.
pub fn without_comments(src: &str) -> String {
    blank(src, lex(src).comments)
}

/// `src` with its comments and the text of its string literals blanked out:
/// the code alone, where a word is a name and not a piece of a message.
pub fn code_only(src: &str) -> String {
    let lexed = lex(src);
    blank(src, lexed.comments.into_iter().chain(lexed.literals.into_iter().map(|l| l.span)))
}

fn blank(src: &str, ranges: impl IntoIterator<Item = std::ops::Range<usize>>) -> String {
    let mut code = src.as_bytes().to_vec();
    for range in ranges {
        for b in &mut code[range] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    String::from_utf8(code).expect("comments and literals start and end on character boundaries")
}

fn lex(src: &str) -> Lexed {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut comments = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < b.len() {
        match b[i] {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let start = i;
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                comments.push(start..i);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let start = i;
                let mut depth = 0;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        line += usize::from(b[i] == b'\n');
                        i += 1;
                    }
                }
                comments.push(start..i.min(b.len()));
            }
            b'"' => i = quoted(b, i + 1, &mut line, &mut out),
            b'\'' => {
                // A char literal, or a lifetime (`'a`), which has no closing quote.
                if b.get(i + 1) == Some(&b'\\') {
                    i += 3;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    let len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                    i += if b.get(i + 1 + len) == Some(&b'\'') { len + 2 } else { 1 };
                }
            }
            c if is_ident(c) => {
                let start = i;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                let word = &src[start..i];
                if matches!(word, "r" | "br" | "cr") && matches!(b.get(i), Some(b'"' | b'#')) {
                    let hashes = b[i..].iter().take_while(|&&c| c == b'#').count();
                    if b.get(i + hashes) != Some(&b'"') {
                        continue; // a raw identifier, r#type
                    }
                    let body = i + hashes + 1;
                    let mut close = b"\"".to_vec();
                    close.extend(std::iter::repeat_n(b'#', hashes));
                    let end = b[body..].windows(close.len()).position(|w| w == close).map_or(b.len(), |p| body + p);
                    let text = src[body..end].to_owned();
                    out.push(Literal { line, text: text.clone(), span: body..end });
                    line += text.matches('\n').count();
                    i = (end + close.len()).min(b.len());
                } else if matches!(word, "b" | "c") && b.get(i) == Some(&b'"') {
                    i = quoted(b, i + 1, &mut line, &mut out);
                }
            }
            _ => i += 1,
        }
    }
    Lexed { literals: out, comments }
}

/// Reads a `"…"` literal whose text starts at `i`; returns the index after it.
fn quoted(b: &[u8], mut i: usize, line: &mut usize, out: &mut Vec<Literal>) -> usize {
    let (start, start_line) = (i, *line);
    let mut text = Vec::new();
    while i < b.len() && b[i] != b'"' {
        match b[i] {
            b'\\' => {
                text.push(b' ');
                let escaped = b.get(i + 1).copied().unwrap_or(b' ');
                text.push(if escaped == b'\n' { b'\n' } else { b' ' });
                *line += usize::from(escaped == b'\n');
                i += 2;
            }
            c => {
                *line += usize::from(c == b'\n');
                text.push(c);
                i += 1;
            }
        }
    }
    let span = start..i.min(b.len());
    out.push(Literal { line: start_line, text: String::from_utf8_lossy(&text).into_owned(), span });
    i + 1
}

/// Every `.rs` file under `dir`, skipping build output, hidden directories and
/// the paths in `skip`.
pub fn rust_files(dir: &Path, skip: &[PathBuf], depth: usize, out: &mut Vec<PathBuf>) {
    assert!(depth < DEPTH_MAX, "{} is nested deeper than {DEPTH_MAX} levels", dir.display());
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') || name == "target" || skip.contains(&path) {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, skip, depth + 1, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The workspace root, where the `haunt` package lives.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
