//! What each route needs of its caller, in one table: [`super::guard::admit`]
//! looks every request up here before its handler runs. A route missing
//! from the table is refused to every role below admin (a unit test fails
//! when a route is added without a row), so forgetting a row closes the
//! route instead of opening it.

use axum::http::Method;

use crate::store::token::Role;

/// What a request must bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: health, the API's description, signing in, the sign-in
    /// page's assets, inbound webhooks (each checked by its signature).
    Anyone,
    /// The metrics token, or any live token.
    Scrape,
    /// A signed-in session of any role: signing out.
    Session,
    /// At least this role; a read needs it only where reads need a token.
    Role(Role),
}

use Need::{Anyone, Scrape, Session};

const READ: Need = Need::Role(Role::Read);
const OPERATE: Need = Need::Role(Role::Operate);
const DEPLOY: Need = Need::Role(Role::Deploy);
const ADMIN: Need = Need::Role(Role::Admin);

/// Every route: (method, path as routed, need). Reads are `GET`; `HEAD`
/// is answered as `GET`.
pub const ROUTES: &[(&str, &str, Need)] = &[
    // The API.
    ("GET", "/api/openapi.json", Anyone),
    ("GET", "/api/health", Anyone),
    ("GET", "/api/stats", READ),
    ("GET", "/api/throughput", READ),
    ("GET", "/api/history", READ),
    ("GET", "/api/audit", ADMIN),
    ("GET", "/api/jobs", READ),
    ("POST", "/api/jobs", OPERATE),
    ("POST", "/api/jobs/retry", OPERATE),
    ("POST", "/api/jobs/cancel", OPERATE),
    ("GET", "/api/jobs/{id}", READ),
    ("POST", "/api/jobs/{id}/retry", OPERATE),
    ("POST", "/api/jobs/{id}/cancel", OPERATE),
    ("GET", "/api/queues", READ),
    ("POST", "/api/queues/{name}/{action}", OPERATE),
    ("GET", "/api/keys", READ),
    ("GET", "/api/rate-keys", READ),
    ("GET", "/api/hosts", READ),
    ("GET", "/api/job-types", READ),
    ("GET", "/api/batches", READ),
    ("GET", "/api/batches/{id}", READ),
    ("GET", "/api/workflows", READ),
    ("POST", "/api/workflows", OPERATE),
    ("GET", "/api/workflows/{id}", READ),
    ("POST", "/api/workflows/{id}/cancel", OPERATE),
    ("GET", "/api/events", READ),
    ("POST", "/api/events/{key}", OPERATE),
    ("GET", "/api/schedules", READ),
    ("GET", "/api/schedules/keyed", READ),
    ("GET", "/api/schedules/{job}/{key}", READ),
    ("PUT", "/api/schedules/{job}/{key}", ADMIN),
    ("DELETE", "/api/schedules/{job}/{key}", ADMIN),
    // Pause, resume and trigger.
    ("POST", "/api/schedules/{job}/{key}/{verb}", OPERATE),
    ("GET", "/api/deployments", READ),
    ("POST", "/api/deployments", DEPLOY),
    ("GET", "/api/deployments/{job_type}", READ),
    ("POST", "/api/deployments/{job_type}/undeploy", DEPLOY),
    ("POST", "/api/deployments/{job_type}/rollback", DEPLOY),
    ("POST", "/hooks/{name}", Anyone),
    ("GET", "/metrics", Scrape),
    // The dashboard.
    ("GET", "/", READ),
    ("GET", "/jobs", READ),
    ("GET", "/jobs/{id}", READ),
    ("GET", "/keys", READ),
    ("GET", "/hosts", READ),
    ("GET", "/audit", ADMIN),
    ("GET", "/types", READ),
    ("GET", "/types/{name}", READ),
    ("GET", "/batches", READ),
    ("GET", "/batches/{id}", READ),
    ("GET", "/workflows", READ),
    ("GET", "/workflows/{id}", READ),
    ("POST", "/workflows/{id}/decide", OPERATE),
    ("GET", "/schedules", READ),
    // Pause, resume and trigger.
    ("POST", "/schedules/{action}", OPERATE),
    ("GET", "/login", Anyone),
    ("POST", "/login", Anyone),
    ("POST", "/logout", Session),
    ("POST", "/jobs/{id}/retry", OPERATE),
    ("POST", "/jobs/{id}/cancel", OPERATE),
    ("POST", "/jobs/retry", OPERATE),
    ("POST", "/jobs/cancel", OPERATE),
    ("POST", "/queues/{action}", OPERATE),
    ("GET", "/assets/style.css", Anyone),
    ("GET", "/assets/app.js", Anyone),
];

