//! Events and durable waits in SQLite, inside the writer's transaction (as
//! PostgreSQL's functions/workflow_waits_*.sql and event_send.sql): a
//! step's wait armed when its dependencies have ended ([`arm`], from
//! `workflow::settle`), ended once by an event, its time or its timeout
//! ([`end`]), after which `settle` releases the step before the write
//! commits. One writer at a time holds the file, so an event is either
//! written before a wait is armed (and found by its look back) or after
//! (and finds the wait): guarantee 17 without a lock of its own. The
//! writes that end waits and release their steps are `sqlite::event`'s.

use std::collections::{BTreeMap, HashMap};

use sqlx::SqliteConnection;
use sqlx::types::Json;

use super::encode::{json_list, time_of};
use crate::store::Result;
use crate::store::enqueue::EnqueueLimits;
use crate::store::wait::{
    PreparedWait, SentEvent, StepWait, TriggeredJob, WaitEnd, match_one, matches, probes, render_later,
};
use crate::store::workflow::{EndedWait, IfFailed};

/// Stores the waits of new steps (`(step id, wait)`).
pub async fn write(conn: &mut SqliteConnection, waits: &[(i64, &PreparedWait)]) -> Result<()> {
    for (step, wait) in waits {
        sqlx::query(
            "INSERT INTO workflow_waits
                 (step_id, key, match, match_one, sleep_ms, until, timeout_ms, on_timeout, lookback_ms, match_later)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(step)
        .bind(&wait.key)
        .bind(Json(&wait.matching))
        .bind(match_one(&wait.matching))
        .bind(wait.sleep_ms)
        .bind(wait.until.map(|t| t.timestamp_millis()))
        .bind(wait.timeout_ms)
        .bind(wait.on_timeout.as_str())
        .bind(wait.lookback_ms)
        .bind(wait.match_later.as_ref().map(Json))
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// A wait being armed, with what decides whether it is waited for.
type Arming = (
    i64,
    Option<String>,
    Json<BTreeMap<String, String>>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    i64,
    bool,
    Option<Json<BTreeMap<String, String>>>,
);

/// Arms the waits of these ready steps: a sleep gets its due instant (and
/// ends now if that has passed); an event wait its timeout, and looks back
/// for a matching event; a wait not waited for (its workflow cancelled, a
/// dependency that did not complete under a policy that ends the step)
/// ends as skipped. Each step becomes `armed`, or `ended` for `settle`.
pub async fn arm(conn: &mut SqliteConnection, steps: &[i64], now: i64) -> Result<()> {
    let rows: Vec<Arming> = sqlx::query_as(
        "SELECT w.step_id, w.key, w.match, w.sleep_ms, w.until, w.timeout_ms, w.lookback_ms,
                (f.cancelled_at IS NOT NULL OR EXISTS (
                    SELECT 1 FROM workflow_edges e JOIN workflow_steps d ON d.id = e.dep_id
                    WHERE e.step_id = w.step_id AND d.ended_state <> 'completed' AND e.if_failed <> 'run')) AS skipped,
                w.match_later
         FROM workflow_waits w JOIN workflow_steps s ON s.id = w.step_id JOIN workflows f ON f.id = s.workflow_id
         WHERE w.step_id IN (SELECT value FROM json_each($1)) AND w.armed_at IS NULL AND w.ended_by IS NULL
         ORDER BY w.step_id",
    )
    .bind(json_list(steps))
    .fetch_all(&mut *conn)
    .await?;
    for (step, key, mut matching, sleep_ms, until, timeout_ms, lookback_ms, skipped, later) in rows {
        let rendered = match later.filter(|_| !skipped) {
            Some(templates) => Some(render_at_arming(conn, step, &templates.0).await?),
            None => None,
        };
        if let Some(Some(rendered)) = &rendered {
            sqlx::query("UPDATE workflow_waits SET match = $2, match_one = $3, match_later = NULL WHERE step_id = $1")
                .bind(step)
                .bind(Json(rendered))
                .bind(match_one(rendered))
                .execute(&mut *conn)
                .await?;
            matching = Json(rendered.clone());
        }
        let (due, ended, event) = if skipped {
            (None, Some(WaitEnd::Skipped), None)
        } else if let Some(None) = rendered {
            (None, Some(WaitEnd::Unmatched), None)
        } else if key.is_none() {
            let due = until.unwrap_or_else(|| now.saturating_add(sleep_ms.unwrap_or(0)));
            (Some(due), (due <= now).then_some(WaitEnd::Time), None)
        } else {
            let event = match (lookback_ms > 0, &key) {
                (true, Some(key)) => looked_back(conn, key, &matching.0, now - lookback_ms).await?,
                _ => None,
            };
            (timeout_ms.map(|ms| now.saturating_add(ms)), event.map(|_| WaitEnd::Event), event)
        };
        sqlx::query(
            "UPDATE workflow_waits SET armed_at = $2, due_at = $3, ended_by = $4, ended_at = CASE WHEN $4 IS NULL
             THEN NULL ELSE $2 END, event_id = $5 WHERE step_id = $1",
        )
        .bind(step)
        .bind(now)
        .bind(due)
        .bind(ended.map(WaitEnd::as_str))
        .bind(event)
        .execute(&mut *conn)
        .await?;
        if let Some(event) = event {
            sqlx::query("UPDATE events SET released = released + 1 WHERE id = $1")
                .bind(event)
                .execute(&mut *conn)
                .await?;
        }
        sqlx::query("UPDATE workflow_steps SET wait = $2 WHERE id = $1")
            .bind(step)
            .bind(if ended.is_some() { "ended" } else { "armed" })
            .execute(&mut *conn)
            .await?;
    }
    // A step marked waiting without a wait to arm is not held: released as is.
    sqlx::query(
        "UPDATE workflow_steps SET wait = 'ended' WHERE id IN (SELECT value FROM json_each($1)) AND wait = 'waiting'",
    )
    .bind(json_list(steps))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A match kept for the arming, rendered from the step's payload and its
/// completed dependencies' outputs, in their order (`wait::render_later`);
/// `None` when it names a field none of them holds.
async fn render_at_arming(
    conn: &mut SqliteConnection,
    step: i64,
    templates: &BTreeMap<String, String>,
) -> Result<Option<BTreeMap<String, String>>> {
    let payload: Json<serde_json::Value> =
        sqlx::query_scalar("SELECT payload FROM workflow_steps WHERE id = $1").bind(step).fetch_one(&mut *conn).await?;
    let outputs: Vec<Json<serde_json::Value>> = sqlx::query_scalar(
        "SELECT d.result FROM workflow_edges e JOIN workflow_steps d ON d.id = e.dep_id
         WHERE e.step_id = $1 AND d.ended_state = 'completed' AND d.result IS NOT NULL ORDER BY d.id",
    )
    .bind(step)
    .fetch_all(&mut *conn)
    .await?;
    let outputs: Vec<serde_json::Value> = outputs.into_iter().map(|o| o.0).collect();
    Ok(render_later(templates, &payload.0, &outputs))
}

/// The newest event of `key` sent since `since` whose payload matches.
async fn looked_back(
    conn: &mut SqliteConnection,
    key: &str,
    matching: &BTreeMap<String, String>,
    since: i64,
) -> Result<Option<i64>> {
    let recent: Vec<(i64, Json<serde_json::Value>)> = sqlx::query_as(
        "SELECT id, payload FROM events WHERE key = $1 AND sent_at >= $2 ORDER BY sent_at DESC, id DESC",
    )
    .bind(key)
    .bind(since)
    .fetch_all(&mut *conn)
    .await?;
    Ok(recent.into_iter().find(|(_, payload)| matches(matching, &payload.0)).map(|(id, _)| id))
}

/// Ends the armed waits of these steps that have not ended, by `how`
/// (`event` names the event): each once, since a wait already ended is
/// passed over. Their steps become `ended`, for `settle` to release before
/// the write commits. Returns how many it ended.
pub async fn end(
    conn: &mut SqliteConnection,
    steps: &[i64],
    how: WaitEnd,
    event: Option<i64>,
    now: i64,
) -> Result<i64> {
    let mut ended = 0;
    for step in steps {
        let done = sqlx::query(
            "UPDATE workflow_waits SET ended_by = $2, ended_at = $3, event_id = $4
             WHERE step_id = $1 AND ended_by IS NULL AND armed_at IS NOT NULL",
        )
        .bind(step)
        .bind(how.as_str())
        .bind(now)
        .bind(event)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if done > 0 {
            sqlx::query("UPDATE workflow_steps SET wait = 'ended' WHERE id = $1")
                .bind(step)
                .execute(&mut *conn)
                .await?;
            ended += 1;
        }
    }
    Ok(ended)
}

/// How the waits of these steps (released now) ended.
pub async fn ended_of(conn: &mut SqliteConnection, steps: &[i64]) -> Result<HashMap<i64, EndedWait>> {
    type Row = (i64, Option<String>, String, String, Option<Json<serde_json::Value>>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT w.step_id, w.key, w.ended_by, w.on_timeout, e.payload
         FROM workflow_waits w LEFT JOIN events e ON e.id = w.event_id
         WHERE w.step_id IN (SELECT value FROM json_each($1)) AND w.ended_by IS NOT NULL",
    )
    .bind(json_list(steps))
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|(step, key, ended_by, on_timeout, event)| {
            Ok((
                step,
                EndedWait {
                    key,
                    ended_by: WaitEnd::decode(&ended_by)?,
                    on_timeout: IfFailed::decode(&on_timeout)?,
                    event: event.map(|e| e.0),
                },
            ))
        })
        .collect()
}

/// Marks the waits of these steps, cancelled with their workflow, ended.
pub async fn skip(conn: &mut SqliteConnection, steps: &[i64], now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE workflow_waits SET ended_by = 'skipped', ended_at = $2
         WHERE step_id IN (SELECT value FROM json_each($1)) AND ended_by IS NULL",
    )
    .bind(json_list(steps))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The waits of a workflow's steps, by step id, as shown.
pub async fn shown(conn: &sqlx::SqlitePool, workflow_id: i64) -> Result<HashMap<i64, StepWait>> {
    type Row = (
        i64,
        Option<String>,
        Json<BTreeMap<String, String>>,
        Option<i64>,
        Option<i64>,
        String,
        Option<String>,
        Option<i64>,
        Option<Json<BTreeMap<String, String>>>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT w.step_id, w.key, w.match, w.armed_at, w.due_at, w.on_timeout, w.ended_by, w.event_id,
                w.match_later
         FROM workflow_waits w JOIN workflow_steps s ON s.id = w.step_id WHERE s.workflow_id = $1",
    )
    .bind(workflow_id)
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|(step, key, matching, armed_at, due_at, on_timeout, ended_by, event_id, later)| {
            Ok((
                step,
                StepWait {
                    key,
                    matching: matching.0,
                    armed_at: armed_at.map(time_of),
                    due_at: due_at.map(time_of),
                    on_timeout: IfFailed::decode(&on_timeout)?,
                    ended_by: ended_by.as_deref().map(WaitEnd::decode).transpose()?,
                    event_id,
                    match_later: later.map(|l| l.0),
                },
            ))
        })
        .collect()
}

/// Sends an event in the writer's transaction; `settle` then releases the
/// steps whose waits it ended.
pub async fn send(
    conn: &mut SqliteConnection,
    key: &str,
    payload: &serde_json::Value,
    idempotency_key: Option<&str>,
    source: &str,
    limits: &EnqueueLimits,
    now: i64,
) -> Result<SentEvent> {
    if let Some(idempotency) = idempotency_key {
        let earlier: Option<(i64, i64, Json<Vec<TriggeredJob>>)> =
            sqlx::query_as("SELECT id, released, jobs FROM events WHERE idempotency_key = $1")
                .bind(idempotency)
                .fetch_optional(&mut *conn)
                .await?;
        if let Some((id, released, jobs)) = earlier {
            return Ok(SentEvent { id, released, duplicate: true, jobs: jobs.0 });
        }
    }
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO events (key, payload, idempotency_key, source, sent_at) VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(key)
    .bind(Json(payload))
    .bind(idempotency_key)
    .bind(source)
    .bind(now)
    .fetch_one(&mut *conn)
    .await?;
    let jobs = super::trigger::enqueue_subscribers(conn, id, key, payload, limits, now).await?;
    // Waits matching one field are found by the event's own fields; the
    // rest (no field, or several) are checked.
    let open: Vec<(i64, Json<BTreeMap<String, String>>)> = sqlx::query_as(
        "SELECT step_id, match FROM workflow_waits
         WHERE key = $1 AND ended_by IS NULL AND armed_at IS NOT NULL
           AND (match_one IN (SELECT value FROM json_each($2)) OR match_one IS NULL)
         ORDER BY step_id",
    )
    .bind(key)
    .bind(json_list(&probes(payload)))
    .fetch_all(&mut *conn)
    .await?;
    let hits: Vec<i64> = open.into_iter().filter(|(_, m)| matches(&m.0, payload)).map(|(step, _)| step).collect();
    let released = end(conn, &hits, WaitEnd::Event, Some(id), now).await?;
    if released > 0 {
        sqlx::query("UPDATE events SET released = $2 WHERE id = $1")
            .bind(id)
            .bind(released)
            .execute(&mut *conn)
            .await?;
    }
    Ok(SentEvent { id, released, duplicate: false, jobs })
}
