//! Amazon SQS: a standard queue (at-least-once) or a FIFO queue
//! (deduplicated within five minutes), spoken to over plain HTTP.
//!
//! haunt runs this against moto's `moto_server`, **an emulator of SQS, not
//! SQS**: it keeps every queue in memory, so a restart of it loses them all
//! (real SQS is durable), and its FIFO deduplication is narrower than
//! SQS's (below). The contract test says where it differs.
//!
//! Standard (`haunt-orders`): the relay sends each batch with
//! `SendMessageBatch`; the HTTP answer is the confirmation (with
//! `Options::confirms` off the requests are sent and not waited for). A
//! worker's `ReceiveMessage` hides what it returns for
//! `Options::visibility_timeout`, rounded up to whole seconds (SQS counts
//! in seconds). **A message not deleted within that time becomes visible
//! again and is received again, by any worker, with its
//! `ApproximateReceiveCount` raised**, whether the first worker died or is
//! only slow; that count is the delivery count. An ack is
//! `DeleteMessageBatch` with the receipt handles.
//!
//! FIFO (`haunt-orders.fifo`): each message carries its message id as the
//! `MessageDeduplicationId`, so SQS drops a resend of it within five minutes
//! of the first send, and the envelope's key (the order's item) as the
//! `MessageGroupId`: SQS delivers a group in order and holds back a group's
//! later messages while an earlier one is in flight, so one group per key
//! keeps a key's events in publish order (`OrderClaim::PerKey`) without
//! serializing all of them; a key has at most one receive in flight. **moto**
//! deduplicates only against messages still in the queue: a resend after
//! the first copy was deleted is delivered again (real SQS would drop it
//! within the window); the contract test checks both halves.
//!
//! Depth: SQS cannot list messages without receiving them, so the depth is
//! a count: `ApproximateNumberOfMessages` (visible),
//! `…NotVisible` (received, not deleted) and `…Delayed`. On real SQS these
//! are approximate; moto computes them exactly.

use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Region, timeout::TimeoutConfig};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry,
};
use futures_util::future::BoxFuture;

use crate::{
    Consumer, Delivery, Depth, Envelope, Inspector, Options, Publisher, Receipt, TransportError, TransportSpec,
};

/// SQS's limit on the entries of one batch request, and on the messages of
/// one receive.
const BATCH_MAX: usize = 10;

/// SQS's longest long poll.
const LONG_POLL_MAX: Duration = Duration::from_secs(20);

/// SQS's longest visibility timeout (12 hours).
const VISIBILITY_MAX_S: u64 = 43_200;

/// How long one request may take: above the longest long poll.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

fn broker<E: std::error::Error>(e: E) -> TransportError {
    TransportError::Broker { broker: "sqs", why: DisplayErrorContext(e).to_string() }
}

fn unconfirmed<E: std::error::Error>(e: E) -> TransportError {
    TransportError::Unconfirmed { broker: "sqs", why: DisplayErrorContext(e).to_string() }
}

fn is_fifo(spec: TransportSpec) -> bool {
    spec.mode() == "fifo"
}

fn queue_name(fifo: bool) -> &'static str {
    // SQS queue names allow no dots but the FIFO suffix.
    if fifo { "haunt-orders.fifo" } else { "haunt-orders" }
}

/// A client for the endpoint at `url`: plain HTTP, fixed test keys, no
/// credential or region lookup (no aws-config).
fn client(url: &str) -> Client {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .build();
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(aws_credential_types::Credentials::from_keys("haunt", "haunt", None))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .timeout_config(timeouts)
        .build();
    Client::from_conf(config)
}

/// Creates the queue unless it exists; its URL. No visibility timeout is
/// set on the queue: each receive sets its own, so the inspector (which
/// does not know it) and the workers declare the same queue.
async fn declare(client: &Client, fifo: bool) -> Result<String, TransportError> {
    let mut create = client.create_queue().queue_name(queue_name(fifo));
    if fifo {
        create = create
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
    }
    let created = create.send().await.map_err(broker)?;
    created
        .queue_url()
        .map(str::to_owned)
        .ok_or_else(|| TransportError::Broker { broker: "sqs", why: "CreateQueue answered no queue URL".into() })
}

