//! Ids kept exactly in sixteen bytes.
//!
//! A long run holds tens of millions of order ids and event ids, and a
//! `Box<str>` each costs its pointer, its length and a heap block. A [`Key`]
//! is the string itself, packed: up to 15 bytes inline, a UUID in its
//! canonical lowercase form as its 128 bits (less the two variant bits,
//! which the form fixes), and anything else spilled once into [`Keys`] and
//! named by its place there. The encoding of a string is unique, and a
//! spilled string is stored once, so two keys are equal exactly when their
//! strings are: no hash stands in for an id, and no collision can merge two
//! orders.

use std::borrow::Cow;
use std::hash::BuildHasher;

use hashbrown::HashTable;

/// A string, packed into 16 bytes; see the module's doc.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Key([u8; 16]);

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u128(u128::from_ne_bytes(self.0));
    }
}

/// The first byte of a UUID's key: `01` in its top bits, the value's top
/// six bits below them.
const UUID_TAG: u8 = 0x40;
/// The first byte of a spilled string's key; its place is in bytes 8..16.
const SPILLED: u8 = 0x80;
/// The longest string kept inline: the first byte holds its length.
const INLINE_MAX: usize = 15;

impl Key {
    /// The key of `s` when it needs no spilling.
    fn packed(s: &str) -> Option<Key> {
        if s.len() <= INLINE_MAX {
            let mut bytes = [0u8; 16];
            bytes[0] = s.len() as u8;
            bytes[1..=s.len()].copy_from_slice(s.as_bytes());
            return Some(Key(bytes));
        }
        let value = parse_uuid(s)?;
        // Drop the variant's two bits (bits 62 and 63), which are always 10.
        let packed = ((value >> 64) << 62) | (value & ((1 << 62) - 1));
        let mut bytes = packed.to_be_bytes();
        bytes[0] |= UUID_TAG;
        Some(Key(bytes))
    }

    fn spilled(place: u64) -> Key {
        let mut bytes = [0u8; 16];
        bytes[0] = SPILLED;
        bytes[8..].copy_from_slice(&place.to_le_bytes());
        Key(bytes)
    }

    fn spill_place(&self) -> Option<u64> {
        (self.0[0] == SPILLED).then(|| u64::from_le_bytes(self.0[8..].try_into().expect("8 bytes")))
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0[0] {
            n if usize::from(n) <= INLINE_MAX => write!(f, "Key({:?})", inline(self)),
            SPILLED => write!(f, "Key(spilled #{})", self.spill_place().unwrap_or_default()),
            _ => write!(f, "Key({})", uuid_text(self)),
        }
    }
}

fn inline(key: &Key) -> &str {
    let len = usize::from(key.0[0]);
    std::str::from_utf8(&key.0[1..=len]).expect("inline keys are made from a str")
}

/// The 128 bits of a UUID written in its canonical lowercase form with the
/// RFC 4122 variant (`xxxxxxxx-xxxx-xxxx-[89ab]xxx-xxxxxxxxxxxx`), or `None`.
fn parse_uuid(s: &str) -> Option<u128> {
    let bytes = s.as_bytes();
    if bytes.len() != 36 || !matches!(bytes[19], b'8' | b'9' | b'a' | b'b') {
        return None;
    }
    let mut value = 0u128;
    for (i, &b) in bytes.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if b != b'-' {
                return None;
            }
            continue;
        }
        let nibble = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        value = (value << 4) | u128::from(nibble);
    }
    Some(value)
}

