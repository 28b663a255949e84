//! The audit trail in PostgreSQL: a change's row written in the change's
//! transaction, the actor of a function applications call set for it, the
//! listing and the bounded prune.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::PgStore;
use crate::store::Result;
use crate::store::audit::{Change, Entry, Filter, Outcome, Row};
use crate::store::driver::AuditDriver;

/// Writes `change`'s row with `outcome` (standing for `count` changes), on
/// `conn`: the change's own transaction.
pub(super) async fn write(conn: &mut PgConnection, change: &Change<'_>, outcome: &str, count: i64) -> Result<()> {
    let by = change.by;
    sqlx::query(
        "INSERT INTO jobhost.audit (via, who, address, user_agent, action, object, outcome, count)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
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
pub(super) async fn record<T: Outcome>(conn: &mut PgConnection, change: &Change<'_>, done: &T) -> Result<()> {
    write(conn, change, &done.outcome(change), 1).await
}

/// Runs `work` in a transaction that records `change` with its outcome
/// before committing: both or neither.
pub(super) async fn audited<T: Outcome>(
    pool: &PgPool,
    change: &Change<'_>,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T>,
) -> Result<T> {
    let mut tx = pool.begin().await?;
    let done = work(&mut tx).await?;
    record(&mut tx, change, &done).await?;
    tx.commit().await?;
    Ok(done)
}

/// Sets who the functions applications call (`jobhost.schedule_upsert`,
/// `jobhost.schedule_remove`) record a change as, for the rest of `conn`'s
/// transaction: `change`'s actor, or (`None`) no one, for a job's own
/// change written with its run.
pub(super) async fn set_actor(conn: &mut PgConnection, change: Option<&Change<'_>>) -> Result<()> {
    let actor = match change {
        Some(change) => serde_json::json!(change.by).to_string(),
        None => "-".to_string(),
    };
    sqlx::query("SELECT set_config('jobhost.actor', $1, true)").bind(actor).execute(conn).await?;
    Ok(())
}

pub async fn list(pool: &PgPool, filter: &Filter) -> Result<Vec<Entry>> {
    let rows: Vec<Row<DateTime<Utc>>> = sqlx::query_as(
        "SELECT id, at, via, who, address, user_agent, action, object, outcome, count FROM jobhost.audit
             WHERE ($1::timestamptz IS NULL OR at >= $1) AND ($2::text IS NULL OR who = $2)
               AND ($3::text IS NULL OR action LIKE $3) AND ($4::text IS NULL OR object LIKE $4)
               AND ($5::bigint IS NULL OR id < $5)
             ORDER BY id DESC LIMIT $6",
    )
    .bind(filter.since)
    .bind(&filter.who)
    .bind(filter.action_pattern())
    .bind(filter.object_pattern())
    .bind(filter.before_id)
    .bind(filter.bounded_limit())
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|row| Entry::of(row, |at| at)).collect())
}

pub async fn prune(pool: &PgPool, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
    let pruned = sqlx::query(
        "DELETE FROM jobhost.audit WHERE id IN (
             SELECT id FROM jobhost.audit
             WHERE at < coalesce($1, now()) - $2 * interval '1 second'
             ORDER BY at LIMIT $3)",
    )
    .bind(now)
    .bind(retention_secs)
    .bind(limit)
    .execute(pool)
    .await?;
    Ok(pruned.rows_affected())
}

#[async_trait]
impl AuditDriver for PgStore {
    async fn audit_record(&self, change: &Change<'_>, outcome: &str, count: i64) -> Result<()> {
        write(&mut *self.pool.acquire().await?, change, outcome, count).await
    }

    async fn audit_list(&self, filter: &Filter) -> Result<Vec<Entry>> {
        list(&self.pool, filter).await
    }

    async fn audit_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        prune(&self.sweeps, now, retention_secs, limit).await
    }
}
