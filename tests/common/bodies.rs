//! Response bodies for outbound tests' servers: one that sends a little and
//! then pauses for ever, one that streams a gigabyte without holding it,
//! one of given frames.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};

/// Sends its first bytes, then never another.
pub struct Trickle {
    pub first: Option<Bytes>,
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.first.take() {
            Some(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            None => Poll::Pending,
        }
    }
}

/// `total` bytes in 64 KiB frames, made as the client takes them; `sent`
/// counts what left.
pub struct Flood {
    pub total: u64,
    pub sent: Arc<AtomicU64>,
}

impl Body for Flood {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        static CHUNK: [u8; 64 << 10] = [b'x'; 64 << 10];
        let sent = self.sent.load(Ordering::Relaxed);
        if sent >= self.total {
            return Poll::Ready(None);
        }
        let size = (self.total - sent).min(CHUNK.len() as u64);
        self.sent.fetch_add(size, Ordering::Relaxed);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK[..size as usize])))))
    }
}

/// The given frames, one at a time.
pub struct Frames(pub std::collections::VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|bytes| Ok(Frame::data(bytes))))
    }
}
