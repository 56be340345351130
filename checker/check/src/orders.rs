//! The table of logical orders, 64 bytes each.
//!
//! A run of a hundred million ops holds about fifty million orders, so the
//! record is what decides whether the checker fits in memory. [`Order`] is an
//! order as the rules read it, every field at full width. [`Orders`] keeps each
//! one packed: its two ids as [`Key`]s, times and quantities as offsets from
//! the run's first, counts in a byte. An order that does not fit (a count
//! past 255, a qty beyond an `i32`, an acknowledged event that is not its
//! row's, a place in its key's order) is kept whole in a side table instead,
//! so every figure stays exact whatever the run holds; the packed form is the
//! common case, not a limit.

use std::collections::HashMap;
use std::num::NonZeroU32;

use crate::key::Key;

/// A count that a line may leave out: the count, or nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptCount(Option<NonZeroU32>);

impl OptCount {
    /// `None` for `u32::MAX`, the one count it cannot hold.
    pub fn new(count: Option<u32>) -> Option<OptCount> {
        match count {
            None => Some(OptCount(None)),
            Some(n) => NonZeroU32::new(n.wrapping_add(1)).map(|c| OptCount(Some(c))),
        }
    }

    pub fn get(self) -> Option<u32> {
        self.0.map(|c| c.get() - 1)
    }

    /// In a byte: 0 for nothing, the count plus one up to 254.
    fn to_byte(self) -> Option<u8> {
        match self.0 {
            None => Some(0),
            Some(c) => u8::try_from(c.get()).ok().filter(|&b| b < u8::MAX),
        }
    }

    fn from_byte(b: u8) -> OptCount {
        OptCount(NonZeroU32::new(u32::from(b)))
    }
}

/// An order's row in the final state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub item: u32,
    /// How many times the queue handed the event to a worker, when the line says.
    pub deliveries: OptCount,
    /// How many of those deliveries the inbox refused, when the line says.
    pub duplicates_absorbed: OptCount,
    pub qty: i64,
    pub event: Key,
}

/// What is kept of the applications joined to an order's row event. Of an
/// order applied more than once, the fold keeps every application besides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applications {
    pub count: u32,
    pub min_attempt: u32,
    pub min_applied_at_ms: i64,
    /// The earliest place in its item's order of any of its applications:
    /// where the event first took effect.
    pub min_key_seq: Option<u64>,
    /// The publish sequence of that first-taking-effect application.
    pub first_publish_seq: Option<i64>,
    /// The worker of the first application (interned in the fold's workers).
    pub first_worker: u32,
    /// An application does not match the order (why is in the fold).
    pub mismatch: bool,
}

/// One logical order: every attempt at one order id, and its final state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    pub id: Key,
    pub invoked: bool,
    pub item: u32,
    pub qty: i64,
    pub attempts: u32,
    pub ok: u32,
    pub fail: u32,
    /// Completed `info`, or never completed.
    pub unknown: u32,
    /// From the first `ok` completion.
    pub ack_event: Option<Key>,
    pub first_invoke_ns: u64,
    pub first_ok_ns: Option<u64>,
    pub row: Option<Row>,
    /// `order` lines after the first with this id.
    pub extra_rows: u32,
    pub applied: Applications,
    pub pending: bool,
    pub dead: bool,
}

impl Order {
    pub fn new(id: Key) -> Order {
        Order {
            id,
            invoked: false,
            item: 0,
            qty: 0,
            attempts: 0,
            ok: 0,
            fail: 0,
            unknown: 0,
            ack_event: None,
            first_invoke_ns: 0,
            first_ok_ns: None,
            row: None,
            extra_rows: 0,
            applied: Applications::default(),
            pending: false,
            dead: false,
        }
    }

    pub fn acknowledged(&self) -> bool {
        self.ok > 0
    }

    /// Every attempt certainly had no effect.
    pub fn failed(&self) -> bool {
        self.invoked && self.ok == 0 && self.unknown == 0 && self.fail > 0
    }

    pub fn indeterminate(&self) -> bool {
        self.invoked && !self.acknowledged() && !self.failed()
    }

