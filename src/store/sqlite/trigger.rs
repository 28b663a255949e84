//! Event triggers in SQLite: the jobs an event enqueues for the job types
//! subscribed to its key (`on_events`), written in the event's own write,
//! so exactly once per event and type. A type whose enqueue is refused (its
//! payload, a `raise` limit) is recorded with the reason, in a savepoint
//! rolled back on its own: the event and the other types' jobs stand.

use sqlx::types::Json;
use sqlx::{Connection, SqliteConnection};

use crate::store::Result;
use crate::store::enqueue::{EnqueueLimits, prepare};
use crate::store::job::EnqueueParams;
use crate::store::wait::TriggeredJob;

/// Enqueues one job of each type subscribed to `key`, with `payload`, and
/// records them with the event `event_id`.
pub async fn enqueue_subscribers(
    conn: &mut SqliteConnection,
    event_id: i64,
    key: &str,
    payload: &serde_json::Value,
    limits: &EnqueueLimits,
    now: i64,
) -> Result<Vec<TriggeredJob>> {
    let subscribers: Vec<(String, Json<serde_json::Value>)> = sqlx::query_as(
        "SELECT name, config FROM job_types
         WHERE EXISTS (SELECT 1 FROM json_each(config, '$.on_events') WHERE value = $1) ORDER BY name",
    )
    .bind(key)
    .fetch_all(&mut *conn)
    .await?;
    let mut jobs = Vec::with_capacity(subscribers.len());
    for (name, Json(config)) in subscribers {
        jobs.push(enqueue_one(conn, name, config, payload, limits, now).await?);
    }
    if !jobs.is_empty() {
        sqlx::query("UPDATE events SET jobs = $2 WHERE id = $1")
            .bind(event_id)
            .bind(Json(&jobs))
            .execute(&mut *conn)
            .await?;
    }
    Ok(jobs)
}

async fn enqueue_one(
    conn: &mut SqliteConnection,
    job: String,
    config: serde_json::Value,
    payload: &serde_json::Value,
    limits: &EnqueueLimits,
    now: i64,
) -> Result<TriggeredJob> {
    let refused = |job: String, error: String| TriggeredJob { job, id: None, error: Some(error) };
    let config = match crate::store::fleet::decode_configs(vec![(job.clone(), config)]) {
        Ok(mut configs) => configs.remove(&job),
        Err(error) => return Ok(refused(job, error.to_string())),
    };
    let Some(config) = config else {
        return Ok(refused(job, "its stored configuration could not be read".into()));
    };
    let prepared = match prepare(EnqueueParams::new(job.clone(), payload.clone()), &config, limits) {
        Ok(prepared) => prepared,
        Err(error) => return Ok(refused(job, error.to_string())),
    };
    let mut savepoint = conn.begin().await?;
    match super::job::insert(&mut savepoint, &[&prepared], now).await {
        Ok(enqueued) => {
            savepoint.commit().await?;
            Ok(TriggeredJob { job, id: enqueued.first().map(|e| e.id()), error: None })
        }
        Err(error) if error.is_refusal() => {
            savepoint.rollback().await?;
            Ok(refused(job, error.to_string()))
        }
        Err(error) => Err(error),
    }
}
