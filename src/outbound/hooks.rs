//! A run's side of wasi:http: every request a guest sends passes the
//! policy here before anything leaves the host; a refused one fails in the
//! guest with `HTTP-request-denied` and leaves a line, with the fix, in the
//! job's log.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Semaphore;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::budget::{BodyBudget, Direction, Metered};
use super::origin::Origin;
use super::policy::{Policy, Refusal};
use super::redact::RunSecrets;
use super::send::{self, Connections, SendError, Sending, StepTimeouts};
use crate::types::OutboundCall;

/// Requests one run may have in flight at once; past it a request fails at
/// once with `connection-limit-reached`.
pub const MAX_IN_FLIGHT: usize = 16;

/// Refusals kept for one run's log; past it they are counted only.
const MAX_REFUSAL_LINES: usize = 32;

/// Requests of one run kept for its report: the last ones.
pub const MAX_CALLS_KEPT: usize = 100;

/// A request being recorded: its body bytes and its end are written in as
/// they come.
type Recorded = Arc<Mutex<OutboundCall>>;

/// The last [`MAX_CALLS_KEPT`] requests of a run.
#[derive(Default)]
struct Calls(VecDeque<Recorded>);

impl Calls {
    fn push(&mut self, call: OutboundCall) -> Recorded {
        if self.0.len() == MAX_CALLS_KEPT {
            self.0.pop_front();
        }
        let recorded = Arc::new(Mutex::new(call));
        self.0.push_back(recorded.clone());
        recorded
    }
}

/// The outbound side of one run.
pub struct OutboundHooks {
    policy: Arc<Policy>,
    secrets: Arc<RunSecrets>,
    /// The job, for its requests' idempotency keys.
    job_id: u64,
    /// What every request's `traceparent` carries: the run's span (whose
    /// children the services called become), or, when the host exports no
    /// traces, a trace id of the run's own with a new span id per request.
    trace: RequestTrace,
    /// Requests sent so far to each origin: the ordinal in an idempotency key.
    sent_to: std::collections::HashMap<String, u32>,
    calls: Arc<Mutex<Calls>>,
    refusals: Arc<Mutex<Refusals>>,
    in_flight: Arc<Semaphore>,
    timeouts: StepTimeouts,
    connections: Arc<Connections>,
    budget: BodyBudget,
}

/// The refusals of one run, for its log.
#[derive(Debug, Default)]
pub struct Refusals {
    lines: Vec<String>,
    dropped: usize,
}

impl Refusals {
    /// Keeps a refusal for the job's log, and echoes it into the host's
    /// log while under the bound: a guest looping on refused requests floods
    /// neither.
    fn push(&mut self, refusal: Refusal) {
        if self.lines.len() < MAX_REFUSAL_LINES {
            tracing::warn!(target: "jobhost::outbound", "{}", refusal.0);
            self.lines.push(refusal.0);
        } else {
            self.dropped += 1;
        }
    }

    /// The lines for the job's log, and a count of the ones not kept.
    pub fn take(&mut self) -> Vec<String> {
        let mut lines = std::mem::take(&mut self.lines);
        if self.dropped > 0 {
            lines.push(format!("{} more outbound requests were refused", std::mem::take(&mut self.dropped)));
        }
        lines
    }
}

impl OutboundHooks {
    /// Requests carry the run's own span as their parent (`traceparent`,
    /// when the host exports the run's span).
    pub fn in_trace(self, traceparent: Option<String>) -> Self {
        match traceparent {
            Some(traceparent) => OutboundHooks { trace: RequestTrace::Run { traceparent }, ..self },
            None => self,
        }
    }

    /// The hooks of a run allowed what `policy` allows.
    pub fn new(
        policy: Arc<Policy>,
        secrets: Arc<RunSecrets>,
        job_id: u64,
        connections: Arc<Connections>,
        budget: BodyBudget,
    ) -> Self {
        OutboundHooks {
            policy,
            secrets,
            job_id,
            trace: RequestTrace::Unexported { trace_id: None },
            sent_to: Default::default(),
            calls: Arc::default(),
            refusals: Arc::default(),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            timeouts: StepTimeouts::default(),
            connections,
            budget,
        }
    }

