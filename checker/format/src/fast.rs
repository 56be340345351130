//! A fast path for the lines a long run is made of: client `order` ops and
//! final-state lines with plain strings and integers.
//!
//! It accepts only what serde accepts, with the same result: strings without
//! escapes, integers without fraction or exponent, each known key at most once.
//! Anything else (an escape, an unknown key, a nemesis op, a malformed line)
//! answers `None`, and the caller parses the line with serde, which also words
//! the errors. The tests below hold the two paths to the same answers.

use std::borrow::Cow;

use crate::chunks::Span;
use crate::final_state::FinalRef;
use crate::history::{OpRef, OpType, OrderRef, Process};

/// The bytes that end a plain string: its closing quote, or what makes it not
/// plain (an escape, a control character).
const STRING_STOP: [bool; 256] = {
    let mut stop = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        stop[c] = true;
        c += 1;
    }
    stop[b'"' as usize] = true;
    stop[b'\\' as usize] = true;
    stop
};

/// A cursor over one line's text.
struct Scan<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scan<'a> {
    fn new(text: &'a str) -> Self {
        Scan { text, at: 0 }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn skip_ws(&mut self) {
        let b = self.bytes();
        while self.at < b.len() && matches!(b[self.at], b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.bytes().get(self.at).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.at += 1)
    }

    /// A string without escapes or control characters, borrowed.
    #[inline]
    fn str(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let b = self.bytes();
        let start = self.at;
        let mut end = start;
        while !STRING_STOP[usize::from(*b.get(end)?)] {
            end += 1;
        }
        (b[end] == b'"').then_some(())?;
        self.at = end + 1;
        // Both ends sit on ASCII bytes of valid UTF-8: char boundaries.
        Some(&self.text[start..end])
    }

    /// The digits of a non-negative integer as JSON writes it (no leading zero,
    /// no fraction, no exponent).
    fn digits(&mut self) -> Option<u64> {
        let b = self.bytes();
        let start = self.at;
        let mut n: u64 = 0;
        while let Some(&c) = b.get(self.at) {
            if !c.is_ascii_digit() {
                break;
            }
            n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.at += 1;
        }
        let len = self.at - start;
        if len == 0 || (len > 1 && b[start] == b'0') || matches!(b.get(self.at), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(n)
    }

    fn u64(&mut self) -> Option<u64> {
        self.skip_ws();
        self.digits()
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u64()?).ok()
    }

    fn i64(&mut self) -> Option<i64> {
        if self.peek()? == b'-' {
            self.at += 1;
            let n = self.digits()?;
            // -0 and i64::MIN are left to serde.
            return (n != 0 && n < 1 << 63).then(|| -(n as i64));
        }
        i64::try_from(self.digits()?).ok()
    }

    fn bool(&mut self) -> Option<bool> {
        self.skip_ws();
        let rest = &self.bytes()[self.at..];
        let (value, len) = if rest.starts_with(b"true") {
            (true, 4)
        } else if rest.starts_with(b"false") {
            (false, 5)
        } else {
            return None;
        };
        self.at += len;
        Some(value)
    }

    /// `null` (an absent optional field, as serde reads it) or the value.
    fn nullable<T>(&mut self, value: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        self.skip_ws();
        if self.bytes()[self.at..].starts_with(b"null") {
            self.at += 4;
            return Some(None);
        }
        value(self).map(Some)
    }

    /// A plain string or `null`, as an optional field.
    fn nullable_str(&mut self) -> Option<Option<Cow<'a, str>>> {
        self.nullable(|s| s.str().map(borrowed))
    }

    /// An object whose every key `field` knows; `field` answers the key's bit
    /// (each key at most once) after reading its value.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<u32>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        let mut seen = 0u32;
        loop {
            let key = self.str()?;
            self.eat(b':')?;
            let bit = field(self, key)?;
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// These exact bytes next (no whitespace skipped). A fixed length compiles
    /// to a few loads and compares, not a call to memcmp.
    #[inline(always)]
    fn lit<const N: usize>(&mut self, expected: &[u8; N]) -> Option<()> {
        let next = self.bytes().get(self.at..self.at + N)?;
        (next == expected).then(|| self.at += N)
    }

    /// Only whitespace left.
    fn end(&mut self) -> Option<()> {
        self.skip_ws();
        (self.at == self.text.len()).then_some(())
    }
}

