//! Where a request may carry a secret's value: its header values always,
//! and where a grant says so (`--secret-in query,body`) its query string
//! and its body. The guest wrote placeholders; the host swaps in the values
//! on the way out, the body as it streams, a frame at a time.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use aho_corasick::{AhoCorasick, MatchKind};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
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

/// A header name as `jobhost grant --secret-header` takes it, lower case.
///
/// # Errors
/// Anything that is not an HTTP header name, with the reason.
pub fn header_name(text: &str) -> Result<String, String> {
    let name = text.trim().to_ascii_lowercase();
    http::HeaderName::from_bytes(name.as_bytes())
        .map(|_| name)
        .map_err(|_| format!("{text:?} is not a header name like authorization or x-api-key"))
}

/// What one swap finds and what it puts in its place: a placeholder and
/// its value on the way out, a value's forms and the placeholder on the
/// way back.
pub type Swap = (Vec<u8>, Bytes);

/// Finds every swap's pattern at once, leftmost first and, of patterns
/// starting at one place, the longest (a value's escaped form before the
/// value it contains).
#[derive(Clone)]
pub struct Swaps {
    finder: AhoCorasick,
    patterns: Vec<Bytes>,
    replacements: Vec<Bytes>,
    longest: usize,
}

impl Swaps {
    /// The swaps, or `None` when there is nothing to find.
    pub fn new(swaps: Vec<Swap>) -> Option<Swaps> {
        let swaps: Vec<Swap> = swaps.into_iter().filter(|(pattern, _)| !pattern.is_empty()).collect();
        if swaps.is_empty() {
            return None;
        }
        let longest = swaps.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let finder =
            AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(swaps.iter().map(|(p, _)| p)).ok()?;
        let (patterns, replacements) = swaps.into_iter().map(|(p, r)| (Bytes::from(p), r)).unzip();
        Some(Swaps { finder, patterns, replacements, longest })
    }

    /// These swaps, with the `n`th made only where `keep(n)`: a pattern
    /// not kept is found (so it is never mistaken for part of another)
    /// and left as it is. Shares the search with `self`, so a run builds
    /// its searches once, not once a request.
    pub fn keeping(&self, keep: impl Fn(usize) -> bool) -> Swaps {
        let replacements = (0..self.patterns.len())
            .map(|n| if keep(n) { self.replacements[n].clone() } else { self.patterns[n].clone() })
            .collect();
        Swaps { replacements, ..self.clone() }
    }

    /// Whether `text` holds any pattern.
    pub fn found_in(&self, text: &[u8]) -> bool {
        self.finder.is_match(text)
    }

    /// `headers` with every pattern swapped in their values; a value that
    /// no longer makes a header is dropped rather than kept unswapped.
    pub fn apply_to_headers(&self, headers: &mut http::HeaderMap) {
        let mut dropped = Vec::new();
        for (name, value) in headers.iter_mut() {
            if !self.found_in(value.as_bytes()) {
                continue;
            }
            match http::HeaderValue::from_bytes(&self.apply(value.as_bytes())) {
                Ok(swapped) => *value = swapped,
                Err(_) => dropped.push(name.clone()),
            }
        }
        for name in dropped {
            headers.remove(name);
        }
    }

    /// `text` with every pattern swapped.
    pub fn apply(&self, text: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        self.finder.replace_all_with_bytes(text, &mut out, |found, _, out| {
            out.extend_from_slice(&self.replacements[found.pattern().as_usize()]);
            true
        });
        out
    }
}

/// A body with patterns swapped as it streams: placeholders for values on
/// a request's way out, values' forms for placeholders on a response's way
/// back. A pattern split across two frames is found: the last bytes that
/// could begin one wait for the next frame. Small frames are gathered until
/// twice the longest pattern is held before they are searched, so a server
/// trickling bytes one at a time costs a search of each byte a bounded
/// number of times, never the whole held tail again per byte; the body held
/// never exceeds a frame and twice the longest pattern.
pub struct Substituted<B> {
    body: B,
    swaps: Swaps,
    /// Whether a trailers frame has its values swapped too (a response's).
    trailers: bool,
    /// Bytes held back: they may begin a pattern.
    held: Vec<u8>,
    /// Frames ready to go out (a data frame, then a trailers frame after it).
    ready: VecDeque<Frame<Bytes>>,
    ended: bool,
}

impl<B> Substituted<B> {
    /// `body`, with `swaps` made as it streams.
    pub fn with(body: B, swaps: Swaps) -> Self {
        Substituted { body, swaps, trailers: false, held: Vec::new(), ready: VecDeque::new(), ended: false }
    }

    /// This body, with a trailers frame's values swapped too.
    pub fn swapping_trailers(self) -> Self {
        Substituted { trailers: true, ..self }
    }

    /// Swaps what `held` holds, sending all but a tail that may begin a
    /// pattern (everything, at the end).
    fn swap(&mut self, at_end: bool) -> Option<Bytes> {
        let tail = self.swaps.longest.saturating_sub(1);
        // A pattern beginning before `keep_from` lies wholly in `held`, so
        // the search sees it whole, with any longer one starting there; one
        // found past it may be the start of a longer one, and waits.
        let keep_from = if at_end { self.held.len() } else { self.held.len().saturating_sub(tail) };
        let mut out = Vec::with_capacity(self.held.len());
        let mut at = 0;
        for found in self.swaps.finder.find_iter(&self.held[..]) {
            if found.start() >= keep_from {
                break;
            }
            out.extend_from_slice(&self.held[at..found.start()]);
            out.extend_from_slice(&self.swaps.replacements[found.pattern().as_usize()]);
            at = found.end();
        }
        let sent = at.max(keep_from);
        out.extend_from_slice(&self.held[at..sent]);
        self.held.drain(..sent);
        (!out.is_empty()).then(|| Bytes::from(out))
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
                        if self.held.len() >= 2 * self.swaps.longest
                            && let Some(out) = self.swap(false)
                        {
                            self.ready.push_back(Frame::data(out));
                        }
                    }
                    Err(frame) => {
                        if let Some(out) = self.swap(true) {
                            self.ready.push_back(Frame::data(out));
                        }
                        let frame = match frame.into_trailers() {
                            Ok(mut trailers) if self.trailers => {
                                self.swaps.apply_to_headers(&mut trailers);
                                Frame::trailers(trailers)
                            }
                            Ok(trailers) => Frame::trailers(trailers),
                            Err(other) => other,
                        };
                        self.ready.push_back(frame);
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
        let swaps = swaps.iter().map(|(p, v)| (p.as_bytes().to_vec(), Bytes::copy_from_slice(v.as_bytes()))).collect();
        let body = Substituted::with(frames, Swaps::new(swaps).unwrap());
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
