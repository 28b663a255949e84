//! A run's budget of outbound body bytes: what its requests send and what
//! their responses bring, together. A server streaming without end, or a
//! guest uploading in a loop, stops at the budget with an error in the
//! guest, and the host never holds more than a frame of it at a time.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use wasmtime_wasi_http::Error;

use crate::types::OutboundCall;

/// One run's budget; clones share the counter.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    limit: u64,
    used: Arc<AtomicU64>,
}

impl BodyBudget {
    /// A budget of `limit` bytes, none used.
    pub fn new(limit: u64) -> Self {
        BodyBudget { limit, used: Arc::default() }
    }

    /// Takes `bytes` if they all fit; takes nothing otherwise.
    pub fn take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    /// The whole budget.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// Which way a metered body flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The request's body, from the guest to the server.
    Sent,
    /// The response's body, from the server to the guest.
    Received,
}

/// A body whose data is taken from the run's budget as it passes, counted
/// into the request's record; past the budget it fails with wasi:http's
/// body-size error for its direction, and the record says why.
pub struct Metered<B> {
    body: B,
    budget: BodyBudget,
    direction: Direction,
    call: Arc<Mutex<OutboundCall>>,
    moved: u64,
    spent: bool,
}

impl<B> Metered<B> {
    /// `body`, metered against `budget` into `call`.
    pub fn new(body: B, budget: BodyBudget, direction: Direction, call: Arc<Mutex<OutboundCall>>) -> Self {
        Metered { body, budget, direction, call, moved: 0, spent: false }
    }

    /// Counts `bytes` more; false once the budget cannot take them.
    fn count(&mut self, bytes: u64) -> bool {
        self.moved += bytes;
        let fits = self.budget.take(bytes);
        if let Ok(mut call) = self.call.lock() {
            let passed = if fits { bytes } else { 0 };
            match self.direction {
                Direction::Sent => call.request_bytes += passed,
                Direction::Received => call.response_bytes += passed,
            }
            if !fits {
                let what = match self.direction {
                    Direction::Sent => "sending the request body",
                    Direction::Received => "reading the response body",
                };
                call.error = Some(format!("the run's outbound budget of {} bytes ran out {what}", self.budget.limit()));
            }
        }
        fits
    }

    /// Writes why the body failed into the record, unless it says already.
    fn note(&self, error: &Error) {
        if let Ok(mut call) = self.call.lock() {
            let what = match self.direction {
                Direction::Sent => "sending the request body",
                Direction::Received => "reading the response body",
            };
            call.error.get_or_insert_with(|| format!("{error:?} {what}"));
        }
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Error>,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.spent {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let bytes = frame.data_ref().map_or(0, |data| data.len() as u64);
                if bytes > 0 && !self.count(bytes) {
                    self.spent = true;
                    let moved = Some(self.moved);
                    return Poll::Ready(Some(Err(match self.direction {
                        Direction::Sent => Error::HttpRequestBodySize(moved),
                        Direction::Received => Error::HttpResponseBodySize(moved),
                    })));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                let error: Error = error.into();
                self.note(&error);
                Poll::Ready(Some(Err(error)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.spent || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    fn call() -> Arc<Mutex<OutboundCall>> {
        Arc::new(Mutex::new(OutboundCall {
            method: "GET".into(),
            origin: "http://127.0.0.1:1".into(),
            path: "/".into(),
            rule: "http://127.0.0.1:*".into(),
            status: Some(200),
            error: None,
            request_bytes: 0,
            response_bytes: 0,
            ms: 0,
        }))
    }

    fn full(bytes: usize) -> http_body_util::combinators::UnsyncBoxBody<Bytes, Error> {
        Full::new(Bytes::from(vec![b'x'; bytes])).map_err(|never| match never {}).boxed_unsync()
    }

    #[tokio::test]
    async fn bodies_of_one_run_share_its_budget_and_stop_at_it() {
        let budget = BodyBudget::new(100);
        let sent = call();
        let body = Metered::new(full(60), budget.clone(), Direction::Sent, sent.clone());
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 60);
        assert_eq!(sent.lock().unwrap().request_bytes, 60);

        let received = call();
        let body = Metered::new(full(50), budget.clone(), Direction::Received, received.clone());
        let Err(error) = body.collect().await else { panic!("past the budget") };
        assert!(matches!(error, Error::HttpResponseBodySize(Some(50))), "{error:?}");
        let record = received.lock().unwrap().clone();
        assert_eq!(record.response_bytes, 0, "the refused frame did not pass");
        let why = record.error.unwrap();
        assert_eq!(why, "the run's outbound budget of 100 bytes ran out reading the response body");
        assert!(budget.take(40), "the refused frame took nothing");
        assert!(!budget.take(1));
    }
}
