//! The JSON API under `/api`, described in `openapi.json` (served at
//! `/api/openapi.json`; docs/http.md for people). Reads are open; every
//! `POST` needs the token.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::access::{Caller, within_queues};
use super::error::ApiError;
use super::query::{JobQuery, MAX_BULK, MAX_PAGE};
use super::views::{self, BulkAction, QueueAction, QueueActionError};
use crate::store::token::{Role, TokenHolder};
use crate::store::{Cancel, EnqueueParams, Enqueued, NewWorkflow};

/// The OpenAPI description of everything below.
const OPENAPI: &str = include_str!("openapi.json");

/// Jobs per page when the request does not say.
const DEFAULT_PAGE: i64 = 50;

/// Bulk actions per pass when the request does not say.
const DEFAULT_BULK: i64 = 1_000;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/openapi.json", get(openapi))
        .route("/api/health", get(health))
        .route("/api/stats", get(stats))
        .route("/api/throughput", get(throughput))
        .route("/api/history", get(history))
        .route("/api/jobs", get(jobs_list).post(jobs_enqueue))
        .route("/api/audit", get(audit_list))
        .route("/api/jobs/retry", post(jobs_retry_bulk))
        .route("/api/jobs/cancel", post(jobs_cancel_bulk))
        .route("/api/jobs/{id}", get(job_get))
        .route("/api/jobs/{id}/retry", post(job_retry))
        .route("/api/jobs/{id}/cancel", post(job_cancel))
        .route("/api/queues", get(queues))
        .route("/api/queues/{name}/{action}", post(queue_act))
        .route("/api/keys", get(keys))
        .route("/api/rate-keys", get(rate_keys))
        .route("/api/hosts", get(hosts))
        .route("/api/job-types", get(job_types))
        .route("/api/batches", get(batches_list))
        .route("/api/batches/{id}", get(batch_get))
        .route("/api/workflows", get(workflows_list).post(workflow_create))
        .route("/api/workflows/{id}", get(workflow_get))
        .route("/api/workflows/{id}/cancel", post(workflow_cancel))
        .route("/api/events", get(events_list))
        .route("/api/events/{key}", post(event_send))
        .route("/api/schedules", get(schedules))
}

type ApiResult = Result<Response, ApiError>;

fn ok(value: impl serde::Serialize) -> ApiResult {
    Ok(Json(value).into_response())
}

/// An unknown path under `/api`.
pub async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint: see /api/openapi.json")
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

fn query_of<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query.map(|Query(q)| q).map_err(|rejection| ApiError::bad_request(rejection.body_text()))
}

/// The body, or why it does not read: 413 past the size limit, 415 when
/// it is not declared JSON, 400 for anything else wrong with it.
pub(super) fn body_of<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(b)| b).map_err(|rejection| {
        let status = match rejection.status() {
            status @ (StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE) => status,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError { status, message: without_type_names(rejection.body_text()) }
    })
}

/// serde names the Rust type a body maps to ("expected struct EnqueueBody
/// with 7 elements"): a client is told what to send instead.
pub(super) fn without_type_names(text: String) -> String {
    let Some(at) = text.find("expected struct ") else { return text };
    // serde's sentence starts after the rejection's own "…: " prefix.
    let start = text[..at].rfind(": ").map_or(0, |colon| colon + 2);
    let end = text[at..].find(" at line").map_or(text.len(), |line| at + line);
    format!("{}the body must be a JSON object{}", &text[..start], &text[end..])
}

fn id_of(id: Result<Path<i64>, PathRejection>) -> Result<i64, ApiError> {
    id.map(|Path(id)| id).map_err(|_| ApiError::bad_request("the id in the path must be a whole number"))
}

async fn health(State(state): State<AppState>) -> ApiResult {
    match state.store.database_ping().await {
        Ok(()) => ok(json!({ "database": "ok" })),
        Err(error) => {
            // Anyone may ask: the database's own words go to the log only.
            tracing::warn!(%error, "a health check found the database unavailable");
            Ok((StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "database": "unavailable" }))).into_response())
        }
    }
}

