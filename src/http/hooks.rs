//! Inbound webhooks: `POST /hooks/NAME`, with no token, accepts only a
//! request signed with the webhook's secret (`crate::webhook` judges the
//! signature and its timestamp before the body is parsed) and sends it as
//! an event: its key rendered from the body's fields, its payload the
//! body, a replay of one delivery stored once (docs/events.md).

use axum::Extension;
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use super::AppState;
use super::error::ApiError;
use crate::template::KeyTemplate;
use crate::webhook::{Delivery, verify};

/// Where webhooks are served.
pub const PREFIX: &str = "/hooks/";

pub fn routes() -> Router<AppState> {
    Router::new().route("/hooks/{name}", post(receive))
}

/// A refused request: its status, what the caller is told, and the
/// outcome counted in `/metrics`.
struct Refused {
    status: StatusCode,
    message: String,
    outcome: &'static str,
}

impl Refused {
    fn new(status: StatusCode, outcome: &'static str, message: impl Into<String>) -> Self {
        Refused { status, message: message.into(), outcome }
    }
}

async fn receive(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<std::net::SocketAddr>>>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(Path(name)) = name else {
        return ApiError::bad_request("a webhook's name must be text").into_response();
    };
    let webhook = match state.store.webhook_get(&name).await {
        Ok(Some(webhook)) => webhook,
        Ok(None) => {
            state.metrics.webhook("unknown", "unknown");
            return ApiError::not_found(format!("there is no webhook {name:?}")).into_response();
        }
        Err(error) => return ApiError::from(error).into_response(),
    };
    // The sender's address, for the audit trail.
    let from = peer.map(|Extension(ConnectInfo(peer))| peer.ip().to_string());
    match accept(&state, &webhook, &headers, &body, from).await {
        Ok(sent) => {
            state.metrics.webhook(&webhook.name, if sent.duplicate { "duplicate" } else { "accepted" });
            (StatusCode::OK, Json(sent)).into_response()
        }
        Err(refused) => {
            state.metrics.webhook(&webhook.name, refused.outcome);
            if refused.status.is_server_error() {
                tracing::warn!(webhook = %webhook.name, reason = %refused.message, "an inbound webhook cannot verify requests");
            }
            ApiError { status: refused.status, message: refused.message }.into_response()
        }
    }
}

/// Verifies the request and sends its event.
async fn accept(
    state: &AppState,
    webhook: &crate::store::webhook::Webhook,
    headers: &HeaderMap,
    body: &[u8],
    from: Option<String>,
) -> Result<crate::store::wait::SentEvent, Refused> {
    let secret = secret_of(state, webhook).await?;
    let id = {
        // Judged before any await: the delivery borrows what a task may not hold across one.
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let delivery = Delivery { header: &header, body, now_secs: chrono::Utc::now().timestamp() };
        verify(webhook.style, &secret, webhook.tolerance_secs, &delivery)
            .map_err(|refusal| Refused::new(StatusCode::UNAUTHORIZED, refusal.outcome(), refusal.to_string()))?
    };
    let payload: serde_json::Value = serde_json::from_slice(body)
        .ok()
        .filter(serde_json::Value::is_object)
        .ok_or_else(|| Refused::new(StatusCode::BAD_REQUEST, "invalid", "the body must be a JSON object"))?;
    let invalid = |error: String| Refused::new(StatusCode::BAD_REQUEST, "invalid", format!("the event's key: {error}"));
    let template = KeyTemplate::parse(&webhook.event_key).map_err(|e| invalid(e.to_string()))?;
    let key = template.render(&payload).map_err(|e| invalid(e.to_string()))?;
    // A replay shares the delivery's id; without one, an exact copy shares
    // its body. A long id is kept as its digest, within a key's length.
    let digest = |bytes: &[u8]| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes));
    let delivery_id = match id {
        Some(id) if id.len() <= 128 && !id.chars().any(char::is_control) => id,
        Some(id) => digest(id.as_bytes()),
        None => digest(body),
    };
    let idempotency = format!("webhook:{}:{delivery_id}", webhook.name);
    let source = format!("webhook:{}", webhook.name);
    let agent = headers.get(axum::http::header::USER_AGENT).and_then(|v| v.to_str().ok());
    let mut actor = crate::store::audit::Actor::http(crate::store::audit::Via::Webhook, &webhook.name, None, agent);
    actor.address = from;
    let store = state.store.acting_as(actor);
    store.event_send(&key, &payload, Some(&idempotency), &source).await.map_err(|error| match error {
        crate::store::Error::InvalidEvent(reason) => Refused::new(StatusCode::BAD_REQUEST, "invalid", reason),
        other => {
            let api = ApiError::from(other);
            Refused::new(api.status, "unavailable", api.message)
        }
    })
}

/// The webhook's secret, opened with the hosts' key.
async fn secret_of(state: &AppState, webhook: &crate::store::webhook::Webhook) -> Result<String, Refused> {
    let unavailable = |message: String| Refused::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
    let Some(key) = &state.secret_key else {
        return Err(unavailable(format!(
            "webhook {:?} cannot verify requests: this server has no secret key (JOBHOST_SECRET_KEY)",
            webhook.name
        )));
    };
    let sealed = state
        .store
        .secrets_sealed(std::slice::from_ref(&webhook.secret))
        .await
        .map_err(|error| unavailable(ApiError::from(error).message))?;
    let Some((_, sealed)) = sealed.into_iter().next() else {
        return Err(unavailable(format!(
            "webhook {:?} cannot verify requests: its secret {:?} is not set",
            webhook.name, webhook.secret
        )));
    };
    key.open(&webhook.secret, &sealed).map_err(|_| {
        unavailable(format!(
            "webhook {:?} cannot verify requests: its secret {:?} does not open",
            webhook.name, webhook.secret
        ))
    })
}
