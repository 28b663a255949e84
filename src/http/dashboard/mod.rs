//! The operator's dashboard: server-rendered pages (markup in [`pages`],
//! the shell in [`layout`]) with a little JavaScript that refreshes each
//! page's main part every two seconds, so counts, progress bars and new
//! jobs show without a reload. Everything is in the binary: no CDN, no
//! build step.
//!
//! Forms change things only in a signed-in session, with the page's CSRF
//! token ([`super::access`]); each answers with a redirect back to the
//! page it came from and a notice of what it did.

mod audit;
mod chart;
mod layout;
mod pages;
mod trends;
mod workflow;

use axum::Extension;
use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::Utc;
use maud::Markup;
use serde::Deserialize;

use super::AppState;
use super::access::{Caller, Lookup, Refusal, within_queues};
use super::query::{JobQuery, MAX_BULK, MAX_PAGE};
use super::views::{self, BulkAction, QueueAction};
use crate::store::Cancel;
use crate::store::history::HistoryRange;
use crate::store::token::Role;
use layout::Context;

/// The stylesheet and script, compiled in.
const STYLE: &str = include_str!("assets/style.css");
const SCRIPT: &str = include_str!("assets/app.js");

/// The header the page script sends when it asks for a page's main part only.
pub const LIVE_HEADER: &str = "x-jobhost-live";

/// The cookie carrying a form's result to the page it returns to.
const NOTICE_COOKIE: &str = "jobhost_notice";

/// Jobs per dashboard page.
const PAGE: i64 = 50;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(overview))
        .route("/jobs", get(jobs))
        .route("/jobs/{id}", get(job))
        .route("/keys", get(keys))
        .route("/hosts", get(hosts))
        .route("/audit", get(audit_page))
        .route("/types", get(job_types))
        .route("/types/{name}", get(job_type))
        .route("/batches", get(batches))
        .route("/batches/{id}", get(batch))
        .route("/workflows", get(workflows))
        .route("/workflows/{id}", get(workflow_page))
        .route("/workflows/{id}/decide", post(workflow_decide))
        .route("/schedules", get(schedules))
        .route("/schedules/{action}", post(schedule_act))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .route("/jobs/{id}/retry", post(job_retry))
        .route("/jobs/{id}/cancel", post(job_cancel))
        .route("/jobs/retry", post(jobs_retry))
        .route("/jobs/cancel", post(jobs_cancel))
        .route("/queues/{action}", post(queue_act))
        .route("/assets/style.css", get(|| asset("text/css; charset=utf-8", STYLE)))
        .route("/assets/app.js", get(|| asset("text/javascript; charset=utf-8", SCRIPT)))
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(FORM_BYTES))
        .layer(axum::middleware::from_fn(page_headers))
}

/// The largest form the dashboard takes: its forms carry a token, a
/// filter and a return path, never a payload.
pub const FORM_BYTES: usize = 16 * 1024;

