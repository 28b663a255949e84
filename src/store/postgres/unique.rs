//! Uniqueness claims in PostgreSQL, taken in the enqueuer's transaction
//! (see `jobhost.claim_unique` in 0007_uniqueness.sql, which also says how
//! claims are released and why a stale run cannot release one).

use sqlx::PgConnection;
use sqlx::types::Json;

use crate::store::enqueue::{PreparedJob, PreparedUnique};
use crate::store::{Enqueued, Error, Result};
use crate::types::OnDuplicate;

/// `n` job ids, taken from the sequence in order, so a batch's unique jobs
/// can claim their keys before they are inserted.
pub async fn allocate_ids(conn: &mut PgConnection, n: usize) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar("SELECT nextval('jobhost.job_ids') FROM generate_series(1, $1) ORDER BY 1")
        .bind(n as i64)
        .fetch_all(&mut *conn)
        .await?)
}

/// Claims the `until_executed` keys of `jobs` (with the ids chosen for
/// them) and decides each duplicate by its `on_duplicate`. Returns, in
/// input order, `None` for a job that is to be inserted and what became of
/// each duplicate otherwise.
///
/// # Errors
/// A duplicate whose type says `raise` ([`Error::Duplicate`]), or the database.
pub async fn claim(conn: &mut PgConnection, jobs: &[&PreparedJob], ids: &[i64]) -> Result<Vec<Option<Enqueued>>> {
    let claiming: Vec<(usize, &PreparedUnique)> = jobs
        .iter()
        .enumerate()
        .filter_map(|(i, job)| job.unique.as_ref().filter(|u| !u.while_executing).map(|u| (i, u)))
        .collect();
    let mut decided = vec![None; jobs.len()];
    if claiming.is_empty() {
        return Ok(decided);
    }
    let claimants: Vec<(i64, i64)> = sqlx::query_as("SELECT ord, claimant FROM jobhost.claim_unique($1, $2, $3)")
        .bind(claiming.iter().map(|(i, _)| jobs[*i].job.as_str()).collect::<Vec<_>>())
        .bind(claiming.iter().map(|(_, u)| u.key.as_str()).collect::<Vec<_>>())
        .bind(claiming.iter().map(|(i, _)| ids[*i]).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    if claimants.len() != claiming.len() {
        return Err(Error::Decode(format!("{} claims answered for {} keys", claimants.len(), claiming.len())));
    }
    for ((i, unique), (_, claimant)) in claiming.into_iter().zip(claimants) {
        if claimant == ids[i] {
            continue;
        }
        let job = jobs[i];
        decided[i] = Some(match unique.on_duplicate {
            OnDuplicate::Skip => Enqueued::Duplicate(claimant),
            // An earlier job of this same batch: not stored, so not named.
            OnDuplicate::Raise if ids.contains(&claimant) => {
                return Err(crate::store::enqueue::in_batch_duplicate(&job.job, &unique.key));
            }
            OnDuplicate::Raise => {
                return Err(Error::Duplicate { job: job.job.clone(), key: unique.key.clone(), claimant });
            }
            OnDuplicate::Replace if replace_waiting(conn, claimant, job).await? => Enqueued::Replaced(claimant),
            OnDuplicate::Replace => Enqueued::Duplicate(claimant),
        });
    }
    Ok(decided)
}

/// Gives a waiting claimant a duplicate's payload and time to run, as
/// `jobhost.replace_waiting` allows. Returns whether it did.
async fn replace_waiting(conn: &mut PgConnection, claimant: i64, duplicate: &PreparedJob) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT jobhost.replace_waiting($1, $2, coalesce($3, now() + $4 * interval '1 millisecond'), $5)",
    )
    .bind(claimant)
    .bind(Json(&duplicate.payload))
    .bind(duplicate.run_at)
    .bind(duplicate.delay_ms)
    .bind(duplicate.concurrency_key.as_deref())
    .fetch_one(&mut *conn)
    .await?)
}

/// Records the keys of newly inserted unique jobs, which the fetch reads
/// for `while_executing` and the archive's trigger deletes.
pub async fn record_keys(conn: &mut PgConnection, jobs: &[(i64, &PreparedJob)]) -> Result<()> {
    let keyed: Vec<(i64, &str, &PreparedUnique)> =
        jobs.iter().filter_map(|(id, job)| job.unique.as_ref().map(|u| (*id, job.job.as_str(), u))).collect();
    if keyed.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::boolean[])",
    )
    .bind(keyed.iter().map(|(id, _, _)| *id).collect::<Vec<_>>())
    .bind(keyed.iter().map(|(_, job, _)| *job).collect::<Vec<_>>())
    .bind(keyed.iter().map(|(_, _, u)| u.key.as_str()).collect::<Vec<_>>())
    .bind(keyed.iter().map(|(_, _, u)| u.while_executing).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}
