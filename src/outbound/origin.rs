//! Origin patterns: what a component declares and an operator grants, and
//! the one rule by which a request's origin matches them.
//!
//! A pattern is `scheme://host[:port]`. The host is a name (`api.mailgun.net`),
//! a name under a domain (`*.example.com`: any name below it, not the domain
//! itself), an IP literal (`127.0.0.1`, `[::1]`), or `*` for any host. The
//! port is a number or `*`; left out, it is the scheme's default. Nothing
//! else may follow: a pattern names an origin, not a path.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The schemes a request may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTP over TLS.
    Https,
}

impl Scheme {
    /// The port a URL of this scheme means when it names none.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// Which hosts a pattern covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this name, lower case.
    Name(String),
    /// Any name ending in `.` and this domain, lower case.
    Below(String),
    /// Exactly this address, written as an IP literal.
    Address(IpAddr),
    /// Any host.
    Any,
}

/// Which ports a pattern covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortPattern {
    /// This port only (the scheme's default when the pattern names none).
    Exactly(u16),
    /// Any port (`:*`).
    Any,
}

/// A parsed origin pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OriginPattern {
    /// The scheme, matched exactly.
    pub scheme: Scheme,
    /// The hosts covered.
    pub host: HostPattern,
    /// The ports covered.
    pub port: PortPattern,
}

/// The origin of one request, as the host is about to send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The request's scheme.
    pub scheme: Scheme,
    /// Lower case; an IPv6 literal without brackets.
    pub host: String,
    /// The port, the scheme's default when the URI names none.
    pub port: u16,
}

impl Origin {
    /// The origin a request URI names.
    ///
    /// # Errors
    /// A scheme other than http or https, a user name or password in the
    /// authority, or no host.
    pub fn of_uri(uri: &http::Uri) -> Result<Origin, String> {
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            other => return Err(format!("the scheme {other:?} is not http or https")),
        };
        // `http://internal.example@127.0.0.1/` is judged as 127.0.0.1, but a
        // server routing on the raw authority would read the name before
        // `@`: a URL carries no credentials here (send them in a header).
        if uri.authority().is_some_and(|authority| authority.as_str().contains('@')) {
            return Err("the URL carries a user name or password before `@`; put credentials in a header".into());
        }
        let host = uri.host().filter(|h| !h.is_empty()).ok_or("the request names no host")?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        // An IPv6 zone (`fe80::1%25eth0`) names an interface, not a host.
        if host.contains('%') {
            return Err(format!("the host {host:?} names a network interface (a zone after `%`); no request may"));
        }
        Ok(Origin { scheme, host, port: uri.port_u16().unwrap_or(scheme.default_port()) })
    }

    /// `host[:port]` as a request's `Host` header names it: the port only
    /// when it is not the scheme's default, an IPv6 address in brackets.
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        if self.port == self.scheme.default_port() { host } else { format!("{host}:{}", self.port) }
    }

    /// The host as an address, when it is an IP literal.
    pub fn address(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.authority())
    }
}

impl OriginPattern {
    /// Whether `origin` is one this pattern covers.
    pub fn matches(&self, origin: &Origin) -> bool {
        let port = match self.port {
            PortPattern::Exactly(port) => port == origin.port,
            PortPattern::Any => true,
        };
        let host = match &self.host {
            HostPattern::Name(name) => *name == origin.host,
            HostPattern::Below(domain) => origin
                .host
                .strip_suffix(domain.as_str())
                .is_some_and(|label| label.len() > 1 && label.ends_with('.') && origin.address().is_none()),
            HostPattern::Address(address) => origin.address() == Some(*address),
            HostPattern::Any => true,
        };
        self.scheme == origin.scheme && port && host
    }

    /// Whether the pattern's names are loopback by definition: `localhost`
    /// and the names below it (RFC 6761), which only a `--private` grant reaches.
    pub fn is_loopback_name(&self) -> bool {
        match &self.host {
            HostPattern::Name(name) => name == "localhost" || name.ends_with(".localhost"),
            HostPattern::Below(domain) => domain == "localhost" || domain.ends_with(".localhost"),
            HostPattern::Address(_) | HostPattern::Any => false,
        }
    }

