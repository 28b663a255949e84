//! The two-sided allow-list: a request goes out only when a rule the
//! component declares and a grant the operator stored both match its
//! method and origin. Neither side widens the other: the methods and
//! secrets a request may use are those both allow. A refusal says which
//! side is missing and, where the operator can fix it, the exact command.

use std::net::IpAddr;

use super::address::private_range;
use super::origin::{Origin, OriginPattern};
use super::substitute::Places;
use crate::store::grant::GrantTimeouts;

/// One side's rule: an origin pattern, the methods (upper case; empty
/// allows any) and the secrets requests matching it may carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The origins covered.
    pub origin: OriginPattern,
    /// The methods, upper case; empty allows any.
    pub methods: Vec<String>,
    /// The secrets, by name.
    pub secrets: Vec<String>,
}

impl Rule {
    fn allows_method(&self, method: &str) -> bool {
        self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }
}

/// An operator's grant: a rule, and whether its names may resolve to
/// private addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRule {
    /// What the grant allows.
    pub rule: Rule,
    /// Whether its names may resolve to private addresses.
    pub private: bool,
    /// Whether its requests carry an `Idempotency-Key`.
    pub idempotency_key: bool,
    /// Its own step timeouts, where it sets them.
    pub timeouts: GrantTimeouts,
    /// Where besides headers its secrets may be swapped in.
    pub secrets_in: Places,
    /// The headers its secrets may be swapped into, lower case; empty: any.
    pub secret_headers: Vec<String>,
}

/// What one job type's runs may reach: its declared rules and its grants,
/// as read at the run's start.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The job type, for refusals and hints.
    pub job_type: String,
    /// The rules its component declares.
    pub declared: Vec<Rule>,
    /// The operator's grants for it.
    pub granted: Vec<GrantRule>,
}

/// A request the policy lets out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The secrets both sides let this request carry.
    pub secrets: Vec<String>,
    /// Whether a matching grant lets it reach private addresses.
    pub private: bool,
    /// Addresses a matching grant names as IP literals: reachable even
    /// when private.
    pub named_addresses: Vec<IpAddr>,
    /// Whether a matching grant asks for an `Idempotency-Key`.
    pub idempotency_key: bool,
    /// The step timeouts the matching grants set, the widest of each.
    pub timeouts: GrantTimeouts,
    /// Where each of those secrets may go, by the matching grants that
    /// name it (not those naming another).
    pub routes: Vec<SecretRoute>,
    /// The first declared rule it matched, printed: what metrics label it by.
    pub rule: String,
}

/// Where one secret may be swapped into a request: the places and the
/// headers of the matching grants that name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRoute {
    /// The secret.
    pub name: String,
    /// Where besides headers: any place one of those grants names.
    pub places: Places,
    /// The headers, lower case, or `None` for any: the names those grants
    /// list, and any header where one of them lists none.
    pub headers: Option<Vec<String>>,
}

impl SecretRoute {
    /// The route of `name` through the `grants` matching a request.
    fn of(name: &str, grants: &[&GrantRule]) -> SecretRoute {
        let naming: Vec<&&GrantRule> = grants.iter().filter(|g| g.rule.secrets.iter().any(|n| n == name)).collect();
        let places = naming.iter().fold(Places::default(), |places, g| places.with(g.secrets_in));
        let headers = if naming.iter().any(|g| g.secret_headers.is_empty()) {
            None
        } else {
            let mut headers: Vec<String> = naming.iter().flat_map(|g| g.secret_headers.clone()).collect();
            headers.sort();
            headers.dedup();
            Some(headers)
        };
        SecretRoute { name: name.to_string(), places, headers }
    }

    /// Whether the secret may go into the header `name` (lower case).
    pub fn allows_header(&self, name: &str) -> bool {
        self.headers.as_ref().is_none_or(|headers| headers.iter().any(|h| h == name))
    }
}

/// Why a request was refused: one line for the job's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl Policy {
    /// Whether `method` to `origin` may go out, before any name is resolved.
    ///
    /// # Errors
    /// The refusal, naming the missing side.
    pub fn decide(&self, method: &str, origin: &Origin) -> Result<Allowed, Refusal> {
        let declared: Vec<&Rule> = self.declared.iter().filter(|r| r.origin.matches(origin)).collect();
        if declared.is_empty() {
            return Err(Refusal(format!(
                "{method} {origin} refused: job type {} does not declare {origin} in describe().outbound \
                 (a grant alone never allows a request)",
                self.job_type
            )));
        }
        let declared: Vec<&Rule> = declared.into_iter().filter(|r| r.allows_method(method)).collect();
        let Some(first) = declared.first() else {
            return Err(Refusal(format!(
                "{method} {origin} refused: job type {} declares {origin} for other methods only",
                self.job_type
            )));
        };
        let grants: Vec<&GrantRule> =
            self.granted.iter().filter(|g| g.rule.origin.matches(origin) && g.rule.allows_method(method)).collect();
        if grants.is_empty() {
            return Err(Refusal(format!(
                "{method} {origin} refused: not granted; `{}` allows it{}",
                grant_command(&self.job_type, first),
                secrets_hint(first)
            )));
        }
        let declared_secrets: Vec<&String> = declared.iter().flat_map(|r| &r.secrets).collect();
        let mut secrets: Vec<String> = grants
            .iter()
            .flat_map(|g| &g.rule.secrets)
            .filter(|name| declared_secrets.contains(name))
            .cloned()
            .collect();
        secrets.sort();
        secrets.dedup();
        let routes = secrets.iter().map(|name| SecretRoute::of(name, &grants)).collect();
        Ok(Allowed {
            secrets,
            private: grants.iter().any(|g| g.private),
            named_addresses: grants.iter().filter_map(|g| g.rule.origin.names_an_address()).collect(),
            idempotency_key: grants.iter().any(|g| g.idempotency_key),
            timeouts: grants.iter().fold(GrantTimeouts::default(), |widest, g| widest.widest(g.timeouts)),
            routes,
            rule: first.origin.to_string(),
        })
    }
}