    /// The event to name in examples: the row's, else the acknowledged one.
    pub fn event(&self) -> Option<Key> {
        self.row.map(|r| r.event).or(self.ack_event)
    }
}

// The flags of a packed order, in the byte above its invoke offset.
const INVOKED: u8 = 1;
const ACK_EVENT: u8 = 1 << 1;
const ROW: u8 = 1 << 2;
const OK: u8 = 1 << 3;
const PENDING: u8 = 1 << 4;
const DEAD: u8 = 1 << 5;
const MISMATCH: u8 = 1 << 6;
/// Kept whole in the side table; only the id here is read.
const WIDE: u8 = 1 << 7;

const OFFSET_BITS: u32 = 48;

/// An order in 64 bytes.
#[derive(Debug, Clone, Copy)]
struct Packed {
    id: Key,
    /// The acknowledged event, else the row's (when both, they are one).
    event: Key,
    /// The first invoke's offset from the run's first (48 bits), the
    /// flags, and the first application's worker (a byte each).
    word: u64,
    /// From the first invoke to the first ok, in ns.
    ok_after: u32,
    /// The invoke's qty, else the row's.
    qty: i32,
    /// The earliest application's offset from the run's first, in ms.
    applied_at: i32,
    /// The invoke's item, else the row's.
    item: u32,
    /// Attempts, ok, fail, unknown.
    counts: [u8; 4],
    /// Deliveries and duplicates absorbed (as [`OptCount::to_byte`]), the
    /// applications' count and their least attempt.
    small: [u8; 4],
}

impl Packed {
    fn flags(&self) -> u8 {
        (self.word >> OFFSET_BITS) as u8
    }
}

const _: () = assert!(std::mem::size_of::<Packed>() == 64);

/// The orders of a run; see the module's doc.
#[derive(Debug, Default)]
pub struct Orders {
    packed: Vec<Packed>,
    wide: HashMap<u32, Order, hashbrown::DefaultHashBuilder>,
    /// The first invoke time and the first application time packed: the
    /// others are kept as offsets from them.
    invoke_base_ns: Option<u64>,
    applied_base_ms: Option<i64>,
}

impl Orders {
    pub fn len(&self) -> usize {
        self.packed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.is_empty()
    }

    pub fn reserve(&mut self, orders: usize) {
        self.packed.reserve(orders);
    }

    /// A new order with nothing but its id; its index.
    pub fn push(&mut self, id: Key) -> u32 {
        let i = self.packed.len() as u32;
        let packed = self.pack(&Order::new(id)).expect("a new order packs");
        self.packed.push(packed);
        i
    }

    /// The `i`th order's id, without unpacking the rest.
    pub fn id(&self, i: u32) -> Key {
        self.packed[i as usize].id
    }

    /// The `i`th order's row event, if it has a row.
    pub fn row_event(&self, i: u32) -> Option<Key> {
        let p = &self.packed[i as usize];
        match p.flags() {
            f if f & WIDE != 0 => self.wide[&i].row.map(|r| r.event),
            f if f & ROW != 0 => Some(p.event),
            _ => None,
        }
    }

    #[inline]
    pub fn get(&self, i: u32) -> Order {
        let p = &self.packed[i as usize];
        let flags = p.flags();
        if flags & WIDE != 0 {
            return self.wide[&i];
        }
        let invoked = flags & INVOKED != 0;
        let first_invoke_ns =
            if invoked { self.invoke_base_ns.unwrap_or(0) + (p.word & ((1 << OFFSET_BITS) - 1)) } else { 0 };
        let row = (flags & ROW != 0).then(|| Row {
            item: p.item,
            deliveries: OptCount::from_byte(p.small[0]),
            duplicates_absorbed: OptCount::from_byte(p.small[1]),
            qty: i64::from(p.qty),
            event: p.event,
        });
        let count = u32::from(p.small[2]);
        let (item, qty) = if invoked || row.is_none() { (p.item, i64::from(p.qty)) } else { (0, 0) };
        Order {
            id: p.id,
            invoked,
            item,
            qty,
            attempts: u32::from(p.counts[0]),
            ok: u32::from(p.counts[1]),
            fail: u32::from(p.counts[2]),
            unknown: u32::from(p.counts[3]),
            ack_event: (flags & ACK_EVENT != 0).then_some(p.event),
            first_invoke_ns,
            first_ok_ns: (flags & OK != 0).then(|| first_invoke_ns + u64::from(p.ok_after)),
            row,
            extra_rows: 0,
            applied: Applications {
                count,
                min_attempt: u32::from(p.small[3]),
                min_applied_at_ms: if count > 0 {
                    self.applied_base_ms.unwrap_or(0) + i64::from(p.applied_at)
                } else {
                    0
                },
                min_key_seq: None,
                first_publish_seq: None,
                first_worker: (p.word >> (OFFSET_BITS + 8)) as u32,
                mismatch: flags & MISMATCH != 0,
            },
            pending: flags & PENDING != 0,
            dead: flags & DEAD != 0,
        }
    }

