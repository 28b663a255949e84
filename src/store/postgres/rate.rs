//! Rate keys: an enqueue's plan, throttles, and the keys as operators see
//! them (the counting of starts is jobhost.rate_start, in
//! 0024_rate_limits.sql).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::store::rate::{MAX_LISTED_KEYS, RateKeyStatus, RateTotals};
use crate::store::{PreparedJob, Result, RunId};

type RateKeyRow = (String, String, Option<i64>, Option<i64>, i64, Option<DateTime<Utc>>, Option<f64>, i64, i64);

/// Keys with starts in their window or a throttle in force, in (type, key) order.
pub async fn list(pool: &PgPool) -> Result<Vec<RateKeyStatus>> {
    let rows: Vec<RateKeyRow> = sqlx::query_as(
        "SELECT r.job, r.key, l.lim, l.period_ms,
                (SELECT count(*) FROM unnest(r.starts) AS s
                 WHERE s > now() - coalesce(l.period_ms, 0) * interval '1 millisecond'),
                CASE WHEN r.throttled_until > now() THEN r.throttled_until END,
                CASE WHEN r.throttled_until > now() THEN extract(epoch FROM r.throttled_until - now())::float8 END,
                r.deferred, r.throttles
         FROM jobhost.rate_keys r
         LEFT JOIN jobhost.job_types t ON t.name = r.job
         CROSS JOIN LATERAL (SELECT (t.config -> 'rate_limit' ->> 'limit')::bigint AS lim,
                                    (t.config -> 'rate_limit' ->> 'period_ms')::bigint AS period_ms) l
         WHERE r.throttled_until > now()
            OR EXISTS (SELECT 1 FROM unnest(r.starts) AS s
                       WHERE s > now() - coalesce(l.period_ms, 0) * interval '1 millisecond')
         ORDER BY r.job, r.key
         LIMIT $1",
    )
    .bind(MAX_LISTED_KEYS)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(job, key, limit, period_ms, starts_in_window, throttled_until, throttled_secs, sent_back, throttles)| {
            RateKeyStatus {
                job,
                key,
                limit,
                period_ms,
                starts_in_window,
                throttled_until,
                throttled_secs,
                sent_back,
                throttles,
            }
        })
        .collect())
}

/// Each type's sends-back and throttles, summed over its keys.
pub async fn totals(pool: &PgPool) -> Result<Vec<RateTotals>> {
    Ok(sqlx::query_as(
        "SELECT job, sum(deferred)::bigint AS sent_back, sum(throttles)::bigint AS throttles
         FROM jobhost.rate_keys GROUP BY job ORDER BY job",
    )
    .fetch_all(pool)
    .await?)
}

/// When each of `jobs` may start by its key's plan (`store::rate::plan`),
/// by the database's clock: `None` for a job without a rate limit or not
/// due at once (a delay, a time to run at), which the fetch counts when it
/// comes due. The keys' rows are locked in (type, key) order, before any
/// semaphore the enqueue's gate takes (the lock order), and their planned
/// times updated, in the enqueue's transaction.
pub async fn plan(conn: &mut PgConnection, jobs: &[&PreparedJob]) -> Result<Vec<Option<DateTime<Utc>>>> {
    let keys = crate::store::rate::to_plan(jobs);
    let mut planned = vec![None; jobs.len()];
    if keys.is_empty() {
        return Ok(planned);
    }
    let (types, names): (Vec<&str>, Vec<&str>) = keys.keys().copied().unzip();
    sqlx::query(
        "INSERT INTO jobhost.rate_keys (job, key)
         SELECT * FROM unnest($1::text[], $2::text[]) ORDER BY 1, 2
         ON CONFLICT DO NOTHING",
    )
    .bind(&types)
    .bind(&names)
    .execute(&mut *conn)
    .await?;
    let rows: Vec<(String, String, Vec<i64>, i64)> = sqlx::query_as(
        "SELECT r.job, r.key, r.planned, floor(extract(epoch FROM now()) * 1000)::bigint
         FROM jobhost.rate_keys r JOIN unnest($1::text[], $2::text[]) AS k(job, key) ON k.job = r.job AND k.key = r.key
         ORDER BY r.job, r.key
         FOR UPDATE OF r",
    )
    .bind(&types)
    .bind(&names)
    .fetch_all(&mut *conn)
    .await?;
    let mut latest_of = Vec::with_capacity(rows.len());
    for (job, key, latest, now) in rows {
        let Some((limit, positions)) = keys.get(&(job.as_str(), key.as_str())) else { continue };
        let (times, latest) = crate::store::rate::plan(&latest, *limit, positions.len(), now);
        for (position, time) in positions.iter().zip(times) {
            planned[*position] = DateTime::from_timestamp_millis(time);
        }
        latest_of.push((job, key, serde_json::Value::from(latest)));
    }
    sqlx::query(
        "UPDATE jobhost.rate_keys r
         SET planned = ARRAY(SELECT jsonb_array_elements_text(u.latest)::bigint), updated_at = now()
         FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS u(job, key, latest)
         WHERE r.job = u.job AND r.key = u.key",
    )
    .bind(latest_of.iter().map(|(job, _, _)| job.as_str()).collect::<Vec<_>>())
    .bind(latest_of.iter().map(|(_, key, _)| key.as_str()).collect::<Vec<_>>())
    .bind(latest_of.iter().map(|(_, _, latest)| sqlx::types::Json(latest)).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(planned)
}

/// See `functions/rate_throttle.sql`.
pub async fn throttle(pool: &PgPool, run: RunId, delay_ms: u64) -> Result<bool> {
    Ok(sqlx::query_scalar("SELECT jobhost.rate_throttle($1, $2, $3)")
        .bind(run.job_id)
        .bind(run.lease_token)
        .bind(i64::try_from(delay_ms).unwrap_or(i64::MAX))
        .fetch_one(pool)
        .await?)
}

#[async_trait]
impl crate::store::driver::RateDriver for super::PgStore {
    async fn rate_throttle(&self, run: RunId, delay_ms: u64) -> Result<bool> {
        throttle(&self.pool, run, delay_ms).await
    }
    async fn rate_key_list(&self) -> Result<Vec<RateKeyStatus>> {
        list(&self.pool).await
    }

    async fn rate_totals(&self) -> Result<Vec<RateTotals>> {
        totals(&self.pool).await
    }
}