impl Allowed {
    /// Whether the request may connect to `address`, one its host name
    /// resolved to (or its IP literal).
    ///
    /// # Errors
    /// The refusal, with the range the address is in.
    pub fn destination(&self, job_type: &str, origin: &Origin, address: IpAddr) -> Result<(), Refusal> {
        let Some(range) = private_range(address) else {
            return Ok(());
        };
        if self.private || self.named_addresses.contains(&address) {
            return Ok(());
        }
        Err(Refusal(format!(
            "{origin} refused: it resolved to {address}, which is {range}; a grant naming the address \
             (`jobhost grant {} {}`), or `jobhost grant {} {} --private`, allows it",
            quoted(job_type),
            quoted(&with_address(origin, address).to_string()),
            quoted(job_type),
            quoted(&origin.to_string()),
        )))
    }
}

/// The `jobhost grant` command that lets a request under `rule` go
/// through, quoted for a POSIX shell so it runs as printed: the rule's
/// origin and methods, `--private` where its names are loopback by
/// definition (`localhost`). It names no secret: a grant naming one that
/// is not set stops every run of the type, so [`secrets_hint`] says how to
/// add them once they are set.
pub fn grant_command(job_type: &str, rule: &Rule) -> String {
    let mut command = format!("jobhost grant {} {}", quoted(job_type), quoted(&rule.origin.to_string()));
    if !rule.methods.is_empty() {
        command.push_str(&format!(" --methods {}", rule.methods.join(",")));
    }
    if rule.origin.is_loopback_name() {
        command.push_str(" --private");
    }
    command
}

/// What to add to [`grant_command`] for the secrets `rule` declares, once
/// they are set; empty when it declares none.
pub fn secrets_hint(rule: &Rule) -> String {
    if rule.secrets.is_empty() {
        return String::new();
    }
    let set: Vec<String> = rule.secrets.iter().map(|name| format!("`jobhost secret set {name}`")).collect();
    let add: Vec<String> = rule.secrets.iter().map(|name| format!("--secret {name}")).collect();
    format!(
        " (to carry {}: set it with {}, then grant again adding {})",
        rule.secrets.join(", "),
        set.join(" and "),
        add.join(" ")
    )
}

/// `text` as one word of a POSIX shell command: as it is when it has
/// nothing a shell reads, else in single quotes.
fn quoted(text: &str) -> String {
    shlex::try_quote(text).map_or_else(|_| text.to_string(), |quoted| quoted.into_owned())
}