    /// Whether some origin falls under both patterns: for showing which
    /// grants meet which declared rules.
    pub fn overlaps(&self, other: &OriginPattern) -> bool {
        let ports = match (self.port, other.port) {
            (PortPattern::Exactly(a), PortPattern::Exactly(b)) => a == b,
            _ => true,
        };
        let below =
            |name: &str, domain: &str| name.strip_suffix(domain).is_some_and(|l| l.len() > 1 && l.ends_with('.'));
        let hosts = match (&self.host, &other.host) {
            (HostPattern::Any, _) | (_, HostPattern::Any) => true,
            (HostPattern::Name(a), HostPattern::Name(b)) => a == b,
            (HostPattern::Address(a), HostPattern::Address(b)) => a == b,
            (HostPattern::Name(name), HostPattern::Below(domain))
            | (HostPattern::Below(domain), HostPattern::Name(name)) => below(name, domain),
            (HostPattern::Below(a), HostPattern::Below(b)) => a == b || below(a, b) || below(b, a),
            _ => false,
        };
        self.scheme == other.scheme && ports && hosts
    }

    /// Whether this pattern names its host exactly, as an IP literal: such
    /// a grant reaches that address even where it is private.
    pub fn names_an_address(&self) -> Option<IpAddr> {
        match self.host {
            HostPattern::Address(address) => Some(address),
            _ => None,
        }
    }
}

impl FromStr for OriginPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| Err(format!("{text:?} is not an origin pattern: {why}"));
        let Some((scheme, rest)) = text.split_once("://") else {
            return bad("it starts with http:// or https://");
        };
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return bad("the scheme is http or https"),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return bad("it names an origin only (no path, query or user)");
        }
        let (host, port) = split_port(rest).ok_or_else(|| format!("{text:?} is not an origin pattern: a bad port"))?;
        let port = match port {
            None => PortPattern::Exactly(scheme.default_port()),
            Some("*") => PortPattern::Any,
            Some(digits) => match digits.parse::<u16>() {
                Ok(port) if port > 0 && digits.bytes().all(|b| b.is_ascii_digit()) => PortPattern::Exactly(port),
                _ => return bad("the port is a number from 1 to 65535, or *"),
            },
        };
        let host = if host == "*" {
            HostPattern::Any
        } else if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            match inner.parse::<std::net::Ipv6Addr>() {
                Ok(address) => HostPattern::Address(IpAddr::V6(address)),
                Err(_) => return bad("the brackets hold no IPv6 address"),
            }
        } else if let Ok(address) = host.parse::<std::net::Ipv4Addr>() {
            HostPattern::Address(IpAddr::V4(address))
        } else if let Some(domain) = host.strip_prefix("*.") {
            HostPattern::Below(name(domain).map_err(|why| format!("{text:?} is not an origin pattern: {why}"))?)
        } else {
            HostPattern::Name(name(host).map_err(|why| format!("{text:?} is not an origin pattern: {why}"))?)
        };
        Ok(OriginPattern { scheme, host, port })
    }
}

/// `host[:port]`, where an IPv6 host is in brackets.
fn split_port(authority: &str) -> Option<(&str, Option<&str>)> {
    if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, after) = authority.split_at(end + 1);
        return match after {
            "" => Some((host, None)),
            _ => after.strip_prefix(':').map(|port| (host, Some(port))),
        };
    }
    match authority.split_once(':') {
        Some((host, port)) => Some((host, Some(port))),
        None => Some((authority, None)),
    }
}

/// A host name in lower case, checked: ASCII labels of letters, digits and
/// hyphens (an internationalised name is written in its `xn--` form).
fn name(host: &str) -> Result<String, String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err("the host is a name of ASCII letters, digits, hyphens and dots, an IP literal, or *".into());
    }
    Ok(host)
}

