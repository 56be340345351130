//! The `[client]` section as a [`Client`]: one HTTP request per order, its
//! answer classified as the file says (ok, fail, or indeterminate).

use std::sync::Arc;
use std::time::Duration;

use haunt_format::OrderValue;

use crate::core::inflight::InFlight;
use crate::core::roles::{BoxFuture, Client, Completion};
use crate::systems::system_file::spec::ClientDecl;

/// A client whose URL and body still hold `{order_id}`, `{item_id}` and
/// `{qty}`, every other placeholder filled.
#[derive(Debug)]
pub struct TemplateClient {
    http: reqwest::Client,
    decl: ClientDecl,
    /// The requests in flight at the node its URL calls.
    in_flight: Arc<InFlight>,
}

impl TemplateClient {
    pub fn new(decl: ClientDecl, request_timeout: Duration) -> anyhow::Result<TemplateClient> {
        let http = reqwest::Client::builder()
            .timeout(request_timeout)
            // A refused connect sent nothing: a definite failure, and quick.
            .connect_timeout(request_timeout.min(Duration::from_millis(500)))
            .build()?;
        Ok(TemplateClient { http, decl, in_flight: Arc::default() })
    }

    /// Its requests in flight, counted and timed for the aim of kills and
    /// pauses of the node it calls.
    pub fn in_flight(&self) -> Arc<InFlight> {
        self.in_flight.clone()
    }
}

/// `text` with the order's fields in place; `escape` makes each value safe
/// where it stands (inside a JSON string, or a URL).
fn fill_order(text: &str, order: &OrderValue, escape: fn(&str) -> String) -> String {
    text.replace("{order_id}", &escape(&order.order_id))
        .replace("{item_id}", &escape(&order.item_id))
        .replace("{qty}", &order.qty.to_string())
}

/// The inside of a JSON string literal.
pub fn json_escaped(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_owned()
}

fn url_escaped(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What an answer means, by the file's lists.
pub fn classify(decl: &ClientDecl, status: u16, body: &[u8]) -> Completion {
    if decl.ok.contains(&status) {
        let Some(pointer) = &decl.event_id else { return Completion::Ok { event_id: None } };
        let value: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let event = value.as_ref().and_then(|v| v.pointer(pointer)).and_then(|e| match e {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
        match event {
            Some(e) => Completion::Ok { event_id: Some(e) },
            // Committed, but without the event the op cannot be joined: unknown.
            None => Completion::Info { error: format!("{status} without an event id at {pointer}") },
        }
    } else if decl.fail.contains(&status) {
        Completion::Fail { error: format!("{status}: {}", String::from_utf8_lossy(body).trim()) }
    } else {
        Completion::Info { error: format!("{status}: {}", String::from_utf8_lossy(body).trim()) }
    }
}

impl Client for TemplateClient {
    fn place<'a>(&'a self, order: &'a OrderValue, correlation_id: &'a str) -> BoxFuture<'a, Completion> {
        Box::pin(async move {
            let url = fill_order(&self.decl.url, order, url_escaped);
            let method = reqwest::Method::from_bytes(self.decl.method.as_bytes()).unwrap_or(reqwest::Method::POST);
            let mut request = self.http.request(method, url).header("x-correlation-id", correlation_id);
            for (name, value) in &self.decl.headers {
                request = request.header(name, value);
            }
            if let Some(body) = &self.decl.body {
                request = request.body(fill_order(body, order, json_escaped));
            }
            // In flight until the answer's head arrives: by then the node has
            // done its work, and the rest is the body on its way (which a
            // server's small writes can hold up for tens of milliseconds).
            let in_flight = self.in_flight.begin();
            let sent = request.send().await;
            drop(in_flight);
            let response = match sent {
                Ok(r) => r,
                Err(e) if e.is_connect() => return Completion::Fail { error: format!("connect: {e}") },
                Err(e) if e.is_timeout() => return Completion::Info { error: "timeout".into() },
                Err(e) => return Completion::Info { error: format!("{e}") },
            };
            let status = response.status().as_u16();
            match response.bytes().await {
                Ok(body) => classify(&self.decl, status, &body),
                Err(e) if self.decl.ok.contains(&status) => {
                    Completion::Info { error: format!("{status}, reading the answer: {e}") }
                }
                Err(_) => classify(&self.decl, status, b""),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl() -> ClientDecl {
        ClientDecl {
            method: "POST".into(),
            url: "http://127.0.0.1:1/orders/{order_id}".into(),
            headers: Vec::new(),
            body: Some(r#"{"order_id": "{order_id}", "qty": {qty}}"#.into()),
            ok: vec![200, 201],
            fail: vec![400, 409],
            event_id: Some("/event/id".into()),
        }
    }

    #[test]
    fn answers_are_classified_by_the_file() {
        let d = decl();
        assert_eq!(classify(&d, 201, br#"{"event": {"id": "e1"}}"#), Completion::Ok { event_id: Some("e1".into()) });
        assert!(matches!(classify(&d, 201, b"{}"), Completion::Info { .. }), "ok without its event id");
        assert!(matches!(classify(&d, 409, b"conflict"), Completion::Fail { .. }));
        assert!(matches!(classify(&d, 500, b""), Completion::Info { .. }), "anything else is unknown");
        let no_pointer = ClientDecl { event_id: None, ..decl() };
        assert_eq!(classify(&no_pointer, 200, b""), Completion::Ok { event_id: None });
    }

    #[test]
    fn order_fields_are_escaped_where_they_stand() {
        let order = OrderValue { order_id: "a\"b/c".into(), item_id: "i".into(), qty: 3, event_id: None };
        let d = decl();
        assert_eq!(fill_order(d.body.as_deref().unwrap(), &order, json_escaped), r#"{"order_id": "a\"b/c", "qty": 3}"#);
        assert_eq!(fill_order(&d.url, &order, url_escaped), "http://127.0.0.1:1/orders/a%22b%2Fc");
    }
}
