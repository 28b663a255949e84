//! What a token made without `--payloads` is not shown: the data jobs
//! carry. Every JSON answer of the API passes through [`hide_payloads`] for
//! such a caller, which blanks the fields that hold it wherever they are
//! nested, so an endpoint added later is covered without a line of its own.
//! The dashboard's job page leaves the same sections out.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::error::ApiError;

/// The fields that hold what a job carries: its payload (and a batch's
/// callback payload), its output, what its runs logged and printed, and
/// the values a step's wait matches (taken from its payload or its
/// dependencies' outputs).
pub const HIDDEN_FIELDS: [&str; 10] =
    ["payload", "callback_payload", "output", "outputs", "log", "logs", "stdout", "stderr", "match", "match_later"];

/// The header an answer with hidden fields carries, naming why.
pub const HIDDEN_HEADER: &str = "jobhost-hidden";

/// The largest answer rewritten; a larger one is refused rather than sent
/// whole. No list the API answers comes near it.
const MOST_BYTES: usize = 64 << 20;

/// Blanks (sets to null) every hidden field in `value`, at any depth;
/// whether any was there.
pub fn hide_in(value: &mut Value) -> bool {
    match value {
        Value::Object(fields) => {
            let mut hidden = false;
            for (name, field) in fields.iter_mut() {
                if HIDDEN_FIELDS.contains(&name.as_str()) {
                    hidden |= !field.is_null();
                    *field = Value::Null;
                } else {
                    hidden |= hide_in(field);
                }
            }
            hidden
        }
        Value::Array(items) => items.iter_mut().fold(false, |hidden, item| hide_in(item) | hidden),
        _ => false,
    }
}

/// `response` with its hidden fields blanked, if it is JSON. An answer that
/// cannot be read is refused whole, never passed on unread.
pub async fn hide_payloads(response: Response) -> Response {
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let refused = |message: &str| {
        tracing::warn!(message, "an answer could not be read to hide its payloads; refused it");
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.to_string() }.into_response()
    };
    let Ok(bytes) = axum::body::to_bytes(body, MOST_BYTES).await else {
        return refused("the answer is too large to hide its payloads from this token: narrow the request");
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return refused("the answer could not be read to hide its payloads from this token");
    };
    if !hide_in(&mut value) {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let text = serde_json::to_vec(&value).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(HIDDEN_HEADER, HeaderValue::from_static("payloads: this token was made without --payloads"));
    Response::from_parts(parts, Body::from(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_hidden_field_is_blanked_at_any_depth_and_the_rest_kept() {
        let mut answer = json!({
            "id": 7,
            "payload": {"card": "4242"},
            "error": "smtp: 421",
            "attempts": [{"attempt": 1, "log": {"lines": ["secret"]}}],
            "steps": [{"name": "a", "output": [1, 2], "state": "completed"}],
            "callback_payload": {"x": 1},
            "stdout": "printed",
        });
        assert!(hide_in(&mut answer));
        assert_eq!(
            answer,
            json!({
                "id": 7,
                "payload": null,
                "error": "smtp: 421",
                "attempts": [{"attempt": 1, "log": null}],
                "steps": [{"name": "a", "output": null, "state": "completed"}],
                "callback_payload": null,
                "stdout": null,
            })
        );
        let mut plain = json!({"states": {"failed": 1}, "output": null});
        assert!(!hide_in(&mut plain), "nothing to hide");
    }
}