    /// Stores `o` as the `i`th order (whose id it keeps).
    #[inline]
    pub fn set(&mut self, i: u32, o: Order) {
        debug_assert_eq!(o.id, self.packed[i as usize].id);
        if self.packed[i as usize].flags() & WIDE == 0 {
            if let Some(packed) = self.pack(&o) {
                self.packed[i as usize] = packed;
                return;
            }
            self.packed[i as usize].word |= u64::from(WIDE) << OFFSET_BITS;
        }
        self.wide.insert(i, o);
    }

    /// Changes the `i`th order.
    #[inline]
    pub fn update<R>(&mut self, i: u32, change: impl FnOnce(&mut Order) -> R) -> R {
        let mut o = self.get(i);
        let r = change(&mut o);
        self.set(i, o);
        r
    }

    pub fn iter(&self) -> impl Iterator<Item = Order> + '_ {
        (0..self.packed.len() as u32).map(|i| self.get(i))
    }

    /// How many orders are kept whole, beside the packed ones.
    pub fn wide(&self) -> usize {
        self.wide.len()
    }

    /// `o` packed, or `None` when something in it does not fit.
    #[inline]
    fn pack(&mut self, o: &Order) -> Option<Packed> {
        let mut flags = 0u8;
        let mut offset = 0u64;
        if o.invoked {
            flags |= INVOKED;
            let base = *self.invoke_base_ns.get_or_insert(o.first_invoke_ns);
            offset = o.first_invoke_ns.checked_sub(base).filter(|d| d >> OFFSET_BITS == 0)?;
        } else if o.first_invoke_ns != 0 || o.first_ok_ns.is_some() {
            return None;
        }
        let ok_after = match o.first_ok_ns {
            Some(ok) => {
                flags |= OK;
                u32::try_from(ok.checked_sub(o.first_invoke_ns)?).ok()?
            }
            None => 0,
        };
        let event = match (o.ack_event, o.row.map(|r| r.event)) {
            (Some(ack), Some(row)) if ack != row => return None,
            (Some(ack), _) => {
                flags |= ACK_EVENT;
                ack
            }
            (None, Some(row)) => row,
            (None, None) => Key::default(),
        };
        let (item, qty) = match o.row {
            Some(r) if o.invoked && (r.item, r.qty) != (o.item, o.qty) => return None,
            Some(_) if !o.invoked && (o.item, o.qty) != (0, 0) => return None,
            Some(r) if !o.invoked => (r.item, r.qty),
            _ => (o.item, o.qty),
        };
        let (deliveries, duplicates) = match o.row {
            Some(r) => {
                flags |= ROW;
                (r.deliveries.to_byte()?, r.duplicates_absorbed.to_byte()?)
            }
            None => (0, 0),
        };
        let a = &o.applied;
        if o.extra_rows != 0 || a.min_key_seq.is_some() || a.first_publish_seq.is_some() {
            return None;
        }
        let applied_at = if a.count > 0 {
            let base = *self.applied_base_ms.get_or_insert(a.min_applied_at_ms);
            i32::try_from(a.min_applied_at_ms.checked_sub(base)?).ok()?
        } else if (a.min_attempt, a.min_applied_at_ms, a.first_worker) != (0, 0, 0) {
            return None;
        } else {
            0
        };
        for (flag, on) in [(PENDING, o.pending), (DEAD, o.dead), (MISMATCH, a.mismatch)] {
            if on {
                flags |= flag;
            }
        }
        let byte = |n: u32| u8::try_from(n).ok();
        Some(Packed {
            id: o.id,
            event,
            word: offset | u64::from(flags) << OFFSET_BITS | u64::from(byte(a.first_worker)?) << (OFFSET_BITS + 8),
            ok_after,
            qty: i32::try_from(qty).ok()?,
            applied_at,
            item,
            counts: [byte(o.attempts)?, byte(o.ok)?, byte(o.fail)?, byte(o.unknown)?],
            small: [deliveries, duplicates, byte(a.count)?, byte(a.min_attempt)?],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Keys;

    /// Orders of every shape, packed or not, come back as they went in.
    #[test]
    fn an_order_comes_back_as_it_was_stored() {
        let mut keys = Keys::default();
        let mut orders = Orders::default();
        let x = std::cell::Cell::new(0x2545_f491_4f6c_dd1d_u64);
        let next = |n: u64| {
            let mut v = x.get();
            v ^= v << 13;
            v ^= v >> 7;
            v ^= v << 17;
            x.set(v);
            v % n
        };
        // Mostly small values, now and then one that cannot pack.
        let pick = |small: u64, large: u64| if next(20) == 0 { large } else { next(small) };
        let mut stored = Vec::new();
        for n in 0..5000u64 {
            let id = keys.key(&format!("o-{n}"));
            let i = orders.push(id);
            let invoked = next(10) != 0;
            let first_invoke_ns = if invoked { 1_000_000 + pick(1 << 40, u64::MAX / 2) } else { 0 };
            let event = keys.key(&format!("e-{}", next(6000)));
            let row = (next(4) != 0).then(|| Row {
                item: if next(30) == 0 { 99 } else { 3 },
                deliveries: OptCount::new((next(3) != 0).then(|| pick(4, 1000) as u32)).unwrap(),
                duplicates_absorbed: OptCount::new((next(3) != 0).then(|| pick(2, 300) as u32)).unwrap(),
                qty: if next(30) == 0 { 7 } else { 2 },
                event: if next(30) == 0 { keys.key("other") } else { event },
            });
            let count = if row.is_some() { pick(3, 400) as u32 } else { 0 };
            let o = Order {
                id,
                invoked,
                item: if invoked { 3 } else { 0 },
                qty: if invoked { 2 } else { 0 },
                attempts: pick(3, 300) as u32,
                ok: pick(2, 256) as u32,
                fail: pick(2, 1 << 20) as u32,
                unknown: pick(2, 999) as u32,
                ack_event: (invoked && next(2) == 0).then_some(event),
                first_invoke_ns,
                first_ok_ns: (invoked && next(2) == 0).then(|| first_invoke_ns + pick(1 << 30, 1 << 33)),
                row,
                extra_rows: pick(1, 2) as u32,
                applied: Applications {
                    count,
                    min_attempt: if count > 0 { 1 + pick(2, 300) as u32 } else { 0 },
                    min_applied_at_ms: if count > 0 { 1_700_000_000_000 + pick(1 << 20, 1 << 40) as i64 } else { 0 },
                    min_key_seq: (next(40) == 0).then_some(n),
                    first_publish_seq: (next(40) == 0).then_some(-1),
                    first_worker: if count > 0 { pick(5, 300) as u32 } else { 0 },
                    mismatch: next(20) == 0,
                },
                pending: next(3) == 0,
                dead: next(5) == 0,
            };
            orders.set(i, o);
            stored.push(o);
        }
        for (i, o) in stored.iter().enumerate() {
            assert_eq!(orders.get(i as u32), *o, "order {i}");
            assert_eq!(orders.row_event(i as u32), o.row.map(|r| r.event));
        }
        assert!(orders.wide() > 100 && orders.wide() < 4900, "both forms were tried: {}", orders.wide());
    }
}