/// What the browser is told about every dashboard answer: run only this
/// server's script, never in a frame (clickjacking), never cache a page
/// (each carries the session's CSRF token), and a notice shown once is gone.
async fn page_headers(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let had_notice = super::access::cookie(request.headers(), NOTICE_COOKIE).is_some();
    let live = request.headers().contains_key(LIVE_HEADER);
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let fixed = [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::VARY, "x-jobhost-live, cookie"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    if had_notice && !live && !response.status().is_redirection() {
        response.headers_mut().append(
            header::SET_COOKIE,
            HeaderValue::from_static("jobhost_notice=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"),
        );
    }
    response
}

/// Scripts and styles from this server only; the inline style attributes
/// are the progress bars' widths.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// Unknown paths: JSON under `/api`, a page elsewhere.
async fn fallback(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
) -> Response {
    if uri.path().starts_with("/api") {
        return super::api::not_found().await.into_response();
    }
    let context = context(&state, &caller, &headers, &uri);
    let page = layout::problem(&context, "Not found", &format!("There is no page at {}.", uri.path()));
    (StatusCode::NOT_FOUND, page).into_response()
}

/// What a page knows of its request.
fn context(state: &AppState, caller: &Caller, headers: &HeaderMap, uri: &Uri) -> Context {
    Context {
        here: uri.path_and_query().map_or("/".to_string(), |p| p.as_str().to_string()),
        csrf: caller.csrf().map(str::to_string),
        writable: state.access.writable(),
        sees_payloads: caller.sees_payloads(),
        signed_in: caller.session.as_ref().map(|s| (s.holder.name.clone(), s.holder.role)),
        notice: super::access::cookie(headers, NOTICE_COOKIE).and_then(|signed| state.access.notice_read(signed)),
    }
}

/// The page refusing a request before its handler ran (see
/// [`super::guard::admit`]).
pub fn refusal_page(state: &AppState, request: &axum::extract::Request, refusal: Refusal) -> Response {
    let context = context(state, &Caller::default(), request.headers(), request.uri());
    (refusal.status(), layout::problem(&context, "Not allowed", &refusal.message())).into_response()
}

/// A path as a query parameter's value: every byte but letters, digits
/// and `/-_.~` percent-encoded.
pub fn encode_component(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A page, or only its main part when the page script asks for it.
fn render(context: &Context, headers: &HeaderMap, title: &str, section: &str, main: Markup) -> Response {
    render_with(context, headers, title, section, None, main)
}

/// [`render`], with a part above `main` that the live refresh leaves alone.
fn render_with(
    context: &Context,
    headers: &HeaderMap,
    title: &str,
    section: &str,
    fixed: Option<Markup>,
    main: Markup,
) -> Response {
    if headers.contains_key(LIVE_HEADER) {
        return main.into_response();
    }
    layout::page_with(context, title, section, fixed, main, true).into_response()
}

/// A store failure while reading a page.
fn failed(context: &Context, error: crate::store::Error) -> Response {
    let status =
        if error.is_unavailable() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::INTERNAL_SERVER_ERROR };
    // The database's own words (its name, the server's text) go to the log.
    tracing::warn!(%error, "a dashboard page could not be read");
    let message = "The page could not be read from the database; the server's log says why.";
    (status, layout::problem(context, "The database cannot be read", message)).into_response()
}

/// Runs `read`, then renders its page, or the failure.
macro_rules! page {
    ($state:expr, $caller:expr, $headers:expr, $uri:expr, $title:expr, $section:expr, |$context:ident| $read:expr) => {{
        let $context = context(&$state, &$caller, &$headers, &$uri);
        let read: crate::store::Result<Markup> = async { $read }.await;
        match read {
            Ok(main) => render(&$context, &$headers, $title, $section, main),
            Err(error) => failed(&$context, error),
        }
    }};
}

/// The span a page's charts show: `?range=1h` (the default), `24h` or `7d`.
#[derive(Debug, Deserialize)]
struct RangeQuery {
    range: Option<String>,
}

impl RangeQuery {
    fn range(&self) -> Result<HistoryRange, String> {
        match self.range.as_deref() {
            None => Ok(HistoryRange::Hour),
            Some(name) => {
                HistoryRange::parse(name).ok_or_else(|| format!("The range {name:?} is not one of 1h, 24h or 7d."))
            }
        }
    }
}

async fn overview(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Query(query): Query<RangeQuery>,
) -> Response {
    let store = &state.store;
    let range = match query.range() {
        Ok(range) => range,
        Err(message) => return bad_request(&context(&state, &caller, &headers, &uri), &message),
    };
    page!(state, caller, headers, uri, "Overview", "/", |context| {
        let stats = store.job_stats().await?;
        let minute = views::throughput(store, 60.0).await?;
        let hour = views::throughput(store, 3600.0).await?;
        // The stats are read once, for the cards and the queues both.
        let queues = views::queues_of(stats.clone());
        let points = store.history(range, None).await?;
        Ok(pages::overview(&context, &stats, &minute, &hour, &queues, trends::overview(range, &points)))
    })
}

async fn job_type(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(query): Query<RangeQuery>,
) -> Response {
    let context = context(&state, &caller, &headers, &uri);
    let range = match query.range() {
        Ok(range) => range,
        Err(message) => return bad_request(&context, &message),
    };
    let read = async {
        let Some(view) = views::job_types(&state.store).await?.into_iter().find(|v| v.registered.name == name) else {
            return Ok(None);
        };
        let points = state.store.history(range, Some(&name)).await?;
        let deploys = state.store.deployment_history(&name).await?;
        Ok(Some(trends::job_type(&view, range, &points, &deploys, Utc::now())))
    };
    match read.await {
        Ok(Some(page)) => render(&context, &headers, &name, "/types", page),
        Ok(None) => {
            let page = layout::problem(&context, "Not found", &format!("No job type {name:?} is registered."));
            (StatusCode::NOT_FOUND, page).into_response()
        }
        Err(error) => failed(&context, error),
    }
}

async fn jobs(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    query: Result<Query<JobQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let context = context(&state, &caller, &headers, &uri);
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => return bad_request(&context, &rejection.body_text()),
    };
    let filter = match query.filter(PAGE, MAX_PAGE) {
        Ok(filter) => filter,
        Err(message) => return bad_request(&context, &message),
    };
    let section = if query.state.as_deref() == Some("failed") { "/jobs?state=failed" } else { "/jobs" };
    match state.store.job_list(&filter).await {
        Ok(rows) => {
            let next = (rows.len() as i64 == filter.limit).then(|| rows.last().map(|r| r.id)).flatten();
            let list = pages::jobs(&context, &query, &rows, next, Utc::now());
            render_with(&context, &headers, "Jobs", section, Some(pages::job_filters(&query)), list)
        }
        Err(error) => failed(&context, error),
    }
}

