//! Waiting for a job to end, in PostgreSQL: the waiter registers in
//! `jobhost.job_waits`, and the archive announces on `jobhost_finished` the
//! jobs someone waits for (migrations/postgres/0009_batches.sql).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{OnceCell, broadcast};
use tokio::time::Instant;

use crate::store::{Error, JobDetail, Result};

/// The channel on which the archive announces jobs someone waits for.
const FINISHED: &str = "jobhost_finished";

/// How soon a waiter looks again without a notification: at first soon (a
/// job ending while the wait was being registered is announced to nobody),
/// then rarely (a notification lost with a dropped connection).
const FIRST_LOOK: Duration = Duration::from_millis(10);
const LAST_LOOK: Duration = Duration::from_secs(1);

/// The archive's announcements of waited-for jobs' ends, heard on one
/// connection per store however many wait, and passed on to each waiter.
#[derive(Clone, Default)]
pub struct Announcements {
    sender: Arc<OnceCell<broadcast::Sender<String>>>,
}

impl Announcements {
    /// Hears the announcements from now on, starting the one LISTEN the
    /// first time (on `listeners`, a pool apart from the one that does the
    /// work, so waiters never take the work's connections).
    async fn subscribe(&self, listeners: &PgPool) -> Result<broadcast::Receiver<String>> {
        let sender = self
            .sender
            .get_or_try_init(|| async {
                let mut listener = PgListener::connect_with(listeners).await?;
                listener.listen(FINISHED).await?;
                let (sender, _) = broadcast::channel(1024);
                let announce = sender.clone();
                tokio::spawn(async move {
                    loop {
                        // It reconnects by itself after an error; an empty
                        // announcement has every waiter look, for what it missed.
                        match listener.recv().await {
                            Ok(note) => drop(announce.send(note.payload().to_string())),
                            Err(error) => {
                                tracing::debug!(%error, "the listener for waits lost its connection");
                                drop(announce.send(String::new()));
                                tokio::time::sleep(Duration::from_millis(500)).await;
                            }
                        }
                    }
                });
                Ok::<_, sqlx::Error>(sender)
            })
            .await?;
        Ok(sender.subscribe())
    }
}

/// Waits until job `id` has ended, up to `timeout`: registers the wait (so
/// the archive announces the job's end), then reads the job at each
/// announcement. `None` when the time ran out first.
pub async fn wait(
    pool: &PgPool,
    listeners: &PgPool,
    announcements: &Announcements,
    id: i64,
    timeout: Duration,
) -> Result<Option<JobDetail>> {
    let deadline = Instant::now() + timeout;
    let mut heard = announcements.subscribe(listeners).await?;
    let wait_id: i64 = sqlx::query_scalar("INSERT INTO jobhost.job_waits (job_id) VALUES ($1) RETURNING id")
        .bind(id)
        .fetch_one(pool)
        .await?;
    let waited = watch(pool, &mut heard, id, deadline).await;
    if let Err(error) = sqlx::query("DELETE FROM jobhost.job_waits WHERE id = $1").bind(wait_id).execute(pool).await {
        tracing::debug!(%error, "could not remove a finished wait; the job's end removes it");
    }
    waited
}

/// Reads the job, then waits for its announcement or the next look, whichever
/// comes first; announcements of other jobs do not put the look off.
async fn watch(
    pool: &PgPool,
    heard: &mut broadcast::Receiver<String>,
    id: i64,
    deadline: Instant,
) -> Result<Option<JobDetail>> {
    let mut nap = FIRST_LOOK;
    loop {
        match super::operate::get(pool, id).await? {
            None => return Err(Error::NotFound { id }),
            Some(job) if job.row.state.is_final() => return Ok(Some(job)),
            Some(_) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        let look_at = (now + nap).min(deadline);
        nap = (nap * 2).min(LAST_LOOK);
        loop {
            tokio::select! {
                note = heard.recv() => match note {
                    Ok(note) if !announces(&note, id) => continue,
                    // Missed some (lagged): look now.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => {
                        tokio::time::sleep_until(look_at).await;
                        break;
                    }
                },
                () = tokio::time::sleep_until(look_at) => break,
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