async fn stats(State(state): State<AppState>) -> ApiResult {
    ok(state.store.job_stats().await?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowQuery {
    window: Option<String>,
}

async fn throughput(State(state): State<AppState>, query: Result<Query<WindowQuery>, QueryRejection>) -> ApiResult {
    let window = match query_of(query)?.window {
        None => 60.0,
        Some(text) => humantime::parse_duration(&text)
            .map_err(|e| ApiError::bad_request(format!("window must be a duration like 60s or 1h: {e}")))?
            .as_secs_f64(),
    };
    if !(1.0..=7.0 * 86_400.0).contains(&window) {
        return Err(ApiError::bad_request("window must be between 1s and 7days"));
    }
    ok(views::throughput(&state.store, window).await?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    range: Option<String>,
    #[serde(rename = "type")]
    job_type: Option<String>,
}

/// The fleet's (or one type's) points over a range, as the dashboard's
/// charts draw them.
async fn history(State(state): State<AppState>, query: Result<Query<HistoryQuery>, QueryRejection>) -> ApiResult {
    let query = query_of(query)?;
    let range = match query.range.as_deref() {
        None => crate::store::history::HistoryRange::Hour,
        Some(name) => crate::store::history::HistoryRange::parse(name)
            .ok_or_else(|| ApiError::bad_request(format!("range must be 1h, 24h or 7d, got {name:?}")))?,
    };
    let points = state.store.history(range, query.job_type.as_deref()).await?;
    ok(serde_json::json!({
        "range": range,
        "step_minutes": range.step_minutes(),
        "type": query.job_type,
        "points": points,
    }))
}

async fn jobs_list(State(state): State<AppState>, query: Result<Query<JobQuery>, QueryRejection>) -> ApiResult {
    let filter = query_of(query)?.filter(DEFAULT_PAGE, MAX_PAGE).map_err(ApiError::bad_request)?;
    let jobs = state.store.job_list(&filter).await?;
    // A full page may have more after it; the cursor is its last id.
    let next = (jobs.len() as i64 == filter.limit).then(|| jobs.last().map(|j| j.id)).flatten();
    ok(json!({ "jobs": jobs, "next": next }))
}

/// An enqueue as the API takes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnqueueBody {
    job: String,
    #[serde(default)]
    payload: Option<Value>,
    queue: Option<String>,
    priority: Option<i16>,
    /// A duration like `30s` or `5m`.
    delay: Option<String>,
    run_at: Option<DateTime<Utc>>,
    batch: Option<i64>,
}

async fn jobs_enqueue(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Json<EnqueueBody>, JsonRejection>,
) -> ApiResult {
    let holder = operator(&state, &caller)?;
    let body = body_of(body)?;
    // A token limited to queues names the queue: the type's own is not
    // known until the store renders the job.
    within_queues(holder, body.queue.as_deref(), "enqueue without naming one of its queues")?;
    if body.batch.is_some() {
        // A batch may hold jobs of any queue.
        within_queues(holder, None, "add to a batch")?;
    }
    let delay_ms = body.delay.as_deref().map(delay_of).transpose()?;
    if delay_ms.is_some() && body.run_at.is_some() {
        return Err(ApiError::bad_request("give delay or run_at, not both"));
    }
    let params = EnqueueParams {
        queue: body.queue,
        priority: body.priority,
        run_at: body.run_at,
        delay_ms,
        batch_id: body.batch,
        traceparent: trace_of(&headers),
        ..EnqueueParams::new(body.job.clone(), body.payload.unwrap_or_else(|| json!({})))
    };
    let outcome = caller.store(&state.store).job_enqueue_outcomes(&[params]).await?;
    let outcome = outcome.first().copied().ok_or_else(|| ApiError::bad_request("nothing was enqueued"))?;
    let (status, body) = match outcome {
        Enqueued::New(id) => {
            state.metrics.enqueued(&body.job, 1);
            (StatusCode::CREATED, json!({ "id": id, "duplicate": false }))
        }
        Enqueued::Duplicate(id) => (StatusCode::OK, json!({ "id": id, "duplicate": true, "replaced": false })),
        Enqueued::Replaced(id) => (StatusCode::OK, json!({ "id": id, "duplicate": true, "replaced": true })),
    };
    Ok((status, Json(body)).into_response())
}

/// The trace the caller's request belongs to, from its `traceparent`
/// header: the job's run joins it. A header that is not a valid trace
/// context is ignored, as the W3C rules say (the run starts a trace).
fn trace_of(headers: &HeaderMap) -> Option<String> {
    let header = headers.get(crate::telemetry::context::TRACEPARENT)?.to_str().ok()?;
    crate::telemetry::context::canonical(header).ok()
}

/// A delay as milliseconds, from a duration like `30s`. One past what
/// milliseconds hold stays past the store's bound, which refuses it with
/// the message every enqueue path gives.
fn delay_of(text: &str) -> Result<u64, ApiError> {
    let delay = humantime::parse_duration(text)
        .map_err(|e| ApiError::bad_request(format!("delay must be a duration like 30s or 5m: {e}")))?;
    Ok(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
}

async fn job_get(State(state): State<AppState>, id: Result<Path<i64>, PathRejection>) -> ApiResult {
    let id = id_of(id)?;
    match state.store.job_get(id).await? {
        Some(job) => ok(crate::attempts::with_attempts(&job)),
        None => Err(ApiError::not_found(format!("job {id} does not exist"))),
    }
}

/// The operator a change comes from: what [`super::guard::admit`] let
/// through, checked again where the change is made.
fn operator<'a>(state: &AppState, caller: &'a Caller) -> Result<&'a TokenHolder, ApiError> {
    Ok(caller.check_role(&state.access, true, Role::Operate)?)
}

/// Checks that `holder` may change job `id`, by the queue it is in.
pub(super) async fn job_within_queues(
    state: &AppState,
    holder: &TokenHolder,
    id: i64,
    what: &str,
) -> Result<(), ApiError> {
    if holder.queues.is_none() {
        return Ok(());
    }
    let job = state.store.job_get(id).await?.ok_or_else(|| ApiError::not_found(format!("job {id} does not exist")))?;
    Ok(within_queues(holder, Some(&job.row.queue), what)?)
}

/// `GET /api/audit?since=&who=&what=&object=&before=&limit=`: the audit
/// trail, newest first, a page at a time (`next` is the next page's
/// `before`).
async fn audit_list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<crate::store::audit::Query>, QueryRejection>,
) -> ApiResult {
    caller.check_role(&state.access, true, Role::Admin)?;
    let query = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?.0;
    let filter = query.filter(100).map_err(ApiError::bad_request)?;
    let entries = state.store.audit_list(&filter).await?;
    let next = (entries.len() as i64 >= filter.bounded_limit()).then(|| entries.last().map(|e| e.id)).flatten();
    ok(json!({ "entries": entries, "next": next }))
}

