//! The audit trail's page (admin only): who changed what, when, from
//! where, and how it ended, newest first, filtered by who, what and object.

use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::layout::{Head, table, time};
use crate::store::audit::{Entry, Query};

/// Rows a page shows.
pub const PAGE: i64 = 100;

/// The filter form and a page of rows, with a link to the next.
pub fn page(rows: &[Entry], query: &Query, now: DateTime<Utc>) -> Markup {
    let field = |value: &Option<String>| value.clone().unwrap_or_default();
    let next = (rows.len() as i64 >= PAGE).then(|| rows.last().map(|r| r.id)).flatten();
    html! {
        h1 { "Audit trail" }
        p.muted { "Every change made through the API, the dashboard, the CLI or SQL, with who made it. Kept 90 days unless the hosts say otherwise (--audit-retention)." }
        details.filters open {
            summary { "Filter" }
            form.filters method="get" action="/audit" {
                label { "Who" input name="who" value=(field(&query.who)) size="14" placeholder="token, user@host"; }
                label { "What" input name="what" value=(field(&query.what)) size="14" placeholder="job.cancel or job."; }
                label { "Object" input name="object" value=(field(&query.object)) size="14" placeholder="job 42"; }
                label { "Since" input name="since" value=(field(&query.since)) size="22" placeholder="2026-12-01T09:00:00Z"; }
                button type="submit" { "Filter" }
                a.reset href="/audit" { "Clear" }
            }
        }
        @if rows.is_empty() {
            p.muted { "No change recorded matches." }
        } @else {
            (table(&[Head::Text("When"), Head::Text("Who"), Head::Text("What"), Head::Text("Outcome"), Head::Text("From")], html! {
                @for row in rows {
                    tr {
                        td { (time(Some(row.at), now)) }
                        td { (row.who) br; span.muted { "via " (row.via) } }
                        td { code { (row.action) } br; span.muted { (row.object) } }
                        td {
                            (row.outcome)
                            @if row.count > 1 { br; span.muted { "×" (row.count) " in this window" } }
                        }
                        td {
                            @if let Some(address) = &row.address { (address) }
                            @if let Some(agent) = &row.user_agent { br; span.muted { (crate::text::clip(agent, 60)) } }
                        }
                    }
                }
            }))
            @if let Some(next) = next {
                p { a href=(next_page(query, next)) { "Older changes →" } }
            }
        }
    }
}

/// The link to the page after `before`, with the same filter.
fn next_page(query: &Query, before: i64) -> String {
    let mut link = format!("/audit?before={before}");
    for (name, value) in
        [("who", &query.who), ("what", &query.what), ("object", &query.object), ("since", &query.since)]
    {
        if let Some(value) = value.as_deref().filter(|v| !v.is_empty()) {
            link.push_str(&format!("&{name}={}", super::encode_component(value)));
        }
    }
    link
}
