//! Where a request may carry a secret's value: its header values always,
//! and where a grant says so (`--secret-in query,body`) its query string
//! and its body. The guest wrote placeholders; the host swaps in the values
//! on the way out, the body as it streams, a frame at a time.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use memchr::memmem;
use wasmtime_wasi_http::Error;

/// The places besides headers a grant lets secrets go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Places {
    /// The query string, each value percent-encoded.
    pub query: bool,
    /// The request body, as it streams.
    pub body: bool,
}

impl Places {
    /// The places named by a grant's `secrets_in` list (`query`, `body`).
    pub fn of(names: &[String]) -> Places {
        Places { query: names.iter().any(|n| n == "query"), body: names.iter().any(|n| n == "body") }
    }

    /// Both grants' places.
    pub fn with(self, other: Places) -> Places {
        Places { query: self.query || other.query, body: self.body || other.body }
    }
}

/// A place's name as `jobhost grant --secret-in` takes it.
///
/// # Errors
/// Anything but `query` or `body`, with the reason.
pub fn place_name(text: &str) -> Result<String, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        place @ ("query" | "body") => Ok(place.to_string()),
        _ => Err(format!("{text:?} is not a place for secrets: query or body (headers always carry them)")),
    }
}

/// `query` with each placeholder swapped for its value, percent-encoded;
/// `None` when it holds none.
pub fn swap_in_query(query: &str, swaps: &[(&str, &str)]) -> Option<String> {
    if !swaps.iter().any(|(placeholder, _)| query.contains(placeholder)) {
        return None;
    }
    let mut swapped = query.to_string();
    for (placeholder, value) in swaps {
        let encoded = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string();
        swapped = swapped.replace(placeholder, &encoded);
    }
    Some(swapped)
}

/// A request body with placeholders swapped for values as it streams. A
/// placeholder split across two frames is found: the last bytes of a frame
/// that could begin one wait for the next frame.
pub struct Substituted<B> {
    body: B,
    swaps: Vec<(Vec<u8>, Bytes)>,
    /// Bytes held back: they may begin a placeholder.
    held: Vec<u8>,
    /// Frames ready to go out (a data frame, then a trailers frame after it).
    ready: VecDeque<Frame<Bytes>>,
    ended: bool,
}

impl<B> Substituted<B> {
    /// `body`, with each placeholder of `swaps` replaced by its value.
    pub fn new(body: B, swaps: &[(&str, &str)]) -> Self {
        let swaps = swaps.iter().map(|(p, v)| (p.as_bytes().to_vec(), Bytes::copy_from_slice(v.as_bytes()))).collect();
        Substituted { body, swaps, held: Vec::new(), ready: VecDeque::new(), ended: false }
    }

    /// The longest placeholder: a tail shorter than it may be the start of one.
    fn longest(&self) -> usize {
        self.swaps.iter().map(|(p, _)| p.len()).max().unwrap_or(0)
    }

    /// Swaps what `held` holds, sending all but a tail that may begin a
    /// placeholder (everything, at the end). Each placeholder is searched
    /// for with a vectorised substring search: the body is scanned in
    /// bulk, not tried at every byte.
    fn swap(&mut self, at_end: bool) -> Option<Bytes> {
        let tail = self.longest().saturating_sub(1);
        // A placeholder beginning before `keep_from` would lie wholly in
        // `held`, so the search finds it; only a tail past it is held back.
        let keep_from = if at_end { self.held.len() } else { self.held.len().saturating_sub(tail) };
        let mut out = Vec::with_capacity(self.held.len());
        let mut at = 0;
        while let Some((found, index)) = self.next_placeholder(at) {
            let (placeholder, value) = &self.swaps[index];
            out.extend_from_slice(&self.held[at..found]);
            out.extend_from_slice(value);
            at = found + placeholder.len();
        }
        let sent = at.max(keep_from);
        out.extend_from_slice(&self.held[at..sent]);
        self.held.drain(..sent);
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    /// The first placeholder in `held` at or after `from`: where it starts,
    /// and which one it is.
    fn next_placeholder(&self, from: usize) -> Option<(usize, usize)> {
        let rest = &self.held[from..];
        self.swaps
            .iter()
            .enumerate()
            .filter_map(|(index, (placeholder, _))| Some((from + memmem::find(rest, placeholder)?, index)))
            .min()
    }
}

impl<B> Body for Substituted<B>
where
    B: Body<Data = Bytes, Error = Error> + Unpin,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        self.held.extend_from_slice(&data);
                        if let Some(out) = self.swap(false) {
                            self.ready.push_back(Frame::data(out));
                        }
                    }
                    Err(trailers) => {
                        if let Some(out) = self.swap(true) {
                            self.ready.push_back(Frame::data(out));
                        }
                        self.ready.push_back(trailers);
                    }
                },
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(None) => {
                    self.ended = true;
                    if let Some(out) = self.swap(true) {
                        self.ready.push_back(Frame::data(out));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.ready.is_empty()
    }

    /// Unknown: a swap changes the length, so the body goes out chunked.
    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const PLACEHOLDER: &str = "jobhost-secret-0123456789abcdef0123456789abcdef";

    /// A body of the given frames.
    struct Frames(VecDeque<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Error;

        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
            Poll::Ready(self.0.pop_front().map(|bytes| Ok(Frame::data(bytes))))
        }
    }

    async fn through(frames: &[&str], swaps: &[(&str, &str)]) -> String {
        let frames = Frames(frames.iter().map(|f| Bytes::copy_from_slice(f.as_bytes())).collect());
        let body = Substituted::new(frames, swaps);
        String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_placeholder_is_swapped_wherever_the_frames_split_it() {
        let swaps = [(PLACEHOLDER, "s3cr&t")];
        let whole = format!("{{\"key\": \"{PLACEHOLDER}\", \"again\": \"{PLACEHOLDER}\"}}");
        let expected = whole.replace(PLACEHOLDER, "s3cr&t");
        for split in 0..whole.len() {
            let (a, b) = whole.split_at(split);
            assert_eq!(through(&[a, b], &swaps).await, expected, "split at {split}");
        }
        let bytes: Vec<String> = whole.chars().map(String::from).collect();
        let one_by_one: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(through(&one_by_one, &swaps).await, expected);
        let other = "jobhost-secret-ffffffffffffffffffffffffffffffff";
        assert_eq!(through(&[other], &swaps).await, other, "a placeholder not allowed goes out as it is");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        let query = format!("key={PLACEHOLDER}&x=1");
        assert_eq!(swap_in_query(&query, &[(PLACEHOLDER, "a b&c")]).unwrap(), "key=a%20b%26c&x=1");
        assert_eq!(swap_in_query("x=1", &[(PLACEHOLDER, "v")]), None);
    }
}