    /// The run's secrets: what its own lines are redacted by.
    pub fn secrets(&self) -> &RunSecrets {
        &self.secrets
    }

    /// The refusal lines for the job's log.
    pub fn take_refusals(&self) -> Vec<String> {
        self.refusals.lock().map(|mut r| r.take()).unwrap_or_default()
    }

    /// The run's requests, the last [`MAX_CALLS_KEPT`], oldest first.
    pub fn take_calls(&self) -> Vec<OutboundCall> {
        let Ok(mut calls) = self.calls.lock() else { return Vec::new() };
        std::mem::take(&mut calls.0)
            .into_iter()
            .filter_map(|recorded| recorded.lock().ok().map(|call| call.clone()))
            .collect()
    }

    fn record(&self, request: &http::Request<WasiBody>, origin: &str, rule: String, error: Option<String>) -> Recorded {
        let call = OutboundCall {
            method: request.method().to_string(),
            origin: origin.to_string(),
            path: request.uri().path().to_string(),
            rule,
            status: None,
            error,
            request_bytes: 0,
            response_bytes: 0,
            ms: 0,
        };
        match self.calls.lock() {
            Ok(mut calls) => calls.push(call),
            Err(_) => Arc::new(Mutex::new(call)),
        }
    }

    fn refuse(&self, refusal: Refusal, error: Error) -> Result<Sending, Error> {
        if let Ok(mut refusals) = self.refusals.lock() {
            refusals.push(refusal);
        }
        Err(error)
    }

    /// The declared rule an origin falls under, for a refused request's label.
    fn rule_of(&self, request: &http::Request<WasiBody>) -> String {
        let origin = Origin::of_uri(request.uri()).ok();
        let rule = origin.and_then(|o| self.policy.declared.iter().find(|r| r.origin.matches(&o)));
        rule.map_or_else(|| "undeclared".to_string(), |r| r.origin.to_string())
    }

    /// What the request may do, or the error the guest gets.
    fn judge(&self, request: &http::Request<WasiBody>, options: Option<RequestOptions>) -> Result<Sending, Error> {
        let method = request.method().as_str();
        let origin = match Origin::of_uri(request.uri()) {
            Ok(origin) => origin,
            Err(why) => return self.refuse(Refusal(format!("{method} refused: {why}")), Error::HttpRequestUriInvalid),
        };
        let allowed = match self.policy.decide(method, &origin) {
            Ok(allowed) => allowed,
            Err(refusal) => return self.refuse(refusal, Error::HttpRequestDenied),
        };
        let timeouts = self.timeouts.granted(allowed.timeouts).within(options);
        Ok(Sending {
            job_type: self.policy.job_type.clone(),
            origin,
            allowed,
            timeouts,
            connections: self.connections.clone(),
            meter: (self.budget.clone(), Arc::default()),
        })
    }
}

impl OutboundHooks {
    /// The headers the host adds, unless the guest set them: a W3C
    /// `traceparent` for the run, and where the grant asks, an
    /// `Idempotency-Key` that the same request of every attempt of the job
    /// repeats (the job, the origin, and how many requests to it came before).
    fn add_headers(&mut self, request: &mut http::Request<WasiBody>, sending: &Sending) {
        let origin = sending.origin.to_string();
        let ordinal = self.sent_to.entry(origin.clone()).or_insert(0);
        *ordinal += 1;
        let headers = request.headers_mut();
        // The judged origin is the only host a request names: headers that
        // tell a proxy of another one are the guest's to set nowhere.
        headers.remove(http::header::FORWARDED);
        headers.remove("x-forwarded-host");
        if sending.allowed.idempotency_key && !headers.contains_key("idempotency-key") {
            let origin_digest = hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(origin.as_bytes())[..4]);
            let key = format!("jobhost-{}-{origin_digest}-{ordinal}", self.job_id);
            if let Ok(value) = http::HeaderValue::from_str(&key) {
                headers.insert("idempotency-key", value);
            }
        }
        if !headers.contains_key("traceparent") {
            let parent = match &mut self.trace {
                RequestTrace::Run { traceparent } => traceparent.clone(),
                RequestTrace::Unexported { trace_id } => {
                    format!("00-{}-{}-01", trace_id.get_or_insert_with(random_hex::<16>), random_hex::<8>())
                }
            };
            if let Ok(value) = http::HeaderValue::from_str(&parent) {
                headers.insert("traceparent", value);
            }
        }
    }
}