async fn audit_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    query: Result<Query<crate::store::audit::Query>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let context = context(&state, &caller, &headers, &uri);
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => return bad_request(&context, &rejection.body_text()),
    };
    let filter = match query.filter(audit::PAGE) {
        Ok(filter) => filter,
        Err(message) => return bad_request(&context, &message),
    };
    match state.store.audit_list(&filter).await {
        Ok(rows) => render(&context, &headers, "Audit trail", "/audit", audit::page(&rows, &query, Utc::now())),
        Err(error) => failed(&context, error),
    }
}

fn bad_request(context: &Context, message: &str) -> Response {
    (StatusCode::BAD_REQUEST, layout::problem(context, "That filter does not read", message)).into_response()
}

async fn job(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
) -> Response {
    let context = context(&state, &caller, &headers, &uri);
    match state.store.job_get(id).await {
        Ok(Some(job)) => {
            render(&context, &headers, &format!("Job {id}"), "/jobs", pages::job(&context, &job, Utc::now()))
        }
        Ok(None) => {
            let page = layout::problem(&context, "Not found", &format!("Job {id} does not exist (or was pruned)."));
            (StatusCode::NOT_FOUND, page).into_response()
        }
        Err(error) => failed(&context, error),
    }
}

async fn keys(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
) -> Response {
    page!(state, caller, headers, uri, "Keys", "/keys", |context| {
        Ok(pages::keys(&state.store.semaphore_list().await?, &state.store.rate_key_list().await?))
    })
}

async fn hosts(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
) -> Response {
    page!(state, caller, headers, uri, "Hosts", "/hosts", |context| {
        Ok(pages::hosts(&state.store.host_list().await?, Utc::now()))
    })
}

async fn job_types(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
) -> Response {
    page!(state, caller, headers, uri, "Job types", "/types", |context| {
        Ok(pages::job_types(&views::job_types(&state.store).await?, Utc::now()))
    })
}

async fn batches(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
) -> Response {
    page!(state, caller, headers, uri, "Batches", "/batches", |context| {
        Ok(pages::batches(&state.store.batch_list(PAGE).await?, Utc::now()))
    })
}

async fn workflows(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
) -> Response {
    page!(state, caller, headers, uri, "Workflows", "/workflows", |context| {
        Ok(workflow::workflows(&state.store.workflow_list(PAGE).await?, Utc::now()))
    })
}

async fn workflow_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
) -> Response {
    let context = context(&state, &caller, &headers, &uri);
    match state.store.workflow_get(id).await {
        Ok(Some(found)) => {
            let page = workflow::workflow(&context, &found, Utc::now());
            render(&context, &headers, &format!("Workflow {id}"), "/workflows", page)
        }
        Ok(None) => {
            (StatusCode::NOT_FOUND, layout::problem(&context, "Not found", &format!("Workflow {id} does not exist.")))
                .into_response()
        }
        Err(error) => failed(&context, error),
    }
}

async fn batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
) -> Response {
    let context = context(&state, &caller, &headers, &uri);
    match state.store.batch_get(id).await {
        Ok(Some(batch)) => {
            render(&context, &headers, &format!("Batch {id}"), "/batches", pages::batch(&batch, Utc::now()))
        }
        Ok(None) => {
            (StatusCode::NOT_FOUND, layout::problem(&context, "Not found", &format!("Batch {id} does not exist.")))
                .into_response()
        }
        Err(error) => failed(&context, error),
    }
}