fn borrowed(s: &str) -> Cow<'_, str> {
    Cow::Borrowed(s)
}

/// The value of a client `order` op.
fn order_value<'a>(scan: &mut Scan<'a>) -> Option<OrderRef<'a>> {
    let mut v = OrderRef { order_id: None, item_id: None, qty: None, event_id: None };
    scan.object(|s, key| {
        Some(match key {
            "order_id" => {
                v.order_id = s.nullable_str()?;
                1
            }
            "item_id" => {
                v.item_id = s.nullable_str()?;
                2
            }
            "qty" => {
                v.qty = s.nullable(Scan::i64)?;
                4
            }
            "event_id" => {
                v.event_id = s.nullable_str()?;
                8
            }
            _ => return None,
        })
    })?;
    Some(v)
}

fn op_type(word: &str) -> Option<OpType> {
    Some(match word {
        "invoke" => OpType::Invoke,
        "ok" => OpType::Ok,
        "fail" => OpType::Fail,
        "info" => OpType::Info,
        _ => return None,
    })
}

/// A client `order` op with its value already read, or `None` for serde.
#[inline]
pub fn client_order_op(line: &str) -> Option<(OpRef<'_>, OrderRef<'_>)> {
    as_haunt_writes_it(line).or_else(|| any_key_order(line))
}

