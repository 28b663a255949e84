//! Uniqueness claims in SQLite, inside the writer's transaction (see
//! migrations/sqlite/0005_uniqueness.sql for how they are released). The
//! write lock is held, so a claim read here cannot change before it is
//! written: duplicates are decided by reading, not by a conflict.

use std::collections::HashMap;

use sqlx::SqliteConnection;
use sqlx::types::Json;

use super::json_list;
use crate::store::enqueue::{PreparedJob, PreparedUnique};
use crate::store::{Enqueued, Error, Result};
use crate::types::OnDuplicate;

/// What becomes of one job of a batch with unique jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Insert it (claiming its key, if it has one).
    Insert,
    /// Not inserted: a job already stored holds its key.
    Decided(Enqueued),
    /// Not inserted: the job at this earlier position of the batch will
    /// hold its key.
    DuplicateOf(usize),
}

/// Decides each job of a batch against the claims held now and the batch's
/// earlier jobs, applying `on_duplicate` to each duplicate.
///
/// # Errors
/// A duplicate whose type says `raise` ([`Error::Duplicate`]), or the database.
pub async fn decide(conn: &mut SqliteConnection, jobs: &[&PreparedJob], now: i64) -> Result<Vec<Decision>> {
    let claiming: Vec<(usize, &PreparedUnique)> = jobs
        .iter()
        .enumerate()
        .filter_map(|(i, job)| job.unique.as_ref().filter(|u| !u.while_executing).map(|u| (i, u)))
        .collect();
    let mut decisions = vec![Decision::Insert; jobs.len()];
    if claiming.is_empty() {
        return Ok(decisions);
    }
    let asked: Vec<(&str, &str)> = claiming.iter().map(|(i, u)| (jobs[*i].job.as_str(), u.key.as_str())).collect();
    let held: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT c.job, c.unique_key, c.job_id
         FROM json_each($1) u
         JOIN unique_claims c ON c.job = u.value ->> 0 AND c.unique_key = u.value ->> 1",
    )
    .bind(json_list(&asked))
    .fetch_all(&mut *conn)
    .await?;
    let held: HashMap<(String, String), i64> = held.into_iter().map(|(job, key, id)| ((job, key), id)).collect();
    let mut first_in_batch: HashMap<(&str, &str), usize> = HashMap::new();
    for ((i, unique), key) in claiming.into_iter().zip(asked) {
        let job = jobs[i];
        let claimant = held.get(&(key.0.to_string(), key.1.to_string())).copied();
        if claimant.is_none() && !first_in_batch.contains_key(&key) {
            first_in_batch.insert(key, i);
            continue;
        }
        if unique.on_duplicate == OnDuplicate::Raise {
            return Err(match claimant {
                Some(claimant) => Error::Duplicate { job: job.job.clone(), key: unique.key.clone(), claimant },
                None => crate::store::enqueue::in_batch_duplicate(&job.job, &unique.key),
            });
        }
        decisions[i] = match claimant {
            None => Decision::DuplicateOf(first_in_batch[&key]),
            Some(claimant) if unique.on_duplicate == OnDuplicate::Replace => {
                if replace_waiting(conn, claimant, job, now).await? {
                    Decision::Decided(Enqueued::Replaced(claimant))
                } else {
                    Decision::Decided(Enqueued::Duplicate(claimant))
                }
            }
            Some(claimant) => Decision::Decided(Enqueued::Duplicate(claimant)),
        };
    }
    Ok(decisions)
}

