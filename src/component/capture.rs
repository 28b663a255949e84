//! A guest's stdout or stderr, kept in memory up to a bound and within the
//! run's byte budget. Output past either is dropped and flagged, never an
//! error: a chatty guest must not fail because of its logging.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::component::budget::RunBudget;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Bytes a guest may hand over in one write.
const WRITE_BUDGET: usize = 64 << 10;

/// A bounded in-memory output stream; clones share one buffer.
#[derive(Clone)]
pub struct CapturedOutput {
    inner: Arc<Mutex<Buffer>>,
}

struct Buffer {
    bytes: Vec<u8>,
    limit: usize,
    budget: RunBudget,
    truncated: bool,
}

impl CapturedOutput {
    /// An empty capture that keeps at most `limit` bytes, each taken from `budget`.
    pub fn new(limit: usize, budget: RunBudget) -> Self {
        CapturedOutput { inner: Arc::new(Mutex::new(Buffer { bytes: Vec::new(), limit, budget, truncated: false })) }
    }

    /// What was kept, as text (invalid UTF-8 replaced), and whether more was written.
    pub fn contents(&self) -> (String, bool) {
        let buffer = self.lock();
        (String::from_utf8_lossy(&buffer.bytes).into_owned(), buffer.truncated)
    }

    fn append(&self, data: &[u8]) {
        let mut buffer = self.lock();
        let room = buffer.limit.saturating_sub(buffer.bytes.len());
        let kept = buffer.budget.take_up_to(data.len().min(room));
        if data.len() > kept {
            buffer.truncated = true;
        }
        buffer.bytes.extend_from_slice(&data[..kept]);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        // A panic while holding this lock cannot leave the buffer inconsistent
        // (appends are single calls), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_BUDGET)
    }
}

#[async_trait::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CapturedOutput {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        self.append(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_up_to_the_limit_and_flags_the_rest() {
        let mut out = CapturedOutput::new(5, RunBudget::new(100));
        out.write(Bytes::from_static(b"abc")).unwrap();
        out.write(Bytes::from_static(b"defg")).unwrap();
        assert_eq!(out.contents(), ("abcde".to_string(), true));
    }

    #[test]
    fn under_the_limit_is_not_truncated() {
        let mut out = CapturedOutput::new(64, RunBudget::new(100));
        out.write(Bytes::from_static(b"hi\n")).unwrap();
        assert_eq!(out.contents(), ("hi\n".to_string(), false));
    }

    #[test]
    fn keeps_no_more_than_the_runs_budget_leaves() {
        let budget = RunBudget::new(4);
        assert!(budget.try_take(1));
        let mut out = CapturedOutput::new(64, budget.clone());
        out.write(Bytes::from_static(b"abcdef")).unwrap();
        assert_eq!(out.contents(), ("abc".to_string(), true));
        assert_eq!(budget.left(), 0);
    }
}