pub(crate) async fn publisher(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Publisher>, TransportError> {
    let client = client(url);
    let fifo = is_fifo(spec);
    let queue_url = declare(&client, fifo).await?;
    Ok(Box::new(SqsPublisher { client, queue_url, fifo, confirms: options.confirms }))
}

pub(crate) async fn consumer(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Consumer>, TransportError> {
    let client = client(url);
    let queue_url = declare(&client, is_fifo(spec)).await?;
    let visibility_s = options.visibility_timeout.as_millis().div_ceil(1000).clamp(1, u128::from(VISIBILITY_MAX_S));
    Ok(Box::new(SqsConsumer { client, queue_url, visibility_s: visibility_s as i32 }))
}

pub(crate) async fn inspector(spec: TransportSpec, url: &str) -> Result<Box<dyn Inspector>, TransportError> {
    Ok(Box::new(Queue { client: client(url), fifo: is_fifo(spec) }))
}

#[derive(Debug)]
struct SqsPublisher {
    client: Client,
    queue_url: String,
    fifo: bool,
    confirms: bool,
}

/// The FIFO group of an envelope: its key (the order's item), so that SQS
/// keeps a key's events in publish order; an envelope without a key (from
/// a haunt before keys) is a group of its own, which promises nothing.
fn group_of(envelope: &Envelope) -> &str {
    envelope.key.as_deref().unwrap_or(&envelope.message_id)
}

impl SqsPublisher {
    fn entries(&self, chunk: &[Envelope]) -> Result<Vec<SendMessageBatchRequestEntry>, TransportError> {
        chunk
            .iter()
            .enumerate()
            .map(|(i, envelope)| {
                let body = String::from_utf8(envelope.to_body()).expect("an envelope serializes to UTF-8");
                let mut entry = SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(body);
                if self.fifo {
                    entry = entry.message_deduplication_id(&envelope.message_id).message_group_id(group_of(envelope));
                }
                entry.build().map_err(unconfirmed)
            })
            .collect()
    }
}

impl Publisher for SqsPublisher {
    fn publish<'a>(&'a mut self, batch: &'a [Envelope]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            for chunk in batch.chunks(BATCH_MAX) {
                let send =
                    self.client.send_message_batch().queue_url(&self.queue_url).set_entries(Some(self.entries(chunk)?));
                if !self.confirms {
                    // The bug mode: the request goes out, its answer is not waited for.
                    tokio::spawn(async move {
                        if let Err(e) = send.send().await {
                            tracing::warn!(error = %DisplayErrorContext(e), "an unconfirmed sqs send failed");
                        }
                    });
                    continue;
                }
                let sent = send.send().await.map_err(unconfirmed)?;
                if let Some(failed) = sent.failed().first() {
                    return Err(TransportError::Unconfirmed {
                        broker: "sqs",
                        why: format!(
                            "{} of {} refused, first {}: {}",
                            sent.failed().len(),
                            chunk.len(),
                            failed.code(),
                            failed.message().unwrap_or("")
                        ),
                    });
                }
            }
            Ok(())
        })
    }
}

#[derive(Debug)]
struct SqsConsumer {
    client: Client,
    queue_url: String,
    visibility_s: i32,
}

impl Consumer for SqsConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            // Long polls count whole seconds; a shorter wait polls once and
            // then sleeps what is left of it, rather than spinning.
            let wait_s = wait.min(LONG_POLL_MAX).as_secs() as i32;
            let received = self
                .client
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(max.clamp(1, BATCH_MAX) as i32)
                .wait_time_seconds(wait_s)
                .visibility_timeout(self.visibility_s)
                .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
                .send()
                .await
                .map_err(broker)?;
            let messages = received.messages();
            if messages.is_empty() && wait_s == 0 {
                tokio::time::sleep(wait).await;
            }
            let mut out = Vec::with_capacity(messages.len());
            let mut junk = Vec::new();
            for message in messages {
                let handle = message.receipt_handle().unwrap_or_default().to_owned();
                match Envelope::from_body(message.body().unwrap_or_default().as_bytes()) {
                    Ok(envelope) => {
                        let count = message
                            .attributes()
                            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(1);
                        out.push(Delivery { envelope, delivery_count: count, receipt: Receipt(handle) });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "dropping a queue message that is not a haunt envelope");
                        junk.push(Receipt(handle));
                    }
                }
            }
            self.ack(&junk).await?;
            Ok(out)
        })
    }

    fn ack<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            for chunk in receipts.chunks(BATCH_MAX) {
                let entries = chunk
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(&r.0).build()
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(broker)?;
                let deleted = self
                    .client
                    .delete_message_batch()
                    .queue_url(&self.queue_url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(broker)?;
                // A refused delete (a receipt handle past its visibility
                // timeout) leaves the message to be received again.
                if let Some(failed) = deleted.failed().first() {
                    return Err(TransportError::Broker {
                        broker: "sqs",
                        why: format!(
                            "{} of {} deletes refused, first {}: {}",
                            deleted.failed().len(),
                            chunk.len(),
                            failed.code(),
                            failed.message().unwrap_or("")
                        ),
                    });
                }
            }
            Ok(())
        })
    }
}

/// The queue, for declaring and for the final state.
#[derive(Debug)]
struct Queue {
    client: Client,
    fifo: bool,
}

impl Inspector for Queue {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move { declare(&self.client, self.fifo).await.map(drop) })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async move {
            // The URL, not a create: a queue the broker lost is an error here,
            // not an empty queue.
            let url = self.client.get_queue_url().queue_name(queue_name(self.fifo)).send().await.map_err(broker)?;
            let url = url.queue_url().unwrap_or_default();
            let counted = [
                QueueAttributeName::ApproximateNumberOfMessages,
                QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
                QueueAttributeName::ApproximateNumberOfMessagesDelayed,
            ];
            let mut get = self.client.get_queue_attributes().queue_url(url);
            for name in &counted {
                get = get.attribute_names(name.clone());
            }
            let attributes = get.send().await.map_err(broker)?;
            let mut total = 0u64;
            for name in &counted {
                let value = attributes.attributes().and_then(|a| a.get(name)).map(String::as_str).unwrap_or("0");
                total += value.parse::<u64>().map_err(|_| TransportError::Broker {
                    broker: "sqs",
                    why: format!("{} is not a count: {value:?}", name.as_str()),
                })?;
            }
            Ok(Depth::Counted(total))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_group_is_the_key_and_an_envelope_without_one_is_its_own_group() {
        let body = br#"{"message_id":"m1","event_id":"e1","payload":"{\"order_id\":\"o1\",\"item_id\":\"i1\"}","headers":"{}","enqueued_at_ms":1}"#;
        let old = Envelope::from_body(body).expect("an envelope from before keys parses");
        assert_eq!(old.key, None);
        assert_eq!(group_of(&old), "m1");
        let keyed = Envelope { key: Some("item-3".into()), ..old };
        assert_eq!(group_of(&keyed), "item-3");
        assert_eq!(Envelope::from_body(&keyed.to_body()).unwrap(), keyed, "the key travels");
    }
}
