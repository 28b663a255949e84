//! The API's schedules made at run time (`/api/schedules/{job}/{key}`):
//! written with `PUT` (an upsert), paused, resumed, ticked now and removed;
//! writing and removing needs an admin, pausing, resuming and ticking an
//! operator not limited to queues.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::AppState;
use super::access::{Caller, within_queues};
use super::error::ApiError;
use crate::store::keyed_schedule::{KeyedSchedule, Overlap};
use crate::store::token::Role;

type ApiResult = Result<Response, ApiError>;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/schedules/keyed", get(list))
        .route("/api/schedules/{job}/{key}", get(get_one).put(put).delete(delete))
        .route("/api/schedules/{job}/{key}/{verb}", post(act))
}

/// A schedule's body: everything but the type and key, which the path names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleBody {
    cron: String,
    #[serde(default)]
    time_zone: Option<String>,
    #[serde(default)]
    payload: Option<serde_json::Value>,
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    jitter_ms: u64,
    #[serde(default)]
    backfill: Option<u32>,
    #[serde(default)]
    starts_at: Option<DateTime<Utc>>,
    #[serde(default)]
    ends_at: Option<DateTime<Utc>>,
    #[serde(default)]
    paused: bool,
    #[serde(default)]
    note: String,
}

/// An action's body: a pause's optional note; a backfill's range.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActBody {
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    from: Option<DateTime<Utc>>,
    #[serde(default)]
    to: Option<DateTime<Utc>>,
}

/// The list's filter and page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    job: Option<String>,
    /// `JOB/KEY`: the page starts after this schedule (the last one of the
    /// page before).
    after: Option<String>,
    /// How many; default [`LIST_DEFAULT`], at most [`LIST_MOST`].
    limit: Option<i64>,
}

/// A list page's length unless the caller asks for another.
const LIST_DEFAULT: i64 = 500;

/// The longest page of the list.
pub const LIST_MOST: i64 = 5_000;

/// A list's `after`, `JOB/KEY`, as (type, key): a type's name holds no `/`,
/// so the first one ends it and the key may hold any.
pub fn after_of(after: &str) -> Option<(&str, &str)> {
    after.split_once('/')
}

fn path_of(path: Result<Path<(String, String)>, PathRejection>) -> Result<(String, String), ApiError> {
    path.map(|Path(p)| p).map_err(|e| ApiError::bad_request(e.body_text()))
}

fn missing(job: &str, key: &str) -> ApiError {
    ApiError::not_found(format!("there is no schedule {job} {key:?}"))
}

async fn list(State(state): State<AppState>, query: Result<Query<ListQuery>, QueryRejection>) -> ApiResult {
    let query = query.map(|Query(q)| q).map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = query.limit.unwrap_or(LIST_DEFAULT);
    if !(1..=LIST_MOST).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit must be 1 to {LIST_MOST}")));
    }
    let after = match query.after.as_deref() {
        Some(after) => Some(after_of(after).ok_or_else(|| ApiError::bad_request("after must be JOB/KEY"))?),
        None => None,
    };
    Ok(Json(state.store.keyed_schedules_page(query.job.as_deref(), after, limit).await?).into_response())
}

async fn get_one(State(state): State<AppState>, path: Result<Path<(String, String)>, PathRejection>) -> ApiResult {
    let (job, key) = path_of(path)?;
    let found = state.store.keyed_schedules(Some(&job), Some(&key)).await?;
    found.into_iter().next().map(|status| Json(status).into_response()).ok_or_else(|| missing(&job, &key))
}

async fn put(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Json<ScheduleBody>, JsonRejection>,
) -> ApiResult {
    caller.check_role(&state.access, true, Role::Admin)?;
    let (job, key) = path_of(path)?;
    let body = super::api::body_of(body)?;
    let payload = match body.payload {
        None => serde_json::Map::new(),
        Some(serde_json::Value::Object(payload)) => payload,
        Some(_) => return Err(ApiError::bad_request("invalid schedule: payload: must be a JSON object")),
    };
    let overlap = match body.overlap.as_deref().map(Overlap::parse).transpose() {
        Ok(overlap) => overlap.unwrap_or_default(),
        Err(reason) => return Err(ApiError::bad_request(format!("invalid schedule: {reason}"))),
    };
    let schedule = KeyedSchedule {
        time_zone: body.time_zone.unwrap_or_else(|| "UTC".into()),
        payload,
        overlap,
        jitter_ms: body.jitter_ms,
        backfill: body.backfill.unwrap_or(1),
        starts_at: body.starts_at,
        ends_at: body.ends_at,
        paused: body.paused,
        note: body.note,
        ..KeyedSchedule::new(job.clone(), key.clone(), body.cron)
    };
    let created = caller.store(&state.store).keyed_schedule_upsert(&schedule).await?;
    let status = state.store.keyed_schedules(Some(&job), Some(&key)).await?;
    let code = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((code, Json(status.into_iter().next())).into_response())
}

async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult {
    caller.check_role(&state.access, true, Role::Admin)?;
    let (job, key) = path_of(path)?;
    if caller.store(&state.store).keyed_schedule_remove(&job, &key).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(missing(&job, &key))
    }
}

/// Pause, resume or trigger, answered with the schedule as it now is.
async fn act(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, String, String)>, PathRejection>,
    body: axum::body::Bytes,
) -> ApiResult {
    let holder = caller.check_role(&state.access, true, Role::Operate)?;
    within_queues(holder, None, "act on a schedule")?;
    let (job, key, action) = path.map(|Path(p)| p).map_err(|e| ApiError::bad_request(e.body_text()))?;
    // The body is optional (a pause without a note, a trigger): none is
    // the defaults, and one that does not read is refused as JSON says why.
    let body: ActBody = match body.is_empty() {
        true => ActBody::default(),
        false => serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(super::api::without_type_names(format!("the body does not read: {e}")))
        })?,
    };
    let note = body.note;
    if action == "backfill" {
        let (Some(from), Some(to)) = (body.from, body.to) else {
            return Err(ApiError::bad_request("a backfill's body needs `from` and `to`"));
        };
        return match caller.store(&state.store).keyed_schedule_backfill(&job, &key, from, to).await? {
            Some(done) => Ok(Json(done).into_response()),
            None => Err(missing(&job, &key)),
        };
    }
    let done = match action.as_str() {
        "pause" => caller.store(&state.store).keyed_schedule_pause(&job, &key, true, note.as_deref()).await?,
        "resume" => caller.store(&state.store).keyed_schedule_pause(&job, &key, false, None).await?,
        "trigger" => caller.store(&state.store).keyed_schedule_trigger(&job, &key).await?,
        other => {
            return Err(ApiError::not_found(format!("no action {other:?}: pause, resume, trigger or backfill")));
        }
    };
    if !done {
        return Err(missing(&job, &key));
    }
    let status = state.store.keyed_schedules(Some(&job), Some(&key)).await?;
    Ok(Json(status.into_iter().next()).into_response())
}
