//! The audit trail in SQLite: a change's row written in the change's
//! transaction, the listing and the bounded prune.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::{ms_or_now, now_ms, time_of};
use crate::store::Result;
use crate::store::audit::{Change, Entry, Filter, Outcome, Row};
use crate::store::driver::AuditDriver;

/// Writes `change`'s row with `outcome` (standing for `count` changes), on
/// `conn`: the change's own transaction.
pub(super) async fn write(conn: &mut SqliteConnection, change: &Change<'_>, outcome: &str, count: i64) -> Result<()> {
    let by = change.by;
    sqlx::query(
        "INSERT INTO audit (at, via, who, address, user_agent, action, object, outcome, count)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(now_ms())
    .bind(by.via.as_str())
    .bind(&by.who)
    .bind(&by.address)
    .bind(&by.user_agent)
    .bind(change.action)
    .bind(&change.object)
    .bind(outcome)
    .bind(count)
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes `change`'s row with the outcome `done` answers, on `conn`.
pub(super) async fn record<T: Outcome>(conn: &mut SqliteConnection, change: &Change<'_>, done: &T) -> Result<()> {
    write(conn, change, &done.outcome(change), 1).await
}

pub async fn list(pool: &SqlitePool, filter: &Filter) -> Result<Vec<Entry>> {
    let rows: Vec<Row<i64>> = sqlx::query_as(
        "SELECT id, at, via, who, address, user_agent, action, object, outcome, count FROM audit
             WHERE ($1 IS NULL OR at >= $1) AND ($2 IS NULL OR who = $2)
               AND ($3 IS NULL OR action LIKE $3 ESCAPE '\\') AND ($4 IS NULL OR object LIKE $4 ESCAPE '\\')
               AND ($5 IS NULL OR id < $5)
             ORDER BY id DESC LIMIT $6",
    )
    .bind(filter.since.map(|t| t.timestamp_millis()))
    .bind(&filter.who)
    .bind(filter.action_pattern())
    .bind(filter.object_pattern())
    .bind(filter.before_id)
    .bind(filter.bounded_limit())
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|row| Entry::of(row, time_of)).collect())
}

#[async_trait]
impl AuditDriver for SqliteStore {
    async fn audit_record(&self, change: &Change<'_>, outcome: &str, count: i64) -> Result<()> {
        self.write_outside_jobs(async |tx| write(tx, change, outcome, count).await).await
    }

    async fn audit_list(&self, filter: &Filter) -> Result<Vec<Entry>> {
        list(&self.reader, filter).await
    }

    async fn audit_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        let before = ms_or_now(now) - (retention_secs * 1000.0) as i64;
        self.write_outside_jobs(async |tx| {
            let pruned =
                sqlx::query("DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < $1 ORDER BY at LIMIT $2)")
                    .bind(before)
                    .bind(limit)
                    .execute(&mut **tx)
                    .await?;
            Ok(pruned.rows_affected())
        })
        .await
    }
}
