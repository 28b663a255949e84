//! Uniqueness claims in PostgreSQL, taken in the enqueuer's transaction
//! (see `jobhost.claim_unique` in 0007_uniqueness.sql, which also says how
//! claims are released and why a stale run cannot release one).

use sqlx::PgConnection;
use sqlx::types::Json;

use crate::store::enqueue::PreparedJob;
use crate::store::{Enqueued, Error, Result};
use crate::types::OnDuplicate;

/// Takes the jobs' ids, claims their `until_executed` keys and records
/// their `while_executing` keys, in one call (`jobhost.claim_new_keys`,
/// 0029_claim_new_keys.sql as 0043 last replaced it), and decides each duplicate by its
/// `on_duplicate`. Returns the ids, in input order, and per job `None`
/// when it is to be written or what became of it as a duplicate. The
/// claims are attached: each job written must carry its key on its row
/// ([`attached_key`]), by which the archive gives the claim back.
///
/// # Errors
/// A duplicate whose type says `raise` ([`Error::Duplicate`]), or the database.
pub async fn claim(conn: &mut PgConnection, jobs: &[&PreparedJob]) -> Result<(Vec<i64>, Vec<Option<Enqueued>>)> {
    let (ids, claimants): (Vec<i64>, Vec<Option<i64>>) =
        sqlx::query_as("SELECT ids, claimants FROM jobhost.claim_new_keys($1, $2, $3, attach => true)")
            .bind(jobs.iter().map(|j| j.job.as_str()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.unique.as_ref().map(|u| u.key.as_str())).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.unique.as_ref().is_some_and(|u| u.while_executing)).collect::<Vec<_>>())
            .fetch_one(&mut *conn)
            .await?;
    if ids.len() != jobs.len() || claimants.len() != jobs.len() {
        let (ids, claimants) = (ids.len(), claimants.len());
        return Err(Error::Decode(format!("{ids} ids and {claimants} claimants for {} jobs", jobs.len())));
    }
    let mut decided = vec![None; jobs.len()];
    for (i, claimant) in claimants.into_iter().enumerate() {
        let (Some(claimant), Some(unique)) = (claimant, jobs[i].unique.as_ref()) else { continue };
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
    Ok((ids, decided))
}

/// The key a job written after [`claim`] carries on its row: its
/// `until_executed` key, whose claim it holds; none for a `while_executing`
/// key, claimed only by a run.
pub fn attached_key(job: &PreparedJob) -> Option<&str> {
    job.unique.as_ref().filter(|u| !u.while_executing).map(|u| u.key.as_str())
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