async fn schedules(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    query: Result<Query<SchedulesQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let after = match query {
        Ok(Query(query)) => query.after,
        Err(rejection) => return bad_request(&context(&state, &caller, &headers, &uri), &rejection.body_text()),
    };
    let from = match after.as_deref().map(crate::http::schedules::after_of) {
        Some(None) => {
            return bad_request(&context(&state, &caller, &headers, &uri), "The page's `after` must be JOB/KEY.");
        }
        Some(Some((job, key))) => Some((job.to_string(), key.to_string())),
        None => None,
    };
    page!(state, caller, headers, uri, "Schedules", "/schedules", |context| {
        let from = from.as_ref().map(|(job, key)| (job.as_str(), key.as_str()));
        let mut keyed = state.store.keyed_schedules_page(None, from, pages::KEYED_PAGE + 1).await?;
        let more = keyed.len() > pages::KEYED_PAGE as usize;
        keyed.truncate(pages::KEYED_PAGE as usize);
        let declared = views::schedules(&state.store).await?;
        Ok(pages::schedules(&context, &declared, &keyed, more, after.is_some(), Utc::now()))
    })
}

/// The schedules page's place in the list of those made at run time
/// (there may be hundreds of thousands): after the `JOB/KEY` the page
/// before ended on.
#[derive(Debug, Deserialize)]
struct SchedulesQuery {
    after: Option<String>,
}

/// A keyed schedule's form: its common fields, type and key.
#[derive(Debug, Deserialize)]
struct ScheduleForm {
    #[serde(default)]
    csrf: String,
    return_to: Option<String>,
    job: String,
    key: String,
}

/// `POST /schedules/pause`, `/schedules/resume` and `/schedules/trigger`.
async fn schedule_act(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(action): Path<String>,
    Form(form): Form<ScheduleForm>,
) -> Response {
    let store = caller.store(&state.store);
    let scope = Scope::Spanning("act on a schedule");
    act(&state, &caller, &headers, &uri, &form.csrf, form.return_to.as_deref(), scope, async move {
        let (job, key) = (&form.job, &form.key);
        let done = match action.as_str() {
            "pause" => store.keyed_schedule_pause(job, key, true, Some("paused from the dashboard")).await,
            "resume" => store.keyed_schedule_pause(job, key, false, None).await,
            "trigger" => store.keyed_schedule_trigger(job, key).await,
            other => return Err(format!("{other:?} is no schedule action: pause, resume or trigger")),
        };
        match done.map_err(|e| e.to_string())? {
            true if action == "trigger" => {
                Ok(format!("Schedule {job} {key:?} triggered: its tick is enqueued within a second"))
            }
            true => Ok(format!("Schedule {job} {key:?} {action}d")),
            false => Err(format!("there is no schedule {job} {key:?}")),
        }
    })
    .await
}

/// Where a form returns to: a path on this server, never another site.
/// Only the characters of a path and query this dashboard writes pass: a
/// browser drops tabs and newlines from a URL, so `/\t/evil.example` would
/// otherwise lead to another site.
fn return_path(return_to: &str) -> &str {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "/?&=%-_.~+:,".contains(c);
    let safe = return_to.starts_with('/') && !return_to.starts_with("//") && return_to.chars().all(allowed);
    // Signing in to land on the sign-in form again would look like a failure.
    let sign_in = return_to == "/login" || return_to.starts_with("/login?");
    if safe && !sign_in { return_to } else { "/" }
}

#[derive(Debug, Deserialize)]
struct ReturnQuery {
    return_to: Option<String>,
}

async fn login_form(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Query(query): Query<ReturnQuery>,
) -> Response {
    let context = context(&state, &caller, &headers, &uri);
    let return_to = return_path(query.return_to.as_deref().unwrap_or("/"));
    let form = pages::login(return_to, state.access.reads_need_login(), None);
    layout::page_with(&context, "Sign in", "", None, form, false).into_response()
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
    return_to: Option<String>,
}