/// The trace context a run's requests carry.
enum RequestTrace {
    /// The run's exported span.
    Run { traceparent: String },
    /// No span is exported: a trace id for the run, a span id per request.
    /// The id is drawn at the first request (most runs send none).
    Unexported { trace_id: Option<String> },
}

/// `N` random bytes in hex; all ones if the system has no randomness (a
/// trace id is a label, not a secret).
fn random_hex<const N: usize>() -> String {
    let mut bytes = [0u8; N];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = [0xff; N];
    }
    hex::encode(bytes)
}

type Responding = Box<dyn Future<Output = Result<send::Sent, Error>> + Send>;

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _request_result: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Responding {
        let origin_text = Origin::of_uri(request.uri()).map(|o| o.to_string()).unwrap_or_default();
        let mut sending = match self.judge(&request, options) {
            Ok(sending) => sending,
            Err(error) => {
                self.record(&request, &origin_text, self.rule_of(&request), Some("refused".into()));
                return Box::new(async move { Err(error) });
            }
        };
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            let refusal = Refusal(format!(
                "{} {} refused: this run has {MAX_IN_FLIGHT} requests in flight already",
                request.method(),
                sending.origin
            ));
            let error = self.refuse(refusal, Error::ConnectionLimitReached).err();
            self.record(&request, &origin_text, sending.allowed.rule.clone(), Some("too many in flight".into()));
            return Box::new(async move { Err(error.unwrap_or(Error::ConnectionLimitReached)) });
        };
        let recorded = self.record(&request, &origin_text, sending.allowed.rule.clone(), None);
        sending.meter.1 = recorded.clone();
        // Metered as sent: after the swap, so a long value repeated in a
        // body counts at its length on the wire, not its placeholder's.
        let request = self.secrets.substitute(request, &sending.allowed.routes);
        let mut request = request.map(|body| {
            use http_body_util::BodyExt;
            Metered::new(body, self.budget.clone(), Direction::Sent, recorded.clone()).boxed_unsync()
        });
        let started = Instant::now();
        self.add_headers(&mut request, &sending);
        let head = request.method() == http::Method::HEAD;
        let (refusals, secrets) = (self.refusals.clone(), self.secrets.clone());
        Box::new(async move {
            let sent = send::send(request, sending).await;
            if let Ok(mut call) = recorded.lock() {
                call.ms = started.elapsed().as_millis() as u64;
                match &sent {
                    Ok((response, _)) => call.status = Some(response.status().as_u16()),
                    Err(SendError::Refused(_)) => call.error = Some("refused".into()),
                    // A request body past the budget has said so already.
                    Err(SendError::Failed(error)) => {
                        call.error.get_or_insert_with(|| format!("{error:?}"));
                    }
                }
            }
            match sent {
                // The permit is held until the response's body is read or dropped.
                Ok((response, driver)) => match secrets.swap_back(response, head) {
                    Ok(response) => Ok((
                        response,
                        Box::new(async move {
                            let _permit = permit;
                            Box::into_pin(driver).await
                        }) as Box<dyn Future<Output = _> + Send>,
                    )),
                    Err(error) => {
                        if let Ok(mut call) = recorded.lock() {
                            call.error = Some(format!("{error:?}: an encoded body cannot be searched for secrets"));
                        }
                        Err(error)
                    }
                },
                Err(SendError::Refused(refusal)) => {
                    if let Ok(mut refusals) = refusals.lock() {
                        refusals.push(refusal);
                    }
                    Err(Error::HttpRequestDenied)
                }
                Err(SendError::Failed(error)) => Err(error),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_looping_on_refusals_leaves_a_bounded_log() {
        let mut refusals = Refusals::default();
        for n in 0..MAX_REFUSAL_LINES + 8 {
            refusals.push(Refusal(format!("refusal {n}")));
        }
        let lines = refusals.take();
        assert_eq!(lines.len(), MAX_REFUSAL_LINES + 1);
        assert_eq!(lines.last().unwrap(), "8 more outbound requests were refused");
        assert!(refusals.take().is_empty(), "taken once");
    }
}