fn uuid_text(key: &Key) -> String {
    let mut bytes = key.0;
    bytes[0] &= !UUID_TAG;
    let packed = u128::from_be_bytes(bytes);
    let value = ((packed >> 62) << 64) | (0b10 << 62) | (packed & ((1 << 62) - 1));
    let hex = format!("{value:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The strings that did not pack, each once, and the way back from a key to
/// its string.
#[derive(Debug, Default)]
pub struct Keys {
    spilled: Vec<Box<str>>,
    places: HashTable<u64>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Keys {
    /// The key of `s`, spilling it if it does not pack.
    pub fn key(&mut self, s: &str) -> Key {
        if let Some(key) = Key::packed(s) {
            return key;
        }
        let hash = self.hasher.hash_one(s);
        let spilled = &self.spilled;
        if let Some(&place) = self.places.find(hash, |&p| &*spilled[p as usize] == s) {
            return Key::spilled(place);
        }
        let place = self.spilled.len() as u64;
        self.spilled.push(s.into());
        let (spilled, hasher) = (&self.spilled, &self.hasher);
        self.places.insert_unique(hash, place, |&p| hasher.hash_one(&*spilled[p as usize]));
        Key::spilled(place)
    }

    /// The key of `s` if it has one already: a string that does not pack and
    /// was never spilled is no key's, so nothing can be found by it.
    pub fn find(&self, s: &str) -> Option<Key> {
        if let Some(key) = Key::packed(s) {
            return Some(key);
        }
        let hash = self.hasher.hash_one(s);
        self.places.find(hash, |&p| &*self.spilled[p as usize] == s).map(|&p| Key::spilled(p))
    }

    /// The string of `key`.
    pub fn str<'a>(&'a self, key: &'a Key) -> Cow<'a, str> {
        match key.0[0] {
            n if usize::from(n) <= INLINE_MAX => Cow::Borrowed(inline(key)),
            SPILLED => Cow::Borrowed(&self.spilled[key.spill_place().unwrap_or_default() as usize]),
            _ => Cow::Owned(uuid_text(key)),
        }
    }

    /// Whether `key` is the key of `s`.
    pub fn is(&self, key: &Key, s: &str) -> bool {
        self.find(s) == Some(*key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_string_comes_back_as_it_went_in() {
        let mut keys = Keys::default();
        let cases = [
            "",
            "o-1",
            "fifteen-bytes!!",
            "sixteen-bytes!!!",
            "é-ü-日本",
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "00000000-0000-0000-8000-000000000000",
            "ffffffff-ffff-ffff-bfff-ffffffffffff",
            // Not canonical: upper case, another variant, a missing dash.
            "0F8FAD5B-D9CB-469F-A165-70867728950E",
            "0f8fad5b-d9cb-469f-c165-70867728950e",
            "0f8fad5bd9cb-469f-a165-70867728950e0",
            "order-00000000000000000000000001",
        ];
        let made: Vec<Key> = cases.iter().map(|s| keys.key(s)).collect();
        for (s, key) in cases.iter().zip(&made) {
            assert_eq!(keys.str(key), *s);
            assert_eq!(keys.find(s), Some(*key), "{s}");
            assert!(keys.is(key, s));
        }
        // Distinct strings, distinct keys; the same string, the same key.
        for (i, a) in made.iter().enumerate() {
            for (j, b) in made.iter().enumerate() {
                assert_eq!(a == b, i == j, "{} and {}", cases[i], cases[j]);
            }
        }
        assert_eq!(keys.key("order-00000000000000000000000001"), made[11]);
        assert_eq!(keys.spilled.len(), 5);
    }

    #[test]
    fn a_string_never_spilled_finds_nothing() {
        let keys = Keys::default();
        assert_eq!(keys.find("a string longer than fifteen bytes"), None);
        assert!(keys.find("short").is_some());
    }

    #[test]
    fn uuids_round_trip_bit_for_bit() {
        let mut keys = Keys::default();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let hi = u128::from(x) << 64;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // The RFC 4122 variant: bits 63 and 62 are 10.
            let value = (hi | u128::from(x)) & !(0b11 << 62) | (0b10 << 62);
            let hex = format!("{value:032x}");
            let s = format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
            let key = keys.key(&s);
            assert_eq!(key.0[0] & 0xc0, UUID_TAG, "{s} packs");
            assert_eq!(keys.str(&key), s);
        }
        assert!(keys.spilled.is_empty());
    }
}