async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Extension(ConnectInfo(peer)): Extension<ConnectInfo<std::net::SocketAddr>>,
    Form(form): Form<LoginForm>,
) -> Response {
    let context = context(&state, &caller, &headers, &uri);
    let return_to = return_path(form.return_to.as_deref().unwrap_or("/"));
    let refused = |status: StatusCode, problem: String| {
        let form = pages::login(return_to, state.access.reads_need_login(), Some(&problem));
        (status, layout::page_with(&context, "Sign in", "", None, form, false)).into_response()
    };
    let holder = match state.access.holder_of(&state.store, &form.token).await {
        Lookup::Held(holder) => holder,
        Lookup::Unread => {
            return refused(StatusCode::SERVICE_UNAVAILABLE, "The tokens cannot be read now: try again.".to_string());
        }
        Lookup::Metrics | Lookup::Unknown => {
            let outcome = "refused: a sign-in with a token neither live nor this server's";
            state
                .access
                .record_refused(
                    &state.store,
                    crate::store::audit::Via::Dashboard,
                    &headers,
                    "POST /login",
                    Some(peer.ip()),
                    "anonymous",
                    "access.wrong_token",
                    outcome,
                )
                .await;
            return if state.access.wrong_token(Some(peer.ip()), "dashboard sign-in") {
                refused(StatusCode::TOO_MANY_REQUESTS, Refusal::Throttled.message())
            } else {
                refused(StatusCode::UNAUTHORIZED, "That is not this server's token, nor a live named token.".into())
            };
        }
    };
    let id = match state.access.sign_in(&state.store, &form.token, &holder).await {
        Ok(Some(id)) => id,
        Ok(None) => return refused(StatusCode::UNAUTHORIZED, "That token was revoked as you signed in.".into()),
        Err(error) => return failed(&context, error),
    };
    // Over TLS (a proxy in front says so), the cookie goes only over TLS.
    let secure = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"));
    let cookie = state.access.session_cookie(&id, secure);
    let notice = match holder.role {
        _ if holder.name == super::access::SERVER_TOKEN_NAME => "Signed in: changes are allowed".to_string(),
        Role::Read => format!("Signed in as {}, who may read", holder.name),
        role => format!("Signed in as {}, with the {role} role", holder.name),
    };
    redirect_with(&state.access, return_to, Some(cookie), &notice)
}

/// A form's common fields.
#[derive(Debug, Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    return_to: Option<String>,
}

/// A bulk form: its fields and the filter it applies to, each by name (a
/// field the filter does not have is refused, never collected).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkForm {
    #[serde(default)]
    csrf: String,
    return_to: Option<String>,
    state: Option<String>,
    job: Option<String>,
    queue: Option<String>,
    key: Option<String>,
    batch: Option<String>,
    since: Option<String>,
    until: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

impl BulkForm {
    /// The filter the form's fields spell.
    fn query(&self) -> JobQuery {
        JobQuery {
            state: self.state.clone(),
            job: self.job.clone(),
            queue: self.queue.clone(),
            key: self.key.clone(),
            batch: self.batch.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
            before: self.before.clone(),
            limit: self.limit.clone(),
        }
    }
}

/// The longest notice carried to the next page: hex-encoded in a cookie,
/// it stays well under the 4 KB a browser keeps.
const NOTICE_MAX_CHARS: usize = 600;

/// What a form did: the notice, and where to go when not back where it
/// came from.
struct Done {
    notice: String,
    go_to: Option<String>,
}

impl From<String> for Done {
    fn from(notice: String) -> Self {
        Done { notice, go_to: None }
    }
}