async fn job_retry(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<i64>, PathRejection>,
) -> ApiResult {
    let holder = operator(&state, &caller)?;
    let id = id_of(id)?;
    job_within_queues(&state, holder, id, "retry a job").await?;
    caller.store(&state.store).job_retry(id).await?;
    ok(json!({ "id": id, "retried": true }))
}

async fn job_cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<i64>, PathRejection>,
) -> ApiResult {
    let holder = operator(&state, &caller)?;
    let id = id_of(id)?;
    job_within_queues(&state, holder, id, "cancel a job").await?;
    let cancel = match caller.store(&state.store).job_cancel(id).await? {
        Cancel::Cancelled => "cancelled",
        Cancel::Requested => "requested",
    };
    ok(json!({ "id": id, "cancel": cancel }))
}

async fn jobs_retry_bulk(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Result<Json<JobQuery>, JsonRejection>,
) -> ApiResult {
    bulk(state, caller, body, BulkAction::Retry).await
}

async fn jobs_cancel_bulk(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Result<Json<JobQuery>, JsonRejection>,
) -> ApiResult {
    bulk(state, caller, body, BulkAction::Cancel).await
}

async fn bulk(
    state: AppState,
    caller: Caller,
    body: Result<Json<JobQuery>, JsonRejection>,
    action: BulkAction,
) -> ApiResult {
    let holder = operator(&state, &caller)?;
    let query = body_of(body)?;
    within_queues(holder, query.queue.as_deref(), "act on jobs in bulk without naming one of its queues")?;
    if !query.narrows() {
        return Err(ApiError::bad_request(
            "a bulk action needs a filter (state, job, queue, key, batch, since or until): it never applies to every job",
        ));
    }
    let filter = query.filter(DEFAULT_BULK, MAX_BULK).map_err(ApiError::bad_request)?;
    ok(views::bulk(&caller.store(&state.store), &filter, action, state.work_budget).await?)
}

async fn queues(State(state): State<AppState>) -> ApiResult {
    ok(views::queues(&state.store).await?)
}

/// `POST /api/queues/{name}/pause` and `.../resume`.
async fn queue_act(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, QueueAction)>, PathRejection>,
) -> ApiResult {
    let holder = operator(&state, &caller)?;
    let Ok(Path((name, action))) = path else {
        return Err(not_found().await);
    };
    within_queues(holder, Some(&name), "pause or resume a queue")?;
    let changed = action.apply(&caller.store(&state.store), &name).await.map_err(|refused| match refused {
        QueueActionError::BadName(_) => ApiError::bad_request(refused.to_string()),
        QueueActionError::Store(error) => ApiError::from(error),
    })?;
    ok(json!({ "queue": name, "paused": action == QueueAction::Pause, "changed": changed }))
}

async fn keys(State(state): State<AppState>) -> ApiResult {
    ok(state.store.semaphore_list().await?)
}

async fn rate_keys(State(state): State<AppState>) -> ApiResult {
    ok(state.store.rate_key_list().await?)
}

