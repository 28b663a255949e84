//! Waiting for a job to end, in PostgreSQL: the waiter registers in
//! `jobhost.job_waits`, and the archive announces on `jobhost_finished` the
//! jobs someone waits for (migrations/postgres/0009_batches.sql).

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;

use crate::store::{Error, JobDetail, Result};

/// The channel on which the archive announces jobs someone waits for.
const FINISHED: &str = "jobhost_finished";

/// How soon a waiter looks again without a notification: at first soon (a
/// job ending while the wait was being registered is announced to nobody),
/// then rarely (a notification lost with a dropped connection).
const FIRST_LOOK: Duration = Duration::from_millis(10);
const LAST_LOOK: Duration = Duration::from_secs(1);

/// Waits until job `id` has ended, up to `timeout`: registers the wait (so
/// the archive announces the job's end), then reads the job at each
/// announcement. `None` when the time ran out first.
pub async fn wait(pool: &PgPool, id: i64, timeout: Duration) -> Result<Option<JobDetail>> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(FINISHED).await?;
    let wait_id: i64 = sqlx::query_scalar("INSERT INTO jobhost.job_waits (job_id) VALUES ($1) RETURNING id")
        .bind(id)
        .fetch_one(pool)
        .await?;
    let waited = watch(pool, &mut listener, id, deadline).await;
    if let Err(error) = sqlx::query("DELETE FROM jobhost.job_waits WHERE id = $1").bind(wait_id).execute(pool).await {
        tracing::debug!(%error, "could not remove a finished wait; the job's end removes it");
    }
    waited
}

async fn watch(
    pool: &PgPool,
    listener: &mut PgListener,
    id: i64,
    deadline: tokio::time::Instant,
) -> Result<Option<JobDetail>> {
    let mut nap = FIRST_LOOK;
    loop {
        match super::operate::get(pool, id).await? {
            None => return Err(Error::JobState { id, reason: "does not exist".into() }),
            Some(job) if job.row.state.is_final() => return Ok(Some(job)),
            Some(_) => {}
        }
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::select! {
                heard = listener.recv() => match heard {
                    Ok(note) if announces(note.payload(), id) => break,
                    Ok(_) => continue,
                    // It reconnects by itself; what it missed, the next look finds.
                    Err(_) => break,
                },
                () = tokio::time::sleep(nap.min(deadline - now)) => {
                    nap = (nap * 2).min(LAST_LOOK);
                    break;
                }
            }
        }
    }
}

/// Whether a notification names job `id`; an empty one names every job.
fn announces(payload: &str, id: i64) -> bool {
    payload.is_empty() || payload.split(',').any(|p| p.parse() == Ok(id))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_announcement_names_its_jobs_or_all() {
        assert!(super::announces("3,17,20", 17));
        assert!(!super::announces("3,170", 17));
        assert!(super::announces("", 17));
    }
}