/// Redirects to `path` (303, so the browser follows with a GET), setting
/// `cookie` if given and the notice shown there.
fn redirect_with(access: &super::access::Access, path: &str, cookie: Option<String>, notice: &str) -> Response {
    let mut response = Redirect::to(path).into_response();
    let notice: String = notice.chars().take(NOTICE_MAX_CHARS).collect();
    let notice =
        format!("{NOTICE_COOKIE}={}; Max-Age=60; Path=/; HttpOnly; SameSite=Strict", access.notice_value(&notice));
    for value in cookie.into_iter().chain([notice]) {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

/// What a form changes, for the checks of who may send it.
enum Scope {
    /// Nothing but the session: signing out.
    Session,
    /// What spans queues: a token limited to some may not.
    Spanning(&'static str),
    /// The jobs of one queue (`None`: of any).
    Queue(Option<String>, &'static str),
    /// One job, of whichever queue it is in.
    Job(i64, &'static str),
}

/// Checks that the caller may send a form changing `scope`: the status
/// and the reason if not.
async fn check_scope(state: &AppState, caller: &Caller, scope: Scope) -> Result<(), (StatusCode, String)> {
    let refused = |refusal: Refusal| (refusal.status(), refusal.message());
    if let Scope::Session = scope {
        return Ok(());
    }
    let holder = caller.check_role(&state.access, false, Role::Operate).map_err(refused)?;
    match scope {
        Scope::Session => Ok(()),
        Scope::Spanning(what) => within_queues(holder, None, what).map_err(refused),
        Scope::Queue(queue, what) => within_queues(holder, queue.as_deref(), what).map_err(refused),
        Scope::Job(id, what) => {
            super::api::job_within_queues(state, holder, id, what).await.map_err(|e| (e.status, e.message))
        }
    }
}

/// Checks a form and who sent it, runs `action` and returns to the form's
/// page with what it did (or why it could not).
#[allow(clippy::too_many_arguments)]
async fn act<F, D>(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    uri: &Uri,
    csrf: &str,
    return_to: Option<&str>,
    scope: Scope,
    action: F,
) -> Response
where
    F: std::future::Future<Output = Result<D, String>>,
    D: Into<Done>,
{
    if let Err(refusal) = caller.check_form(headers, csrf) {
        let context = context(state, caller, headers, uri);
        return (refusal.status(), layout::problem(&context, "Not allowed", &refusal.message())).into_response();
    }
    if let Err((status, why)) = check_scope(state, caller, scope).await {
        let context = context(state, caller, headers, uri);
        return (status, layout::problem(&context, "Not allowed", &why)).into_response();
    }
    let back = return_path(return_to.unwrap_or("/"));
    match action.await.map(Into::into) {
        Ok(Done { notice, go_to }) => {
            redirect_with(&state.access, go_to.as_deref().map_or(back, return_path), None, &notice)
        }
        Err(why) => redirect_with(&state.access, back, None, &format!("Not done: {why}")),
    }
}

async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Form(form): Form<ActionForm>,
) -> Response {
    let store = caller.store(&state.store);
    let ending = caller.session.as_ref().map(|s| s.digest.clone()).unwrap_or_default();
    let mut response = act(&state, &caller, &headers, &uri, &form.csrf, Some("/"), Scope::Session, async move {
        // Ended in the database: the cookie signs no one in anywhere again.
        store.session_revoke(&ending).await.map(|()| "Signed out".to_string()).map_err(|e| e.to_string())
    })
    .await;
    if response.status() == StatusCode::SEE_OTHER
        && let Ok(cleared) = HeaderValue::from_str(&state.access.cleared_cookie())
    {
        response.headers_mut().append(header::SET_COOKIE, cleared);
    }
    response
}

/// Approving or rejecting a step that waits for an event.
#[derive(Debug, Deserialize)]
struct DecisionForm {
    #[serde(default)]
    csrf: String,
    return_to: Option<String>,
    step: String,
    decision: String,
}

/// Sends the event a waiting step waits for, approving or rejecting it: one
/// decision a step (a second, or a repeated click, is the same event again
/// and changes nothing).
async fn workflow_decide(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
    Form(form): Form<DecisionForm>,
) -> Response {
    let store = caller.store(&state.store);
    let scope = Scope::Spanning("decide a wait, whose event any queue's steps may wait for");
    act(&state, &caller, &headers, &uri, &form.csrf, form.return_to.as_deref(), scope, async move {
        let approved = match form.decision.as_str() {
            "approve" => true,
            "reject" => false,
            other => return Err(format!("{other:?} is no decision: approve or reject")),
        };
        let found = store.workflow_get(id).await.map_err(|e| e.to_string())?;
        let step = found.and_then(|w| w.steps.into_iter().find(|s| s.name == form.step));
        let Some((key, payload)) = step.as_ref().and_then(|s| workflow::decision_event(s, approved)) else {
            return Err(format!("step {:?} of workflow {id} is not waiting for an event", form.step));
        };
        let idempotency = format!("dashboard:{id}:{}", form.step);
        let idempotency: String = if idempotency.len() <= 256 {
            idempotency
        } else {
            format!("dashboard:{id}:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(form.step.as_bytes())))
        };
        let sent =
            store.event_send(&key, &payload, Some(&idempotency), "dashboard").await.map_err(|e| e.to_string())?;
        let what = if approved { "approved" } else { "rejected" };
        Ok(if sent.duplicate {
            format!("Step {} was decided before: nothing sent again", form.step)
        } else {
            format!("Step {} {what}: event {} ({key}) ended {} waits", form.step, sent.id, sent.released)
        })
    })
    .await
}

async fn job_retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
    Form(form): Form<ActionForm>,
) -> Response {
    let store = caller.store(&state.store);
    let scope = Scope::Job(id, "retry a job");
    act(&state, &caller, &headers, &uri, &form.csrf, form.return_to.as_deref(), scope, async move {
        store.job_retry(id).await.map(|()| format!("Job {id} will run again")).map_err(|e| e.to_string())
    })
    .await
}

async fn job_cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
    Form(form): Form<ActionForm>,
) -> Response {
    let store = caller.store(&state.store);
    let scope = Scope::Job(id, "cancel a job");
    act(&state, &caller, &headers, &uri, &form.csrf, form.return_to.as_deref(), scope, async move {
        match store.job_cancel(id).await {
            Ok(Cancel::Cancelled) => Ok(format!("Job {id} cancelled")),
            Ok(Cancel::Requested) => Ok(format!("Job {id} is running: its host stops it within two heartbeats")),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
}

async fn jobs_retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Form(form): Form<BulkForm>,
) -> Response {
    bulk(state, caller, headers, uri, form, BulkAction::Retry).await
}

async fn jobs_cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Form(form): Form<BulkForm>,
) -> Response {
    bulk(state, caller, headers, uri, form, BulkAction::Cancel).await
}

async fn bulk(
    state: AppState,
    caller: Caller,
    headers: HeaderMap,
    uri: Uri,
    form: BulkForm,
    action: BulkAction,
) -> Response {
    let store = caller.store(&state.store);
    let budget = state.work_budget;
    let query = form.query();
    let scope = Scope::Queue(query.queue.clone(), "act on jobs in bulk without naming one of its queues");
    act(&state, &caller, &headers, &uri, &form.csrf, form.return_to.as_deref(), scope, async move {
        if !query.narrows() {
            return Err("a bulk action needs a filter".to_string());
        }
        let filter = query.filter(MAX_BULK, MAX_BULK)?;
        let outcome = views::bulk(&store, &filter, action, budget).await.map_err(|e| e.to_string())?;
        let verb = if action == BulkAction::Retry { "retried" } else { "cancelled" };
        let mut notice = format!("{} of {} matching jobs {verb}", outcome.changed, outcome.matched);
        if outcome.requested > 0 {
            notice.push_str(&format!(", {} running jobs asked to stop", outcome.requested));
        }
        if !outcome.unchanged.is_empty() {
            notice.push_str(&format!(", {} left as they were", outcome.matched - outcome.changed - outcome.requested));
        }
        // Past a pass that left more, the page lists what is left below its
        // cursor, and its bulk form goes on from there.
        let go_to = match outcome.next.filter(|_| outcome.more) {
            Some(next) => {
                notice.push_str("; more may match: press it again to go on below job ");
                notice.push_str(&next.to_string());
                let filtered = query.to_query_string();
                Some(format!("/jobs?{filtered}{}before={next}", if filtered.is_empty() { "" } else { "&" }))
            }
            None => None,
        };
        Ok(Done { notice, go_to })
    })
    .await
}

/// A queue form: its common fields and the queue's name.
#[derive(Debug, Deserialize)]
struct QueueForm {
    #[serde(default)]
    csrf: String,
    return_to: Option<String>,
    queue: String,
}

/// `POST /queues/pause` and `/queues/resume`.
async fn queue_act(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Extension(caller): Extension<Caller>,
    Path(action): Path<QueueAction>,
    Form(form): Form<QueueForm>,
) -> Response {
    let store = caller.store(&state.store);
    let name = form.queue;
    let scope = Scope::Queue(Some(name.clone()), "pause or resume a queue");
    act(&state, &caller, &headers, &uri, &form.csrf, form.return_to.as_deref(), scope, async move {
        match action.apply(&store, &name).await {
            Ok(_) => Ok(action.done(&name)),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::return_path;

    #[test]
    fn a_form_returns_to_a_page_of_this_server_other_than_the_sign_in_form() {
        assert_eq!(return_path("/jobs?state=failed"), "/jobs?state=failed");
        assert_eq!(return_path("/login"), "/");
        assert_eq!(return_path("/login?return_to=%2Flogin"), "/");
        assert_eq!(return_path("//evil.example"), "/");
        assert_eq!(return_path("/\t/evil.example"), "/");
    }
}
