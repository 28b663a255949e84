//! What every request passes before a handler sees it, outermost first:
//! the `Host` it is addressed to ([`only_known_hosts`]), its deadline
//! ([`within`]), the length its body declares ([`refuse_oversized`]), and
//! who it comes from and what that caller may do ([`admit`]), all before
//! any of its body is read.

use std::net::IpAddr;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::AppState;
use super::access::Refusal;
use super::error::ApiError;
use super::roles::Need;
use crate::store::audit::{Actor, Via};
use crate::store::token::Role;

/// Refuses a request whose declared length is past the limit before any of
/// its body is read; one that declares none is cut off at the limit as it
/// is read (the body limit layer).
pub async fn refuse_oversized(max: usize, request: Request, next: Next) -> Response {
    match declared_length(&request) {
        Some(length) if length > max as u64 => ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is {length} bytes, more than the {max} bytes accepted"),
        }
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Refuses a request addressed to a host name other than `localhost` and
/// the `allowed` names (an IP address always passes): what a browser sends
/// when a page of another site has rebound its name to this address. A
/// request with no `Host`, more than one, or one that is not ASCII is
/// refused too: which name it is for cannot be told.
pub async fn only_known_hosts(allowed: &[String], request: Request, next: Next) -> Response {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let refusal = match (hosts.next().map(|v| v.to_str()), hosts.next()) {
        (Some(Ok(host)), None) if host_allowed(host, allowed) => return next.run(request).await,
        (Some(Ok(host)), None) => format!(
            "requests addressed to {host:?} are refused: name it with --allow-host to serve it (IP addresses and \
             localhost always pass)"
        ),
        (None, _) => "a request must name the host it is for (a Host header)".to_string(),
        (Some(_), Some(_)) => "a request must name one host (one Host header)".to_string(),
        (Some(Err(_)), None) => "the Host header is not ASCII".to_string(),
    };
    let status =
        if refusal.starts_with("requests addressed") { StatusCode::FORBIDDEN } else { StatusCode::BAD_REQUEST };
    ApiError { status, message: refusal }.into_response()
}

/// Whether a `Host` header names an IP address, `localhost` or an allowed name.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => {
            return bracketed.split(']').next().is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => {
            host.rsplit_once(':').map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
        }
    };
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Answers 503 for a request not done within `timeout`: a database cut
/// off mid-statement would otherwise hold the page (and its connection)
/// until the operating system gave up on it.
pub async fn within(timeout: std::time::Duration, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(path, ?timeout, "an HTTP request got no answer from the database in time");
            let message =
                format!("no answer within {}: the database may be unreachable", humantime::format_duration(timeout));
            if path.starts_with("/api") {
                ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message }.into_response()
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, message).into_response()
            }
        }
    }
}