/// Gives a waiting claimant a duplicate's payload (and, unlimited, its time
/// to run), by the rules of PostgreSQL's `jobhost.replace_waiting`: never
/// through the gate. Returns whether it did.
async fn replace_waiting(
    conn: &mut SqliteConnection,
    claimant: i64,
    duplicate: &PreparedJob,
    now: i64,
) -> Result<bool> {
    let due = duplicate.run_at.map_or(now.saturating_add(duplicate.delay_ms), |at| at.timestamp_millis());
    let payload = Json(&duplicate.payload);
    let key = duplicate.concurrency_key.as_deref();
    let unlimited = sqlx::query(
        "UPDATE jobs
         SET payload = $2, run_at = max($3, $4), state = CASE WHEN $3 > $4 THEN 'scheduled' ELSE 'available' END
         WHERE id = $1 AND state IN ('scheduled', 'available') AND concurrency_key IS NULL AND $5 IS NULL",
    )
    .bind(claimant)
    .bind(payload)
    .bind(due)
    .bind(now)
    .bind(key)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if unlimited > 0 {
        return Ok(true);
    }
    let limited = sqlx::query(
        "UPDATE jobs SET payload = $2 WHERE id = $1 AND state IN ('scheduled', 'available') AND concurrency_key = $3",
    )
    .bind(claimant)
    .bind(payload)
    .bind(key)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(limited > 0)
}

/// Records the keys of newly inserted `while_executing` jobs (id, type,
/// key), claimed when a run starts, and claims the `until_executed` ones
/// (whose claim is their only record: 0021_claims_hold_their_keys.sql).
pub async fn record(conn: &mut SqliteConnection, jobs: &[(i64, &str, &PreparedUnique)], now: i64) -> Result<()> {
    let keyed: Vec<(i64, &str, &str, bool)> =
        jobs.iter().map(|(id, job, u)| (*id, *job, u.key.as_str(), u.while_executing)).collect();
    if keyed.is_empty() {
        return Ok(());
    }
    let list = json_list(&keyed);
    sqlx::query(
        "INSERT INTO unique_keys (job_id, job, unique_key, while_executing)
         SELECT k.value ->> 0, k.value ->> 1, k.value ->> 2, 1 FROM json_each($1) k WHERE k.value ->> 3",
    )
    .bind(&list)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO unique_claims (job, unique_key, job_id, claimed_at)
         SELECT k.value ->> 1, k.value ->> 2, k.value ->> 0, $2 FROM json_each($1) k WHERE NOT (k.value ->> 3)",
    )
    .bind(&list)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Claims the keys of the `while_executing` jobs just leased, each bound
/// to its run's token. The fetch passed over jobs whose key is held and
/// leased at most one job per key, so every claim is free.
pub async fn claim_runs(conn: &mut SqliteConnection, runs: &[(i64, i64)], now: i64) -> Result<()> {
    if runs.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO unique_claims (job, unique_key, job_id, lease_token, claimed_at)
         SELECT k.job, k.unique_key, k.job_id, r.value ->> 1, $2
         FROM json_each($1) r
         JOIN unique_keys k ON k.job_id = r.value ->> 0 AND k.while_executing",
    )
    .bind(json_list(runs))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A job an operator brought back from the archive takes its uniqueness
/// key again, rendered by its type's current configuration, as a new
/// enqueue would; while another job holds the key, the retry is refused.
///
/// # Errors
/// [`Error::Duplicate`] naming the holder, a payload the key cannot be
/// rendered from, or the database.
pub async fn reclaim(conn: &mut SqliteConnection, id: i64, now: i64) -> Result<()> {
    let (job, Json(payload)): (String, Json<serde_json::Value>) =
        sqlx::query_as("SELECT job, payload FROM jobs WHERE id = $1").bind(id).fetch_one(&mut *conn).await?;
    let configs = super::fleet::job_types_get(&mut *conn, std::slice::from_ref(&job)).await?;
    let Some(unique) = configs.get(&job).and_then(|c| c.unique.as_ref()) else {
        return Ok(());
    };
    let key = unique.key.render(&payload).map_err(|e| Error::InvalidEnqueue(format!("job {job:?}: unique {e}")))?;
    let while_executing = unique.strategy == crate::types::UniqueStrategy::WhileExecuting;
    if !while_executing {
        let holder: Option<i64> =
            sqlx::query_scalar("SELECT job_id FROM unique_claims WHERE job = $1 AND unique_key = $2")
                .bind(&job)
                .bind(&key)
                .fetch_optional(&mut *conn)
                .await?;
        if let Some(claimant) = holder {
            return Err(Error::Duplicate { job, key, claimant });
        }
    }
    let unique = PreparedUnique { key, while_executing, on_duplicate: OnDuplicate::Raise };
    record(conn, &[(id, &job, &unique)], now).await
}
