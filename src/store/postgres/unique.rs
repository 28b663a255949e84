//! Uniqueness claims in PostgreSQL, taken in the enqueuer's transaction
//! (see `functions/claim_unique.sql`; 0007_uniqueness.sql says how
//! claims are released and why a stale run cannot release one).

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::PgConnection;
use sqlx::types::Json;

use crate::store::enqueue::PreparedJob;
use crate::store::{Enqueued, Error, Result};
use crate::types::OnDuplicate;

/// Takes the jobs' ids, claims their `until_executed` keys and records
/// their `while_executing` keys, in one call (`jobhost.claim_new_keys`,
/// 0029_claim_new_keys.sql as 0045 last replaced it), and decides each
/// duplicate ([`decide`]). Returns the ids, in input order, and per job
/// `None` when it is to be written or what became of it as a duplicate.
/// The claims are attached: each job written must carry its key on its
/// row ([`attached_key`]), by which the archive gives the claim back.
///
/// # Errors
/// A duplicate whose type says `raise` ([`Error::Duplicate`]), or the database.
pub async fn claim(conn: &mut PgConnection, jobs: &[&PreparedJob]) -> Result<(Vec<i64>, Vec<Option<Enqueued>>)> {
    let (ids, claimants): (Vec<i64>, Vec<Option<i64>>) =
        sqlx::query_as("SELECT ids, claimants FROM jobhost.claim_new_keys($1, $2, $3, attach => true)")
            .bind(jobs.iter().map(|j| j.job.as_str()).collect::<Vec<_>>())
            .bind(keys(jobs))
            .bind(while_executing(jobs))
            .fetch_one(&mut *conn)
            .await?;
    let decided = decide(conn, jobs, &ids, claimants).await?;
    Ok((ids, decided))
}

/// The jobs' uniqueness keys (None for a job without one), as the calls
/// that claim them take them.
pub fn keys<'a>(jobs: &[&'a PreparedJob]) -> Vec<Option<&'a str>> {
    jobs.iter().map(|j| j.unique.as_ref().map(|u| u.key.as_str())).collect()
}

/// Whether each job's key is held only while it runs, as the calls that
/// claim the keys take it.
pub fn while_executing(jobs: &[&PreparedJob]) -> Vec<bool> {
    jobs.iter().map(|j| j.unique.as_ref().is_some_and(|u| u.while_executing)).collect()
}

/// Fewer jobs than this always go in one round trip ([`ClaimPath`]).
const SMALL_CALL: usize = 64;

/// How a store's bulk enqueue claims the keys of its unique jobs: in the
/// same round trip as it writes the jobs that won them
/// (`jobhost.claim_and_insert_jobs`), or claims first and writes after.
/// One round trip is quicker while the calls' keys are new; a call of
/// duplicates would send every job's payload for nothing (a call of 5,000
/// duplicates then costs about what a plain call does, against about two
/// thirds of it claiming first). So a store claims a large call in one
/// round trip until a call finds a duplicate, then claims first until a
/// call finds none; a small call (a duplicate's payload is little to send)
/// always goes in one. A hint only: both ways answer every job alike.
#[derive(Debug, Default)]
pub struct ClaimPath {
    duplicates_last_time: AtomicBool,
}

impl ClaimPath {
    /// Whether `jobs` go in one round trip: the call is small or the
    /// store's last call found no duplicate, every unique job skips its
    /// duplicates and none is
    /// rate-limited. A `replace` rewrites the waiting holder before the
    /// call's jobs are written; a `raise` refuses the call before anything
    /// is written (so its refusal comes before the gate's); a rate-limited
    /// job's start is planned for the jobs written alone.
    pub fn one_call(&self, jobs: &[&PreparedJob]) -> bool {
        (jobs.len() < SMALL_CALL || !self.duplicates_last_time.load(Ordering::Relaxed))
            && jobs
                .iter()
                .all(|j| j.rate.is_none() && j.unique.as_ref().is_none_or(|u| u.on_duplicate == OnDuplicate::Skip))
    }

    /// Remembers whether a call found a duplicate (`decided`, as [`decide`] answered).
    pub fn learn(&self, decided: &[Option<Enqueued>]) {
        self.duplicates_last_time.store(decided.iter().any(Option::is_some), Ordering::Relaxed);
    }
}

/// What becomes of each job of a call given who holds its key (`claimants`,
/// as the claiming call answers them: a job's own id when it holds its
/// key, `None` without a key): `None` for a job that is (or was) written,
/// else its outcome as a duplicate, by its `on_duplicate`.
///
/// # Errors
/// A duplicate whose type says `raise` ([`Error::Duplicate`]), or the database.
pub async fn decide(
    conn: &mut PgConnection,
    jobs: &[&PreparedJob],
    ids: &[i64],
    claimants: Vec<Option<i64>>,
) -> Result<Vec<Option<Enqueued>>> {
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
    Ok(decided)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EnqueueParams;
    use crate::store::enqueue::{EnqueueLimits, prepare, prepare_tests};
    use crate::template::KeyTemplate;
    use crate::types::{RateLimitConfig, UniqueConfig, UniqueStrategy};

    fn unique_job(on_duplicate: OnDuplicate, rate_limited: bool) -> PreparedJob {
        let mut config = prepare_tests::config();
        config.unique = Some(UniqueConfig {
            key: KeyTemplate::parse("{account}").unwrap(),
            strategy: UniqueStrategy::UntilExecuted,
            on_duplicate,
        });
        config.rate_limit = rate_limited.then(|| RateLimitConfig {
            limit: 1,
            period_ms: 1_000,
            key: KeyTemplate::parse("{account}").unwrap(),
        });
        let payload = serde_json::json!({ "account": 1 });
        prepare(EnqueueParams::new("mail", payload), &config, &EnqueueLimits::default()).unwrap()
    }

    #[test]
    fn one_round_trip_until_a_call_finds_a_duplicate_and_after_one_that_finds_none() {
        let (skip, raise) = (unique_job(OnDuplicate::Skip, false), unique_job(OnDuplicate::Raise, false));
        let (replace, paced) = (unique_job(OnDuplicate::Replace, false), unique_job(OnDuplicate::Skip, true));
        let large = vec![&skip; SMALL_CALL];
        let path = ClaimPath::default();
        assert!(path.one_call(&large), "a store's first call");
        for other in [&raise, &replace, &paced] {
            assert!(!path.one_call(&[&skip, other]), "{other:?} needs the claims' answer first");
        }
        path.learn(&[None, Some(Enqueued::Duplicate(7))]);
        assert!(!path.one_call(&large), "a large call after a call that found a duplicate");
        assert!(path.one_call(&large[1..]), "a small call all the same");
        path.learn(&[None, None]);
        assert!(path.one_call(&large), "after a call that found none");
    }
}
