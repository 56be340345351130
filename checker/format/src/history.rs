//! One line of `history.jsonl`: a client op or a nemesis op.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Who performed an op: a client process or the nemesis.
///
/// The format allows an integer or a string; `"nemesis"` is the nemesis and any
/// other string names a client process (some tools name their workers).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    Client(u64),
    Named(String),
    Nemesis,
}

impl Process {
    pub fn is_nemesis(&self) -> bool {
        matches!(self, Process::Nemesis)
    }
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Process::Client(n) => write!(f, "{n}"),
            Process::Named(name) => f.write_str(name),
            Process::Nemesis => f.write_str("nemesis"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Process::Client(n) => s.serialize_u64(*n),
            Process::Named(name) => s.serialize_str(name),
            Process::Nemesis => s.serialize_str("nemesis"),
        }
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Process;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a non-negative integer or a string")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Process, E> {
                Ok(Process::Client(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Process, E> {
                u64::try_from(v).map(Process::Client).map_err(|_| E::custom(format!("process {v} is negative")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Process, E> {
                Ok(match v {
                    "nemesis" => Process::Nemesis,
                    _ => Process::Named(v.to_owned()),
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Jepsen's op types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// The op was started.
    Invoke,
    /// The op took effect.
    Ok,
    /// The op certainly had no effect.
    Fail,
    /// Unknown: the op may or may not have taken effect.
    Info,
}

impl OpType {
    pub fn as_str(self) -> &'static str {
        match self {
            OpType::Invoke => "invoke",
            OpType::Ok => "ok",
            OpType::Fail => "fail",
            OpType::Info => "info",
        }
    }
}

/// The value of an `order` op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderValue {
    pub order_id: String,
    pub item_id: String,
    pub qty: i64,
    /// Only on an `ok` completion: the event the API enqueued for this order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
}

/// The value of an op: typed for client `order` ops, free-form for the rest
/// (nemesis ops describe their targets however the tool likes).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum OpValue {
    Order(OrderValue),
    Other(serde_json::Value),
}

/// One op of the history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Op {
    pub index: u64,
    pub time_ns: u64,
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: OpType,
    pub f: String,
    pub value: OpValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Op {
    /// The order value, when this is a client `order` op.
    pub fn order(&self) -> Option<&OrderValue> {
        match &self.value {
            OpValue::Order(order) => Some(order),
            OpValue::Other(_) => None,
        }
    }
}

/// The owned op is read through the borrowed one, so both enforce the same
/// rules on `value`.
impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = OpRef::deserialize(d)?;
        let value = if raw.is_client_order() {
            let v = raw.order().map_err(D::Error::custom)?;
            let owned = |c: Option<std::borrow::Cow<'_, str>>| c.map(|c| c.into_owned());
            OpValue::Order(OrderValue {
                order_id: owned(v.order_id).unwrap_or_default(),
                item_id: owned(v.item_id).unwrap_or_default(),
                qty: v.qty.unwrap_or_default(),
                event_id: owned(v.event_id),
            })
        } else {
            raw.check_other_value().map_err(D::Error::custom)?;
            OpValue::Other(serde_json::from_str(raw.value).map_err(D::Error::custom)?)
        };
        Ok(Op {
            index: raw.index,
            time_ns: raw.time_ns,
            process: raw.process,
            kind: raw.kind,
            f: raw.f.into_owned(),
            value,
            correlation_id: raw.correlation_id.map(|c| c.into_owned()),
            error: raw.error.map(|c| c.into_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_invoke_round_trips() {
        let line = r#"{"index":0,"time_ns":5,"process":3,"type":"invoke","f":"order","value":{"order_id":"o1","item_id":"i1","qty":2},"correlation_id":"c1"}"#;
        let op: Op = serde_json::from_str(line).unwrap();
        assert_eq!(op.process, Process::Client(3));
        assert_eq!(op.order().unwrap().qty, 2);
        assert_eq!(serde_json::to_string(&op).unwrap(), line);
    }

    #[test]
    fn nemesis_value_is_free_form() {
        let line =
            r#"{"index":1,"time_ns":9,"process":"nemesis","type":"info","f":"kill","value":{"target":"worker-1"}}"#;
        let op: Op = serde_json::from_str(line).unwrap();
        assert!(op.process.is_nemesis());
        assert!(op.order().is_none());
    }

    #[test]
    fn order_invoke_without_qty_is_rejected() {
        let line = r#"{"index":0,"time_ns":5,"process":3,"type":"invoke","f":"order","value":{"order_id":"o1","item_id":"i1"}}"#;
        let err = serde_json::from_str::<Op>(line).unwrap_err().to_string();
        assert!(err.contains("qty"), "{err}");
    }
}

/// An op borrowed from its line, for readers that stream tens of millions of
/// ops: strings without escapes are not copied, and `value` is parsed only by
/// whoever needs it ([`OpRef::order`]).
#[derive(Debug, Deserialize)]
pub struct OpRef<'a> {
    pub index: u64,
    pub time_ns: u64,
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: OpType,
    #[serde(borrow)]
    pub f: std::borrow::Cow<'a, str>,
    /// The value's JSON text, as it stands in the line.
    #[serde(borrow, deserialize_with = "raw_json")]
    pub value: &'a str,
    #[serde(default, borrow)]
    pub correlation_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    pub error: Option<std::borrow::Cow<'a, str>>,
}

/// Any JSON value, kept as its text.
fn raw_json<'de, D: serde::Deserializer<'de>>(d: D) -> Result<&'de str, D::Error> {
    let raw: &'de RawValue = Deserialize::deserialize(d)?;
    Ok(raw.get())
}

/// The order fields of a client op's value, borrowed. On an invoke all three
/// are required; a completion may repeat them or not.
#[derive(Debug, Deserialize)]
pub struct OrderRef<'a> {
    #[serde(default, borrow)]
    pub order_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    pub item_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub qty: Option<i64>,
    #[serde(default, borrow)]
    pub event_id: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> OpRef<'a> {
    pub fn is_client_order(&self) -> bool {
        !self.process.is_nemesis() && self.f == "order"
    }

    /// The order fields of a client `order` op; an invoke must name all of
    /// `order_id`, `item_id` and an integer `qty`.
    pub fn order(&self) -> Result<OrderRef<'a>, String> {
        let what = if self.kind == OpType::Invoke { "order invoke" } else { "order completion" };
        let order: OrderRef<'a> = serde_json::from_str(self.value).map_err(|e| format!("value of an {what}: {e}"))?;
        if self.kind == OpType::Invoke {
            for (field, present) in [
                ("order_id", order.order_id.is_some()),
                ("item_id", order.item_id.is_some()),
                ("qty", order.qty.is_some()),
            ] {
                if !present {
                    return Err(format!("value of an {what}: missing field `{field}`"));
                }
            }
        }
        Ok(order)
    }

    /// A non-order value must be a JSON object.
    pub fn check_other_value(&self) -> Result<(), String> {
        match self.value.trim_start().as_bytes().first() {
            Some(b'{') => Ok(()),
            _ => Err("value must be a JSON object".into()),
        }
    }
}

#[cfg(test)]
mod ref_tests {
    use super::*;

    #[test]
    fn borrowed_ops_need_the_same_fields_as_owned_ones() {
        let line = r#"{"index":0,"time_ns":5,"process":3,"type":"invoke","f":"order","value":{"order_id":"o1","item_id":"i1"}}"#;
        let op: OpRef = serde_json::from_str(line).unwrap();
        assert!(op.order().unwrap_err().contains("missing field `qty`"));
        let line = r#"{"index":1,"time_ns":6,"process":3,"type":"ok","f":"order","value":{"event_id":"e1"}}"#;
        let op: OpRef = serde_json::from_str(line).unwrap();
        assert_eq!(op.order().unwrap().event_id.as_deref(), Some("e1"));
        assert!(matches!(op.f, std::borrow::Cow::Borrowed(_)), "no copy for plain strings");
    }
}