/// Works out who the request comes from (the holder of its bearer token,
/// its signed-in session) and refuses what that caller may not do, before
/// any of the body is read or parsed: each route needs what its row in
/// [`super::roles::ROUTES`] says. A change through the API needs a bearer
/// token with the role, one through a dashboard form a session with it; on
/// a server with `--token` a read needs a token or a session too, unless
/// the server reads publicly. An address that keeps sending wrong tokens
/// is refused for a while. The caller goes on to the handlers, which check
/// a form's CSRF token and a token's queues.
pub async fn admit(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let access = &state.access;
    let from: Option<IpAddr> = request.extensions().get::<ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
    let path = request.uri().path().to_string();
    // Webhooks answer as the API does (JSON, and an API's body limit).
    let api = path.starts_with("/api") || path.starts_with(super::hooks::PREFIX);
    let target = format!("{} {path}", request.method());
    let via = if path.starts_with(super::hooks::PREFIX) {
        Via::Webhook
    } else if api {
        Via::Api
    } else {
        Via::Dashboard
    };
    if access.throttled(from) {
        let outcome = Refusal::Throttled.message();
        state
            .access
            .record_refused(
                &state.store,
                via,
                request.headers(),
                &target,
                from,
                "anonymous",
                "access.throttled",
                &outcome,
            )
            .await;
        return refused(&state, &request, Refusal::Throttled);
    }
    let mut caller = access.caller(&state.store, request.headers()).await;
    if caller.wrong_bearer {
        let outcome = "refused: a token neither live nor this server's";
        state
            .access
            .record_refused(
                &state.store,
                via,
                request.headers(),
                &target,
                from,
                "anonymous",
                "access.wrong_token",
                outcome,
            )
            .await;
        if access.wrong_token(from, "bearer") {
            return refused(&state, &request, Refusal::Throttled);
        }
    }
    let who = caller.acting(api).map_or("anonymous", |holder| holder.name.as_str()).to_string();
    caller.actor = Some(Actor::http(via, &who, from, user_agent(&request)));
    let route = request.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string());
    let need = super::roles::need(request.method(), route.as_deref());
    let reading = matches!(*request.method(), Method::GET | Method::HEAD);
    let refusal = match need {
        Need::Anyone => None,
        Need::Scrape => (!access.may_scrape(request.headers(), &caller)).then_some(Refusal::Unauthorized),
        Need::Session => caller.session.is_none().then_some(Refusal::Unauthorized),
        Need::Role(Role::Read) if reading => (!caller.may_read(access)).then_some(Refusal::Unauthorized),
        Need::Role(role) => caller.check_role(access, api, role).err(),
    };
    if let Some(refusal) = refusal {
        // A page a browser asks for goes to the sign-in form, and back.
        if reading
            && !api
            && path != "/metrics"
            && refusal == Refusal::Unauthorized
            && !request.headers().contains_key(super::dashboard::LIVE_HEADER)
        {
            let back = request.uri().path_and_query().map_or("/", |p| p.as_str());
            let to = format!("/login?return_to={}", super::dashboard::encode_component(back));
            return Redirect::to(&to).into_response();
        }
        let outcome = format!("refused: {}", refusal.message());
        state
            .access
            .record_refused(&state.store, via, request.headers(), &target, from, &who, "access.refused", &outcome)
            .await;
        return refused(&state, &request, refusal);
    }
    if !reading && !api && declared_length(&request).is_some_and(|length| length > super::dashboard::FORM_BYTES as u64)
    {
        return ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("a dashboard form is at most {} bytes", super::dashboard::FORM_BYTES),
        }
        .into_response();
    }
    // What anyone may read (the API's own description) holds no job's data.
    let hide = api && need != Need::Anyone && !caller.sees_payloads();
    request.extensions_mut().insert(caller);
    let response = next.run(request).await;
    if hide { super::hide::hide_payloads(response).await } else { response }
}

/// A request's `User-Agent`, if it reads as text.
pub fn user_agent(request: &Request) -> Option<&str> {
    super::access::user_agent(request.headers())
}

/// The length a request says its body has.
fn declared_length(request: &Request) -> Option<u64> {
    request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
}

/// A refusal before the body is read, telling the client to close the
/// connection: the rest of the body is never read.
fn refused(state: &AppState, request: &Request, refusal: Refusal) -> Response {
    let mut response = if request.uri().path().starts_with("/api") || request.uri().path() == "/metrics" {
        ApiError::from(refusal).into_response()
    } else {
        super::dashboard::refusal_page(state, request, refusal)
    };
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn only_addresses_localhost_and_allowed_names_pass() {
        let allowed = vec!["jobs.internal".to_string()];
        for host in ["127.0.0.1:8080", "10.0.0.7", "[::1]:8080", "localhost:8080", "LOCALHOST", "jobs.internal:80"] {
            assert!(host_allowed(host, &allowed), "{host}");
        }
        for host in ["evil.example:8080", "evil.example", "127.0.0.1.evil.example", "[evil]:80", "jobs.internal.evil"] {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
    }
}
