//! Deployments over the API: what the fleet serves from the database, each
//! type's history, and `deploy`, `undeploy` and `rollback` as the CLI has
//! them (docs/deploy.md). A deploy posts the component's bytes and is
//! validated exactly as a host loads it (compiled, linked, `describe()`d
//! and its configuration checked) before anything is stored, so a
//! component that would not load is refused with the reason and never
//! reaches a host. The runtime that validates starts with the first deploy
//! a server is sent, with one run's pool: a server that never deploys
//! holds none.

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::access::Caller;
use super::error::ApiError;
use crate::component::Runtime;
use crate::config::RuntimeConfig;
use crate::store::deploy::{MAX_COMPONENT_BYTES, check_size};
use crate::store::{DeployChange, DeployRequest};

/// The path a deploy posts to: its body is a component, far larger than
/// any other request's.
pub const DEPLOY_PATH: &str = "/api/deployments";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(DEPLOY_PATH, get(current).post(deploy).layer(DefaultBodyLimit::max(MAX_COMPONENT_BYTES)))
        .route("/api/deployments/{job_type}", get(history))
        .route("/api/deployments/{job_type}/undeploy", post(undeploy))
        .route("/api/deployments/{job_type}/rollback", post(rollback))
}

type ApiResult = Result<Response, ApiError>;

async fn current(State(state): State<AppState>) -> ApiResult {
    Ok(Json(state.store.deployments_current().await?).into_response())
}

async fn history(State(state): State<AppState>, job_type: Result<Path<String>, PathRejection>) -> ApiResult {
    let Ok(Path(job_type)) = job_type else {
        return Err(ApiError::bad_request("the job type in the path does not read"));
    };
    let entries = state.store.deployment_history(&job_type).await?;
    if entries.is_empty() {
        return Err(ApiError::not_found(format!("job type {job_type:?} was never deployed through the database")));
    }
    Ok(Json(entries).into_response())
}

/// The runtime that validates deployed components, started once.
async fn validator(state: &AppState) -> Result<&Runtime, ApiError> {
    state
        .validator
        .get_or_try_init(|| async {
            let config = RuntimeConfig { max_concurrent_runs: 1, ..RuntimeConfig::default() };
            tokio::task::spawn_blocking(move || Runtime::new(config))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|error| {
            tracing::error!(%error, "cannot start the runtime that validates deployed components");
            ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: "the server cannot validate components now (its log says why): nothing was deployed".into(),
            }
        })
}

/// `POST /api/deployments` with a component's bytes as the body
/// (`application/wasm`): the fleet serves it for the job type its
/// `describe()` names.
async fn deploy(State(state): State<AppState>, Extension(caller): Extension<Caller>, body: Bytes) -> ApiResult {
    if body.is_empty() {
        return Err(ApiError::bad_request("the body must be a component (.wasm): it is empty"));
    }
    check_size(&body)?;
    let runtime = validator(&state).await?;
    let component = runtime
        .load_bytes(std::path::Path::new("(uploaded)"), body.to_vec())
        .await
        .map_err(|error| ApiError::bad_request(format!("{error}; nothing was deployed")))?;
    let name = component.config.name.clone();
    let request = DeployRequest::Deploy { digest: &component.digest, bytes: &body, config: &component.config };
    let change = caller.store(&state.store).deployment_change(&name, request).await?;
    let status = if change.changed { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(answer(&name, &change))).into_response())
}

async fn undeploy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    job_type: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let job_type = job_type_of(job_type)?;
    let change = caller.store(&state.store).deployment_change(&job_type, DeployRequest::Undeploy).await?;
    Ok(Json(answer(&job_type, &change)).into_response())
}

/// A rollback's body, optional: the version to serve, else the one before.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    to: Option<String>,
}

async fn rollback(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    job_type: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> ApiResult {
    let job_type = job_type_of(job_type)?;
    let body: RollbackBody = if body.iter().all(u8::is_ascii_whitespace) {
        RollbackBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body must be {{\"to\": DIGEST}} or empty: {e}")))?
    };
    let change = caller
        .store(&state.store)
        .deployment_change(&job_type, DeployRequest::Rollback { to: body.to.as_deref() })
        .await?;
    Ok(Json(answer(&job_type, &change)).into_response())
}

fn job_type_of(job_type: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    job_type.map(|Path(name)| name).map_err(|_| ApiError::bad_request("the job type in the path does not read"))
}

/// What a change did, as the API answers it.
fn answer(job_type: &str, change: &DeployChange) -> serde_json::Value {
    json!({
        "job_type": job_type,
        "previous": change.previous,
        "current": change.current,
        "changed": change.changed,
    })
}