async fn hosts(State(state): State<AppState>) -> ApiResult {
    ok(state.store.host_list().await?)
}

async fn job_types(State(state): State<AppState>) -> ApiResult {
    ok(views::job_types(&state.store).await?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitQuery {
    limit: Option<i64>,
}

async fn batches_list(State(state): State<AppState>, query: Result<Query<LimitQuery>, QueryRejection>) -> ApiResult {
    let limit = query_of(query)?.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit must be between 1 and {MAX_PAGE}, got {limit}")));
    }
    ok(state.store.batch_list(limit).await?)
}

async fn batch_get(State(state): State<AppState>, id: Result<Path<i64>, PathRejection>) -> ApiResult {
    let id = id_of(id)?;
    match state.store.batch_get(id).await? {
        Some(batch) => ok(batch),
        None => Err(ApiError::not_found(format!("batch {id} does not exist"))),
    }
}

async fn workflows_list(State(state): State<AppState>, query: Result<Query<LimitQuery>, QueryRejection>) -> ApiResult {
    let limit = query_of(query)?.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit must be between 1 and {MAX_PAGE}, got {limit}")));
    }
    ok(state.store.workflow_list(limit).await?)
}

async fn workflow_get(State(state): State<AppState>, id: Result<Path<i64>, PathRejection>) -> ApiResult {
    let id = id_of(id)?;
    match state.store.workflow_get(id).await? {
        Some(workflow) => ok(workflow),
        None => Err(ApiError::not_found(format!("workflow {id} does not exist"))),
    }
}

async fn workflow_create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Result<Json<NewWorkflow>, JsonRejection>,
) -> ApiResult {
    within_queues(operator(&state, &caller)?, None, "create a workflow, whose steps span queues")?;
    let created = caller.store(&state.store).workflow_create(&body_of(body)?).await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

async fn workflow_cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<i64>, PathRejection>,
) -> ApiResult {
    within_queues(operator(&state, &caller)?, None, "cancel a workflow, whose steps span queues")?;
    let id = id_of(id)?;
    match caller.store(&state.store).workflow_cancel(id).await? {
        Some(done) => ok(done),
        None => Err(ApiError::not_found(format!("workflow {id} does not exist"))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    key: Option<String>,
    limit: Option<i64>,
}

async fn events_list(State(state): State<AppState>, query: Result<Query<EventsQuery>, QueryRejection>) -> ApiResult {
    let query = query_of(query)?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit must be between 1 and {MAX_PAGE}, got {limit}")));
    }
    ok(state.store.event_list(query.key.as_deref(), limit).await?)
}

/// Sends an event; the body is its payload (a JSON object), and an
/// `Idempotency-Key` header makes a retried send store nothing twice.
async fn event_send(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    key: Result<Path<String>, PathRejection>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> ApiResult {
    within_queues(operator(&state, &caller)?, None, "send an event, which any queue's steps may wait for")?;
    let key = key.map_err(|e| ApiError::bad_request(e.body_text()))?.0;
    let idempotency = match headers.get("idempotency-key").map(|v| v.to_str()) {
        Some(Ok(value)) => Some(value.to_string()),
        Some(Err(_)) => return Err(ApiError::bad_request("the Idempotency-Key header must be visible ASCII")),
        None => None,
    };
    let sent = caller.store(&state.store).event_send(&key, &body_of(body)?, idempotency.as_deref(), "api").await?;
    let status = if sent.duplicate { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(sent)).into_response())
}

async fn schedules(State(state): State<AppState>) -> ApiResult {
    ok(views::schedules(&state.store).await?)
}

#[cfg(test)]
mod tests {
    /// Every route above is in the OpenAPI description (a queue's
    /// `{action}` as each of its actions), and nothing else is.
    #[test]
    fn the_description_lists_every_route() {
        let source = [
            include_str!("api.rs"),
            &include_str!("deploy.rs").replace("(DEPLOY_PATH", "(\"/api/deployments\""),
            include_str!("schedules.rs"),
        ]
        .concat();
        let mut routes: Vec<String> = source
            .split(".route(\"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap().to_string())
            .flat_map(|path| match (path.strip_suffix("{action}"), path.strip_suffix("{verb}")) {
                (Some(stem), _) => vec![format!("{stem}pause"), format!("{stem}resume")],
                (_, Some(stem)) => {
                    ["pause", "resume", "trigger", "backfill"].map(|verb| format!("{stem}{verb}")).to_vec()
                }
                _ => vec![path],
            })
            .collect();
        routes.push("/metrics".into());
        routes.sort();
        let description: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        let mut documented: Vec<String> = description["paths"].as_object().unwrap().keys().cloned().collect();
        documented.sort();
        assert_eq!(routes, documented);
    }
}