fn with_address(origin: &Origin, address: IpAddr) -> Origin {
    Origin { host: address.to_string(), ..origin.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(origin: &str, methods: &[&str], secrets: &[&str]) -> Rule {
        Rule {
            origin: origin.parse().unwrap(),
            methods: methods.iter().map(|m| m.to_string()).collect(),
            secrets: secrets.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn grant(origin: &str, methods: &[&str], secrets: &[&str]) -> GrantRule {
        GrantRule {
            rule: rule(origin, methods, secrets),
            private: false,
            idempotency_key: false,
            timeouts: Default::default(),
            secrets_in: Default::default(),
            secret_headers: Vec::new(),
        }
    }

    fn origin(url: &str) -> Origin {
        Origin::of_uri(&url.parse().unwrap()).unwrap()
    }

    fn mailer() -> Policy {
        Policy {
            job_type: "mail".into(),
            declared: vec![rule("https://api.mailgun.net", &["POST"], &["MAILGUN_KEY", "OTHER"])],
            granted: vec![],
        }
    }

    #[test]
    fn both_sides_must_allow_and_the_hint_is_the_grant_command() {
        let mut policy = mailer();
        let refusal = policy.decide("POST", &origin("https://api.mailgun.net/v3/x")).unwrap_err();
        assert!(
            refusal.0.contains(
                "not granted; `jobhost grant mail https://api.mailgun.net --methods POST` allows it (to carry \
                 MAILGUN_KEY, OTHER: set it with `jobhost secret set MAILGUN_KEY` and `jobhost secret set OTHER`, \
                 then grant again adding --secret MAILGUN_KEY --secret OTHER)"
            ),
            "{}",
            refusal.0
        );
        policy.granted.push(grant("https://api.mailgun.net", &[], &["MAILGUN_KEY", "UNDECLARED"]));
        let allowed = policy.decide("POST", &origin("https://api.mailgun.net/v3/x")).unwrap();
        assert_eq!(allowed.secrets, ["MAILGUN_KEY"], "only secrets both sides name");
        let refusal = policy.decide("GET", &origin("https://api.mailgun.net/")).unwrap_err();
        assert!(refusal.0.contains("for other methods only"), "{}", refusal.0);
    }

    #[test]
    fn hints_are_quoted_for_a_shell_and_loopback_names_are_granted_private() {
        let fetcher = rule("http://127.0.0.1:*", &["GET", "POST"], &[]);
        assert_eq!(grant_command("fetcher", &fetcher), "jobhost grant fetcher 'http://127.0.0.1:*' --methods GET,POST");
        let local = rule("http://localhost:*", &[], &[]);
        assert_eq!(grant_command("fetcher", &local), "jobhost grant fetcher 'http://localhost:*' --private");
        let below = rule("https://*.localhost", &[], &[]);
        assert!(grant_command("fetcher", &below).ends_with(" --private"));
        let public = rule("https://api.mailgun.net", &[], &[]);
        assert_eq!(grant_command("mail", &public), "jobhost grant mail https://api.mailgun.net");
    }

    #[test]
    fn each_secret_goes_only_where_the_grants_naming_it_let_it() {
        let policy = Policy {
            job_type: "crm".into(),
            declared: vec![rule("https://*", &[], &["A", "B"])],
            granted: vec![
                GrantRule {
                    secret_headers: vec!["authorization".into()],
                    ..grant("https://api.example.com", &[], &["A"])
                },
                GrantRule { secrets_in: Places::of(&["body".into()]), ..grant("https://*", &[], &["B"]) },
            ],
        };
        let allowed = policy.decide("POST", &origin("https://api.example.com/")).unwrap();
        let route = |name: &str| allowed.routes.iter().find(|r| r.name == name).unwrap().clone();
        let (a, b) = (route("A"), route("B"));
        assert_eq!((a.places.body, a.allows_header("x-other")), (false, false), "A keeps to its own grant");
        assert!(a.allows_header("authorization"));
        assert_eq!((b.places.body, b.allows_header("x-other")), (true, true));
    }

    #[test]
    fn a_grant_never_widens_what_is_declared() {
        let mut policy = mailer();
        policy.granted.push(grant("https://*", &[], &[]));
        let refusal = policy.decide("POST", &origin("https://evil.example/")).unwrap_err();
        assert!(refusal.0.contains("does not declare https://evil.example"), "{}", refusal.0);
        let mut narrow = mailer();
        narrow.granted.push(grant("https://api.mailgun.net", &["GET"], &[]));
        narrow.declared[0].methods.clear();
        assert!(narrow.decide("POST", &origin("https://api.mailgun.net/")).is_err(), "the grant's methods bind");
        assert!(narrow.decide("GET", &origin("https://api.mailgun.net/")).is_ok());
    }

    #[test]
    fn private_destinations_need_a_grant_that_says_so() {
        let mut policy = Policy {
            job_type: "hook".into(),
            declared: vec![rule("https://*", &[], &[])],
            granted: vec![grant("https://api.example.com", &[], &[])],
        };
        let to = origin("https://api.example.com/");
        let allowed = policy.decide("GET", &to).unwrap();
        assert!(allowed.destination("hook", &to, "93.184.216.34".parse().unwrap()).is_ok());
        // The granted public name resolving to loopback (rebinding) is refused.
        let refusal = allowed.destination("hook", &to, "127.0.0.1".parse().unwrap()).unwrap_err();
        assert!(refusal.0.contains("resolved to 127.0.0.1, which is loopback"), "{}", refusal.0);
        assert!(allowed.destination("hook", &to, "169.254.169.254".parse().unwrap()).is_err());
        policy.granted[0].private = true;
        let allowed = policy.decide("GET", &to).unwrap();
        assert!(allowed.destination("hook", &to, "10.0.0.5".parse().unwrap()).is_ok());
        // A grant naming the address reaches it, and only it.
        let local = Policy {
            job_type: "hook".into(),
            declared: vec![rule("http://127.0.0.1:8025", &[], &[])],
            granted: vec![grant("http://127.0.0.1:8025", &[], &[])],
        };
        let to = origin("http://127.0.0.1:8025/send");
        let allowed = local.decide("POST", &to).unwrap();
        assert!(allowed.destination("hook", &to, "127.0.0.1".parse().unwrap()).is_ok());
        assert!(allowed.destination("hook", &to, "127.0.0.2".parse().unwrap()).is_err());
    }
}
