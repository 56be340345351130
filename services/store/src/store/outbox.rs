//! The outbox as a relay reads it when its broker keeps each key's order:
//! leased in the order the rows were written, one lease at a time, and given
//! back at once when a publish fails.
//!
//! The database queue's lease ([`Store::lease`]) takes whatever is visible,
//! several leases side by side; that is right for workers, which claim no
//! order, and wrong for a relay in front of SQS FIFO: a relay that dies
//! holding a lease, or fails to publish, would leave older rows behind while
//! newer ones are published, and the broker would keep that wrong order
//! faithfully.

use std::time::Duration;

use uuid::Uuid;

use super::{Store, fetched, leased};
use crate::{Leased, StoreError};

use StoreError::NotCommitted;

type InOrderRow = (String, String, String, String, i64, i64, i64, i64);

impl Store {
    /// Up to `batch_size_max` of the oldest visible rows, in the order they
    /// were written, under one new lease; none while another lease holds
    /// rows (a dead relay's holds until it expires). One relay at a time:
    /// two relays could each find no lease held and take a batch apiece.
    pub async fn lease_in_order(
        &self,
        batch_size_max: u32,
        visibility_timeout: Duration,
    ) -> Result<Vec<Leased>, StoreError> {
        let token = Uuid::new_v4().to_string();
        macro_rules! leased_rows {
            ($pool:expr) => {
                sqlx::query_as::<_, InOrderRow>(self.dialect.lease_in_order)
                    .bind(i64::from(batch_size_max))
                    .bind(&token)
                    .bind(visibility_timeout.as_millis() as i64)
                    .fetch_all($pool)
                    .await
                    .map_err(fetched("queue_messages"))?
            };
        }
        let mut rows = match self.pg_settle.as_ref().or(self.pg.as_ref()) {
            Some(pg) => leased_rows!(pg),
            None => leased_rows!(&self.pool),
        };
        // RETURNING gives rows in no promised order.
        rows.sort_by_key(|r| (r.6, r.7));
        Ok(rows
            .into_iter()
            .map(|(m, e, p, h, d, until, enqueued, _)| leased((m, e, p, h, d, until, enqueued, None), &token))
            .collect())
    }

    /// Gives back every row `lease_token` holds, visible now: a publish that
    /// failed, so that the rows are the next lease's first. Returns how many.
    pub async fn release(&self, lease_token: &str) -> Result<u64, StoreError> {
        let released = match self.pg_settle.as_ref().or(self.pg.as_ref()) {
            Some(pg) => {
                sqlx::query(self.dialect.release).bind(lease_token).execute(pg).await.map(|r| r.rows_affected())
            }
            None => {
                sqlx::query(self.dialect.release).bind(lease_token).execute(&self.pool).await.map(|r| r.rows_affected())
            }
        };
        released.map_err(NotCommitted)
    }
}