impl fmt::Display for OriginPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostPattern::Name(name) => name.clone(),
            HostPattern::Below(domain) => format!("*.{domain}"),
            HostPattern::Address(IpAddr::V6(address)) => format!("[{address}]"),
            HostPattern::Address(address) => address.to_string(),
            HostPattern::Any => "*".to_string(),
        };
        match self.port {
            PortPattern::Exactly(port) if port == self.scheme.default_port() => {
                write!(f, "{}://{host}", self.scheme.as_str())
            }
            PortPattern::Exactly(port) => write!(f, "{}://{host}:{port}", self.scheme.as_str()),
            PortPattern::Any => write!(f, "{}://{host}:*", self.scheme.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(url: &str) -> Origin {
        Origin::of_uri(&url.parse().unwrap()).unwrap()
    }

    fn pattern(text: &str) -> OriginPattern {
        text.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_url_with_a_user_name_is_refused_and_the_host_header_is_the_judged_origin() {
        for url in ["http://internal-admin.example:80@127.0.0.1:8080/echo", "https://user:pw@api.example.com/"] {
            let refused = Origin::of_uri(&url.parse().unwrap()).unwrap_err();
            assert!(refused.contains("user name or password"), "{url}: {refused}");
        }
        assert_eq!(origin("http://127.0.0.1:8080/x").authority(), "127.0.0.1:8080");
        assert_eq!(origin("https://API.example.com:443/").authority(), "api.example.com");
        assert_eq!(origin("http://[::1]:9/").authority(), "[::1]:9");
        assert!(Origin::of_uri(&"http://[fe80::1%25eth0]/".parse().unwrap()).is_err(), "a zone is refused");
    }

    #[test]
    fn a_name_matches_itself_on_the_default_port_only() {
        let mailgun = pattern("https://api.mailgun.net");
        assert!(mailgun.matches(&origin("https://api.mailgun.net/v3/messages")));
        assert!(mailgun.matches(&origin("https://API.Mailgun.net:443/")));
        assert!(!mailgun.matches(&origin("http://api.mailgun.net/")), "another scheme");
        assert!(!mailgun.matches(&origin("https://api.mailgun.net:8443/")), "another port");
        assert!(!mailgun.matches(&origin("https://api.mailgun.net.evil.com/")));
        assert!(!mailgun.matches(&origin("https://evilapi.mailgun.net/")));
    }

    #[test]
    fn a_wildcard_covers_names_below_the_domain_not_the_domain() {
        let below = pattern("https://*.example.com");
        assert!(below.matches(&origin("https://a.example.com/")));
        assert!(below.matches(&origin("https://a.b.example.com/")));
        assert!(!below.matches(&origin("https://example.com/")));
        assert!(!below.matches(&origin("https://badexample.com/")));
        assert!(!below.matches(&origin("https://example.com.evil/")));
    }

    #[test]
    fn ports_and_addresses() {
        assert!(pattern("https://api.example.com:*").matches(&origin("https://api.example.com:9999/")));
        let loopback = pattern("http://127.0.0.1:8025");
        assert!(loopback.matches(&origin("http://127.0.0.1:8025/send")));
        assert!(!loopback.matches(&origin("http://127.0.0.1:8026/")));
        assert!(!loopback.matches(&origin("http://localhost:8025/")), "a name is not the address");
        assert_eq!(loopback.names_an_address(), Some("127.0.0.1".parse().unwrap()));
        let v6 = pattern("http://[::1]:*");
        assert!(v6.matches(&origin("http://[::1]:1234/")));
        assert!(pattern("https://*").matches(&origin("https://anything.example/")));
        assert!(!pattern("https://*").matches(&origin("http://anything.example/")));
    }

    #[test]
    fn what_is_not_an_origin_is_refused_with_the_reason() {
        for bad in [
            "api.mailgun.net",
            "ftp://example.com",
            "https://example.com/path",
            "https://user@example.com",
            "https://example.com:0",
            "https://example.com:99999",
            "https://example.com:+80",
            "https://exa mple.com",
            "https://bücher.example",
            "https://",
            "https://[not-v6]",
        ] {
            let error = bad.parse::<OriginPattern>().unwrap_err();
            assert!(error.contains("is not an origin pattern"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_pattern_prints_as_it_parses() {
        for text in
            ["https://api.mailgun.net", "https://*.example.com", "http://127.0.0.1:8025", "http://[::1]:*", "https://*"]
        {
            assert_eq!(pattern(text).to_string(), text);
            assert_eq!(pattern(&pattern(text).to_string()), pattern(text));
        }
        assert_eq!(pattern("HTTPS://API.Example.COM:443/").to_string(), "https://api.example.com");
    }

    #[test]
    fn patterns_overlap_where_one_origin_falls_under_both() {
        let pattern = |text: &str| text.parse::<OriginPattern>().unwrap();
        for (a, b, overlap) in [
            ("http://127.0.0.1:*", "http://127.0.0.1:8025", true),
            ("http://127.0.0.1:8025", "http://127.0.0.1:8026", false),
            ("https://*.example.com", "https://api.example.com", true),
            ("https://*.example.com", "https://example.com", false),
            ("https://*.example.com", "https://*.eu.example.com", true),
            ("https://api.example.com", "http://api.example.com", false),
            ("https://api.example.com", "https://*:*", true),
            ("http://localhost:*", "http://127.0.0.1:*", false),
        ] {
            assert_eq!(pattern(a).overlaps(&pattern(b)), overlap, "{a} and {b}");
            assert_eq!(pattern(b).overlaps(&pattern(a)), overlap, "{b} and {a}");
        }
    }
}