/// What a request needs: its route's row. A request no route matched
/// needs a reader (it gets its 404 once admitted); a routed request
/// without a row needs an admin, so a forgotten row is no open door.
pub fn need(method: &Method, route: Option<&str>) -> Need {
    let method = if *method == Method::HEAD { "GET" } else { method.as_str() };
    let Some(route) = route else {
        return if method == "GET" { READ } else { OPERATE };
    };
    ROUTES.iter().find(|(m, path, _)| *m == method && *path == route).map_or(ADMIN, |(_, _, need)| *need)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every `.route(PATH, ...)` in the HTTP sources, with the methods its
    /// handlers are routed by, read from the text: a route added without a
    /// row in [`ROUTES`] fails here.
    fn routed() -> BTreeSet<(String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
        let mut sources = vec![];
        for dir in [root.clone(), root.join("dashboard")] {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "rs") {
                    sources.push(std::fs::read_to_string(path).unwrap());
                }
            }
        }
        let constants = [("DEPLOY_PATH", "/api/deployments")];
        let mut routes = BTreeSet::new();
        for source in sources {
            for piece in source.split(".route(").skip(1) {
                let (path, rest) = match piece.strip_prefix('"') {
                    Some(quoted) => quoted.split_once('"').unwrap(),
                    None => {
                        let name = piece.split(',').next().unwrap().trim();
                        let Some((_, path)) = constants.iter().find(|(c, _)| *c == name) else { continue };
                        (*path, &piece[name.len()..])
                    }
                };
                if !path.starts_with('/') {
                    continue;
                }
                // The route's handlers run to the end of its call: the
                // next `.route(`, which `split` already cut at, or the
                // statement's end.
                let call = rest.split(";\n").next().unwrap();
                for (method, marker) in [("GET", "get("), ("POST", "post("), ("PUT", "put("), ("DELETE", "delete(")] {
                    let called = call.match_indices(marker).any(|(at, _)| {
                        at == 0 || !call.as_bytes()[at - 1].is_ascii_alphanumeric() && call.as_bytes()[at - 1] != b'_'
                    });
                    if called {
                        routes.insert((method.to_string(), path.to_string()));
                    }
                }
            }
        }
        routes
    }

    #[test]
    fn every_route_has_a_row_and_every_row_a_route() {
        let routed = routed();
        assert!(routed.len() > 50, "the sources were read: {routed:?}");
        let rows: BTreeSet<(String, String)> = ROUTES.iter().map(|(m, p, _)| (m.to_string(), p.to_string())).collect();
        let missing: Vec<_> = routed.difference(&rows).collect();
        assert!(missing.is_empty(), "routes without a row in ROUTES (say what role each needs): {missing:?}");
        let stale: Vec<_> = rows.difference(&routed).collect();
        assert!(stale.is_empty(), "rows of ROUTES for no route: {stale:?}");
    }

    #[test]
    fn a_routed_request_without_a_row_needs_an_admin() {
        assert_eq!(need(&Method::POST, Some("/api/new-thing")), ADMIN);
        assert_eq!(need(&Method::HEAD, Some("/api/jobs")), READ);
        assert_eq!(need(&Method::POST, Some("/api/deployments")), DEPLOY);
        assert_eq!(need(&Method::GET, None), READ);
        assert_eq!(need(&Method::POST, None), OPERATE);
    }
}