/// The layout haunt's recorder writes (keys in its order, no whitespace, the
/// order's three fields on every op), matched literally: no key is scanned.
#[inline]
fn as_haunt_writes_it(line: &str) -> Option<(OpRef<'_>, OrderRef<'_>)> {
    let mut s = Scan::new(line);
    s.lit(br#"{"index":"#)?;
    let index = s.digits()?;
    s.lit(br#","time_ns":"#)?;
    let time_ns = s.digits()?;
    s.lit(br#","process":"#)?;
    let process = s.digits()?;
    s.lit(br#","type":"#)?;
    let kind = op_type(s.str()?)?;
    s.lit(br#","f":"order","value":"#)?;
    let start = s.at;
    s.lit(br#"{"order_id":"#)?;
    let order_id = s.str()?;
    s.lit(br#","item_id":"#)?;
    let item_id = s.str()?;
    s.lit(br#","qty":"#)?;
    let qty = s.i64()?;
    let event_id = match s.lit(br#","event_id":"#) {
        Some(()) => Some(s.str()?),
        None => None,
    };
    s.lit(b"}")?;
    let value = &line[start..s.at];
    let correlation_id = match s.lit(br#","correlation_id":"#) {
        Some(()) => Some(s.str()?),
        None => None,
    };
    let error = match s.lit(br#","error":"#) {
        Some(()) => Some(s.str()?),
        None => None,
    };
    s.lit(b"}")?;
    s.end()?;
    let op = OpRef {
        index,
        time_ns,
        process: Process::Client(process),
        kind,
        f: borrowed("order"),
        value,
        correlation_id: correlation_id.map(borrowed),
        error: error.map(borrowed),
    };
    let order = OrderRef {
        order_id: Some(borrowed(order_id)),
        item_id: Some(borrowed(item_id)),
        qty: Some(qty),
        event_id: event_id.map(borrowed),
    };
    Some((op, order))
}

/// Any key order and spacing, each known key at most once.
fn any_key_order(line: &str) -> Option<(OpRef<'_>, OrderRef<'_>)> {
    let mut scan = Scan::new(line);
    let (mut index, mut time_ns, mut process, mut kind, mut f) = (None, None, None, None, None);
    let (mut value, mut order, mut correlation_id, mut error) = (None, None, None, None);
    scan.object(|s, key| {
        Some(match key {
            "index" => {
                index = Some(s.u64()?);
                1
            }
            "time_ns" => {
                time_ns = Some(s.u64()?);
                2
            }
            "process" => {
                process = Some(Process::Client(s.u64()?));
                4
            }
            "type" => {
                kind = Some(op_type(s.str()?)?);
                8
            }
            "f" => {
                f = Some(s.str()?);
                16
            }
            "value" => {
                s.skip_ws();
                let start = s.at;
                order = Some(order_value(s)?);
                value = Some(&s.text[start..s.at]);
                32
            }
            "correlation_id" => {
                correlation_id = s.nullable_str()?;
                64
            }
            "error" => {
                error = s.nullable_str()?;
                128
            }
            _ => return None,
        })
    })?;
    scan.end()?;
    let f = f.filter(|&f| f == "order")?;
    let op = OpRef {
        index: index?,
        time_ns: time_ns?,
        process: process?,
        kind: kind?,
        f: borrowed(f),
        value: value?,
        correlation_id,
        error,
    };
    let order = order?;
    if op.kind == OpType::Invoke && (order.order_id.is_none() || order.item_id.is_none() || order.qty.is_none()) {
        // serde words the missing field.
        return None;
    }
    Some((op, order))
}

/// A final-state line, or `None` for serde.
#[inline]
pub fn final_line(line: &str) -> Option<FinalRef<'_>> {
    final_row_as_haunt_writes_it(line).or_else(|| final_line_any_key_order(line))
}

/// The `order` and `applied` lines as haunt's store writes them, matched
/// literally.
#[inline]
fn final_row_as_haunt_writes_it(line: &str) -> Option<FinalRef<'_>> {
    let mut s = Scan::new(line);
    let mut l = FinalRef::default();
    if s.lit(br#"{"kind":"order","order_id":"#).is_some() {
        l.kind = borrowed("order");
        l.order_id = Some(borrowed(s.str()?));
        s.lit(br#","item_id":"#)?;
        l.item_id = Some(borrowed(s.str()?));
        s.lit(br#","qty":"#)?;
        l.qty = Some(s.i64()?);
        s.lit(br#","event_id":"#)?;
        l.event_id = Some(borrowed(s.str()?));
        // The delivery evidence, when the writer has it.
        if s.lit(br#","deliveries":"#).is_some() {
            l.deliveries = Some(s.u32()?);
        }
        if s.lit(br#","duplicates_absorbed":"#).is_some() {
            l.duplicates_absorbed = Some(s.u32()?);
        }
    } else {
        s.lit(br#"{"kind":"applied","event_id":"#)?;
        l.kind = borrowed("applied");
        l.event_id = Some(borrowed(s.str()?));
        s.lit(br#","order_id":"#)?;
        l.order_id = Some(borrowed(s.str()?));
        s.lit(br#","item_id":"#)?;
        l.item_id = Some(borrowed(s.str()?));
        s.lit(br#","qty":"#)?;
        l.qty = Some(s.i64()?);
        s.lit(br#","delivery_attempt":"#)?;
        l.delivery_attempt = Some(s.u32()?);
        s.lit(br#","worker_id":"#)?;
        l.worker_id = Some(borrowed(s.str()?));
        s.lit(br#","applied_at_ms":"#)?;
        l.applied_at_ms = Some(s.i64()?);
        // The order evidence, when the writer has it.
        if s.lit(br#","key_seq":"#).is_some() {
            l.key_seq = Some(s.u64()?);
        }
        if s.lit(br#","publish_seq":"#).is_some() {
            l.publish_seq = Some(s.i64()?);
        }
    }
    s.lit(b"}")?;
    s.end()?;
    Some(l)
}

/// Any key order and spacing, each known key at most once.
fn final_line_any_key_order(line: &str) -> Option<FinalRef<'_>> {
    let mut scan = Scan::new(line);
    let mut l = FinalRef::default();
    let mut kind = None;
    scan.object(|s, key| {
        Some(match key {
            "kind" => {
                kind = Some(s.str()?);
                1
            }
            "order_id" => {
                l.order_id = s.nullable_str()?;
                1 << 1
            }
            "item_id" => {
                l.item_id = s.nullable_str()?;
                1 << 2
            }
            "qty" => {
                l.qty = s.nullable(Scan::i64)?;
                1 << 3
            }
            "event_id" => {
                l.event_id = s.nullable_str()?;
                1 << 4
            }
            "delivery_attempt" => {
                l.delivery_attempt = s.nullable(Scan::u32)?;
                1 << 5
            }
            "worker_id" => {
                l.worker_id = s.nullable_str()?;
                1 << 6
            }
            "applied_at_ms" => {
                l.applied_at_ms = s.nullable(Scan::i64)?;
                1 << 7
            }
            "reserved_qty" => {
                l.reserved_qty = s.nullable(Scan::i64)?;
                1 << 8
            }
            "message_id" => {
                l.message_id = s.nullable_str()?;
                1 << 9
            }
            "delivery_count" => {
                l.delivery_count = s.nullable(Scan::u32)?;
                1 << 10
            }
            "last_error" => {
                l.last_error = s.nullable_str()?;
                1 << 11
            }
            "quiesced" => {
                l.quiesced = s.nullable(Scan::bool)?;
                1 << 12
            }
            "read_at_ns" => {
                l.read_at_ns = s.nullable(Scan::u64)?;
                1 << 13
            }
            "run_started_at_ms" => {
                l.run_started_at_ms = s.nullable(Scan::i64)?;
                1 << 14
            }
            "deliveries" => {
                l.deliveries = s.nullable(Scan::u32)?;
                1 << 15
            }
            "duplicates_absorbed" => {
                l.duplicates_absorbed = s.nullable(Scan::u32)?;
                1 << 16
            }
            "key_seq" => {
                l.key_seq = s.nullable(Scan::u64)?;
                1 << 17
            }
            "publish_seq" => {
                l.publish_seq = s.nullable(Scan::i64)?;
                1 << 18
            }
            _ => return None,
        })
    })?;
    scan.end()?;
    l.kind = borrowed(kind?);
    Some(l)
}

/// A client `order` op as the fast path read it, as offsets into its line:
/// what a thread that parses ahead hands to the fold ([`crate::chunks`]).
#[derive(Debug, Clone)]
pub struct OrderOpSpans {
    index: u64,
    time_ns: u64,
    process: u64,
    kind: OpType,
    value: Span,
    correlation_id: Option<Span>,
    error: Option<Span>,
    order_id: Option<Span>,
    item_id: Option<Span>,
    qty: Option<i64>,
    event_id: Option<Span>,
}

/// Where an optional string lies in `line`: `None` when it is there but not
/// a slice of the line (never, from the fast path, which borrows them all).
fn span_of(line: &str, s: &Option<Cow<'_, str>>) -> Option<Option<Span>> {
    match s {
        None => Some(None),
        Some(s) => Span::of(line, s).map(Some),
    }
}

impl OrderOpSpans {
    /// [`client_order_op`], kept as offsets.
    #[inline]
    pub fn read(line: &str) -> Option<Self> {
        let (op, order) = client_order_op(line)?;
        let Process::Client(process) = op.process else { return None };
        Some(OrderOpSpans {
            index: op.index,
            time_ns: op.time_ns,
            process,
            kind: op.kind,
            value: Span::of(line, op.value)?,
            correlation_id: span_of(line, &op.correlation_id)?,
            error: span_of(line, &op.error)?,
            order_id: span_of(line, &order.order_id)?,
            item_id: span_of(line, &order.item_id)?,
            qty: order.qty,
            event_id: span_of(line, &order.event_id)?,
        })
    }

    /// The order id of an invoke, from `line`, the line it was read from:
    /// what a reader ahead of the fold needs to fetch the order early.
    #[inline]
    pub fn invoked_order_id<'a>(&self, line: &'a str) -> Option<&'a str> {
        (self.kind == OpType::Invoke).then(|| self.order_id.map(|s| s.get(line))).flatten()
    }

    /// The op and its value again, borrowed from `line`, the line it was read from.
    #[inline]
    pub fn get<'a>(&self, line: &'a str) -> (OpRef<'a>, OrderRef<'a>) {
        let s = |span: Option<Span>| span.map(|s| borrowed(s.get(line)));
        let op = OpRef {
            index: self.index,
            time_ns: self.time_ns,
            process: Process::Client(self.process),
            kind: self.kind,
            f: borrowed("order"),
            value: self.value.get(line),
            correlation_id: s(self.correlation_id),
            error: s(self.error),
        };
        let order = OrderRef {
            order_id: s(self.order_id),
            item_id: s(self.item_id),
            qty: self.qty,
            event_id: s(self.event_id),
        };
        (op, order)
    }
}

/// An `order` or `applied` line of the final state (nearly all of a long
/// run's) as the fast path read it, as offsets into its line; see
/// [`OrderOpSpans`]. The few other lines are left to the fold to read.
#[derive(Debug, Clone)]
pub struct FinalSpans {
    applied: bool,
    order_id: Span,
    item_id: Span,
    event_id: Span,
    worker_id: Option<Span>,
    qty: i64,
    delivery_attempt: Option<u32>,
    applied_at_ms: Option<i64>,
    key_seq: Option<u64>,
    publish_seq: Option<i64>,
    deliveries: Option<u32>,
    duplicates_absorbed: Option<u32>,
}

impl FinalSpans {
    /// [`final_line`] for an `order` or `applied` line with the fields every
    /// such line has and no field of the other kinds, kept as offsets;
    /// `None` for any other line.
    #[inline]
    pub fn read(line: &str) -> Option<Self> {
        // Every field named, none left to `..`: a field added to the format
        // must be decided here (carried, or left to the fold) before this
        // compiles again, so that no line loses it on the way.
        let FinalRef {
            kind,
            order_id,
            item_id,
            qty,
            event_id,
            delivery_attempt,
            worker_id,
            applied_at_ms,
            key_seq,
            publish_seq,
            reserved_qty,
            message_id,
            delivery_count,
            last_error,
            quiesced,
            read_at_ns,
            run_started_at_ms,
            ledger,
            unlisted,
            deliveries,
            duplicates_absorbed,
        } = final_line(line)?;
        let applied = match &*kind {
            "order" => false,
            "applied" => true,
            _ => return None,
        };
        let others = (reserved_qty, delivery_count, read_at_ns, run_started_at_ms, unlisted);
        if others != (None, None, None, None, None)
            || (message_id.is_some() || last_error.is_some() || quiesced.is_some() || ledger.is_some())
        {
            return None;
        }
        let span = |s: &Option<Cow<'_, str>>| Span::of(line, s.as_deref()?);
        Some(FinalSpans {
            applied,
            order_id: span(&order_id)?,
            item_id: span(&item_id)?,
            event_id: span(&event_id)?,
            worker_id: span_of(line, &worker_id)?,
            qty: qty?,
            delivery_attempt,
            applied_at_ms,
            key_seq,
            publish_seq,
            deliveries,
            duplicates_absorbed,
        })
    }

    /// The line again, borrowed from `line`, the line it was read from.
    #[inline]
    pub fn get<'a>(&self, line: &'a str) -> FinalRef<'a> {
        let s = |span: Span| Some(borrowed(span.get(line)));
        FinalRef {
            kind: borrowed(if self.applied { "applied" } else { "order" }),
            order_id: s(self.order_id),
            item_id: s(self.item_id),
            event_id: s(self.event_id),
            worker_id: self.worker_id.map(|w| borrowed(w.get(line))),
            qty: Some(self.qty),
            delivery_attempt: self.delivery_attempt,
            applied_at_ms: self.applied_at_ms,
            key_seq: self.key_seq,
            publish_seq: self.publish_seq,
            deliveries: self.deliveries,
            duplicates_absorbed: self.duplicates_absorbed,
            ..FinalRef::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line either takes the fast path with serde's answer, or is left
    /// to serde; the literal layout and the scanner agree where both read.
    fn same_as_serde_op(line: &str) -> bool {
        let Some((op, order)) = client_order_op(line) else { return false };
        let scanned = any_key_order(line).expect("the scanner reads whatever the literal layout reads");
        assert_eq!(format!("{:?}", (&op, &order)), format!("{scanned:?}"), "{line}");
        let slow: OpRef<'_> = serde_json::from_str(line).expect("the fast path accepted what serde rejects");
        let slow_order = slow.order().expect("the fast path accepted an order serde rejects");
        assert_eq!(
            (op.index, op.time_ns, &op.process, op.kind, &*op.f, op.value),
            (slow.index, slow.time_ns, &slow.process, slow.kind, &*slow.f, slow.value),
            "{line}"
        );
        assert_eq!((&op.correlation_id, &op.error), (&slow.correlation_id, &slow.error), "{line}");
        // Kept as offsets by a thread parsing ahead, and read back, it is the same op.
        let spans = OrderOpSpans::read(line).expect("whatever the fast path reads, it reads as offsets");
        assert_eq!(format!("{:?}", spans.get(line)), format!("{:?}", (&op, &order)), "{line}");
        assert_eq!(
            (&order.order_id, &order.item_id, order.qty, &order.event_id),
            (&slow_order.order_id, &slow_order.item_id, slow_order.qty, &slow_order.event_id),
            "{line}"
        );
        true
    }

    #[test]
    fn common_op_lines_take_the_fast_path() {
        for line in [
            r#"{"index":0,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o-1","item_id":"i","qty":1},"correlation_id":"c"}"#,
            r#"{"index":2,"time_ns":130000,"process":1,"type":"ok","f":"order","value":{"order_id":"o-1","item_id":"i","qty":-3,"event_id":"e"}}"#,
            r#" { "value" : { "qty" : 2 , "item_id" : "é", "order_id" : "o" } , "f" : "order", "type" : "fail", "process" : 7, "time_ns" : 9, "index" : 1, "error" : "no" } "#,
            r#"{"index":3,"time_ns":1,"process":2,"type":"info","f":"order","value":{},"correlation_id":null}"#,
            r#"{"index":4,"time_ns":2,"process":2,"type":"info","f":"order","value":{"order_id":"o","item_id":"i","qty":0},"correlation_id":"c","error":"timeout"}"#,
        ] {
            assert!(same_as_serde_op(line), "{line}");
        }
    }

    #[test]
    fn the_recorder_layout_is_read_literally() {
        let line = r#"{"index":2,"time_ns":130000,"process":1,"type":"ok","f":"order","value":{"order_id":"o-1","item_id":"item-14","qty":1,"event_id":"e-o-1"},"correlation_id":"o-1-c"}"#;
        assert!(as_haunt_writes_it(line).is_some());
        assert!(same_as_serde_op(line));
        // One space, and the literal layout gives way to the scanner.
        let spaced = line.replacen(",\"f\"", ", \"f\"", 1);
        assert!(as_haunt_writes_it(&spaced).is_none());
        assert!(same_as_serde_op(&spaced));
    }

    #[test]
    fn anything_unusual_is_left_to_serde() {
        for line in [
            // escapes, unknown keys, duplicates, other numbers, other ops
            r#"{"index":0,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o\"1","item_id":"i","qty":1}}"#,
            r#"{"index":0,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1},"extra":1}"#,
            r#"{"index":0,"index":1,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1}}"#,
            r#"{"index":01,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1}}"#,
            r#"{"index":1.0,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1}}"#,
            r#"{"index":1,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1e2}}"#,
            r#"{"index":1,"time_ns":0,"process":-1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1}}"#,
            r#"{"index":1,"time_ns":0,"process":"w1","type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1}}"#,
            r#"{"index":1,"time_ns":0,"process":"nemesis","type":"info","f":"kill","value":{"target":"api"}}"#,
            r#"{"index":1,"time_ns":0,"process":1,"type":"invoke","f":"read","value":{}}"#,
            r#"{"index":1,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i"}}"#,
            r#"{"index":1,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1},}"#,
            r#"{"index":1,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1}} x"#,
            r#"{"index":1,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1}"#,
            r#"{"index":18446744073709551616,"time_ns":0,"process":1,"type":"invoke","f":"order","value":{"order_id":"o","item_id":"i","qty":1}}"#,
            "{\"index\":1,\"time_ns\":0,\"process\":1,\"type\":\"invoke\",\"f\":\"order\",\"value\":{\"order_id\":\"o\t\",\"item_id\":\"i\",\"qty\":1}}",
        ] {
            assert!(client_order_op(line).is_none(), "{line}");
        }
    }

    #[test]
    fn final_lines_match_serde() {
        for line in [
            r#"{"kind":"order","order_id":"o-1","item_id":"item-14","qty":1,"event_id":"e-o-1"}"#,
            r#"{"kind":"order","order_id":"o-1","item_id":"item-14","qty":1,"event_id":"e-o-1","deliveries":3,"duplicates_absorbed":2}"#,
            r#"{"kind":"order","order_id":"o-1","item_id":"item-14","qty":1,"event_id":"e-o-1","deliveries":0}"#,
            r#"{"kind":"order","duplicates_absorbed":1,"order_id":"o","item_id":"i","qty":1,"event_id":"e","deliveries":null}"#,
            r#"{"kind":"applied","event_id":"e","order_id":"o","item_id":"i","qty":1,"delivery_attempt":2,"worker_id":"w","applied_at_ms":-5}"#,
            r#"{"kind":"dead_letter","message_id":"m","event_id":"e","delivery_count":5,"last_error":null}"#,
            r#"{"kind":"meta","quiesced":true,"read_at_ns":12,"run_started_at_ms":1795980031695}"#,
            r#"{"kind":"projection","item_id":"i","reserved_qty":0}"#,
        ] {
            let fast = final_line(line).unwrap_or_else(|| panic!("slow path for {line}"));
            let slow: FinalRef<'_> = serde_json::from_str(line).unwrap();
            assert_eq!(format!("{fast:?}"), format!("{slow:?}"), "{line}");
            let scanned = final_line_any_key_order(line).unwrap();
            assert_eq!(format!("{fast:?}"), format!("{scanned:?}"), "{line}");
            // The rows, nearly all of a long run's lines, kept as offsets and
            // read back, are the same line; the others are left to the fold.
            match FinalSpans::read(line) {
                Some(spans) => assert_eq!(format!("{:?}", spans.get(line)), format!("{fast:?}"), "{line}"),
                None => assert!(!matches!(&*fast.kind, "order" | "applied"), "{line}"),
            }
        }
        for line in [
            r#"{"kind":"order","order_id":"o\u0031","item_id":"i","qty":1,"event_id":"e"}"#,
            r#"{"kind":"applied","delivery_attempt":4294967296}"#,
            r#"{"kind":"order","kind":"applied"}"#,
            r#"{"kind":"order","other":1}"#,
            r#"{"kind":"meta","quiesced":1}"#,
            r#"{"kind":"order","order_id":"o","item_id":"i","qty":1,"event_id":"e","deliveries":-1}"#,
            r#"{"kind":"order","order_id":"o","item_id":"i","qty":1,"event_id":"e","deliveries":4294967296}"#,
            r#"{"kind":"order","order_id":"o","item_id":"i","qty":1,"event_id":"e","deliveries":1,"deliveries":2}"#,
        ] {
            assert!(final_line(line).is_none(), "{line}");
        }
    }

    mod agreement {
        use proptest::prelude::*;

        use super::super::*;
        use super::same_as_serde_op;

        /// Strings with the characters that need care: quotes, backslashes,
        /// control characters, non-ASCII.
        fn text() -> impl Strategy<Value = String> {
            prop::collection::vec(
                prop_oneof![Just('a'), Just('-'), Just('"'), Just('\\'), Just('\t'), Just('é'), Just('7')],
                0..6,
            )
            .prop_map(|chars| chars.into_iter().collect())
        }

        fn op_line() -> impl Strategy<Value = String> {
            (
                (
                    any::<u64>(),
                    any::<u64>(),
                    any::<u64>(),
                    prop::sample::select(vec!["invoke", "ok", "fail", "info", "x"]),
                ),
                (text(), text(), any::<i64>(), prop::option::of(text())),
                (prop::option::of(text()), prop::option::of(text()), any::<bool>(), any::<bool>()),
            )
                .prop_map(
                    |(
                        (index, time_ns, process, kind),
                        (order_id, item_id, qty, event_id),
                        (correlation, error, pretty, reorder),
                    )| {
                        let mut value = serde_json::json!({"order_id": order_id, "item_id": item_id, "qty": qty});
                        if let Some(e) = event_id {
                            value["event_id"] = e.into();
                        }
                        let mut fields = vec![
                            ("index", serde_json::json!(index)),
                            ("time_ns", serde_json::json!(time_ns)),
                            ("process", serde_json::json!(process)),
                            ("type", serde_json::json!(kind)),
                            ("f", serde_json::json!("order")),
                            ("value", value),
                        ];
                        if let Some(c) = correlation {
                            fields.push(("correlation_id", c.into()));
                        }
                        if let Some(e) = error {
                            fields.push(("error", e.into()));
                        }
                        if reorder {
                            fields.reverse();
                        }
                        let body: Vec<String> = fields
                            .iter()
                            .map(|(k, v)| {
                                let v = if pretty { serde_json::to_string_pretty(v) } else { serde_json::to_string(v) };
                                format!("\"{k}\":{}", v.unwrap())
                            })
                            .collect();
                        format!("{{{}}}", body.join(if pretty { ", " } else { "," }))
                    },
                )
        }

        /// `order` and `applied` lines, with or without the delivery evidence,
        /// in the store's layout or not.
        fn final_row_line() -> impl Strategy<Value = String> {
            (
                (any::<bool>(), text(), text(), any::<i64>(), text()),
                (prop::option::of(any::<u32>()), prop::option::of(any::<u32>()), any::<u32>(), any::<i64>()),
                (any::<bool>(), any::<bool>()),
            )
                .prop_map(
                    |(
                        (order, order_id, item_id, qty, event_id),
                        (deliveries, duplicates, attempt, at),
                        (pretty, reorder),
                    )| {
                        let mut fields = vec![
                            ("kind", serde_json::json!(if order { "order" } else { "applied" })),
                            ("order_id", serde_json::json!(order_id)),
                            ("item_id", serde_json::json!(item_id)),
                            ("qty", serde_json::json!(qty)),
                            ("event_id", serde_json::json!(event_id)),
                        ];
                        if order {
                            if let Some(d) = deliveries {
                                fields.push(("deliveries", d.into()));
                            }
                            if let Some(d) = duplicates {
                                fields.push(("duplicates_absorbed", d.into()));
                            }
                        } else {
                            fields.swap(1, 4);
                            fields.push(("delivery_attempt", attempt.into()));
                            fields.push(("worker_id", "w".into()));
                            fields.push(("applied_at_ms", at.into()));
                            if let Some(d) = deliveries {
                                fields.push(("key_seq", d.into()));
                                fields.push(("publish_seq", (i64::from(d) * 1_000_003).into()));
                            }
                        }
                        if reorder {
                            fields.reverse();
                        }
                        let sep = if pretty { ", " } else { "," };
                        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                        format!("{{{}}}", body.join(sep))
                    },
                )
        }

        fn same_as_serde_final(line: &str) -> Result<(), TestCaseError> {
            if let Some(fast) = final_line(line) {
                let slow: Result<FinalRef<'_>, _> = serde_json::from_str(line);
                prop_assert!(slow.is_ok(), "the fast path accepted what serde rejects: {}", line);
                prop_assert_eq!(format!("{fast:?}"), format!("{:?}", slow.unwrap()), "{}", line);
                // As offsets and back: the same line, and only a kind the format
                // does not know is left to serde.
                if let Some(spans) = FinalSpans::read(line) {
                    prop_assert_eq!(format!("{:?}", spans.get(line)), format!("{fast:?}"));
                }
            }
            Ok(())
        }

        proptest! {
            /// The final state's rows: what the fast path reads, serde reads the
            /// same way; plain rows take the fast path; a changed byte changes
            /// nothing of that.
            #[test]
            fn final_rows_agree_with_serde(line in final_row_line(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
                same_as_serde_final(&line)?;
                if !line.contains('\\') && !line.contains('\t') {
                    prop_assert!(final_line(&line).is_some(), "a plain line left to serde: {}", line);
                }
                let mut bytes = line.into_bytes();
                let at = cut.index(bytes.len());
                bytes[at] = byte;
                if let Ok(mutated) = String::from_utf8(bytes) {
                    same_as_serde_final(&mutated)?;
                }
            }
        }

        proptest! {
            /// Whatever the fast path reads, serde reads the same way; and the
            /// plain lines it must read, it does.
            #[test]
            fn the_fast_path_agrees_with_serde(line in op_line(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
                let plain = !line.contains('\\') && !line.contains('\t');
                let read = client_order_op(&line).is_some();
                if read {
                    prop_assert!(same_as_serde_op(&line));
                }
                let kind_ok = ["invoke", "ok", "fail", "info"].iter().any(|k| line.contains(&format!("\"type\":\"{k}\"")) || line.contains(&format!("\"type\": \"{k}\"")));
                if plain && kind_ok {
                    prop_assert!(read, "a plain line left to serde: {}", line);
                }
                // One byte changed: still either the same answer as serde, or serde's turn.
                let mut bytes = line.into_bytes();
                let at = cut.index(bytes.len());
                bytes[at] = byte;
                if let Ok(mutated) = String::from_utf8(bytes)
                    && client_order_op(&mutated).is_some()
                {
                    prop_assert!(serde_json::from_str::<OpRef<'_>>(&mutated).is_ok(), "{}", mutated);
                    prop_assert!(same_as_serde_op(&mutated));
                }
            }
        }
    }
}
