//! The dashboard's page shell and the small pieces every page uses: the
//! navigation, times, state badges, progress bars, action buttons.

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use crate::store::JobState;

/// What a page knows about the request it answers.
pub struct Context {
    /// The path and query of the page, where a form returns to.
    pub here: String,
    /// The CSRF token of a signed-in session (`None`: show no actions).
    pub csrf: Option<String>,
    /// Whether the server takes changes at all.
    pub writable: bool,
    /// Whether the page shows what jobs carry (payloads, outputs, logs).
    pub sees_payloads: bool,
    /// The signed-in session's token and role.
    pub signed_in: Option<(String, crate::store::token::Role)>,
    /// The result of the action that led here, shown once.
    pub notice: Option<String>,
}

impl Context {
    /// Whether the page shows the forms that change jobs, queues, waits
    /// and schedules: only to a session whose role may send them.
    pub fn may_operate(&self) -> bool {
        self.csrf.is_some()
            && self.signed_in.as_ref().is_some_and(|(_, role)| *role >= crate::store::token::Role::Operate)
    }
}

/// The sections, in the navigation's order: (path, label).
const SECTIONS: [(&str, &str); 9] = [
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/jobs?state=failed", "Failed"),
    ("/keys", "Keys"),
    ("/batches", "Batches"),
    ("/workflows", "Workflows"),
    ("/types", "Job types"),
    ("/hosts", "Hosts"),
    ("/schedules", "Schedules"),
];

/// A page with a `fixed` part above `main` that the live refresh leaves
/// alone (a form being filled in), and `main` refreshed only if `live`.
pub fn page_with(
    context: &Context,
    title: &str,
    section: &str,
    fixed: Option<Markup>,
    main: Markup,
    live: bool,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · jobhost" }
                link rel="stylesheet" href="/assets/style.css";
                script src="/assets/app.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/" { "jobhost" }
                    nav {
                        @for (path, label) in SECTIONS {
                            a href=(path) aria-current=[(path == section).then_some("page")] { (label) }
                        }
                        @if context.signed_in.as_ref().is_some_and(|(_, role)| *role == crate::store::token::Role::Admin) {
                            a href="/audit" aria-current=[("/audit" == section).then_some("page")] { "Audit" }
                        }
                    }
                    div.session {
                        @if let Some((name, role)) = &context.signed_in
                            && name != crate::http::access::SERVER_TOKEN_NAME
                        {
                            span.muted title="The token this session signed in with, and its role" {
                                (name) " · " (role.as_str())
                            }
                        }
                        @if context.csrf.is_some() {
                            form method="post" action="/logout" {
                                (hidden_fields(context))
                                button.link type="submit" { "Sign out" }
                            }
                        } @else if context.writable {
                            a href=(sign_in_link(&context.here)) { "Sign in" }
                        } @else {
                            span.badge.muted title="Started without --token: only a named token may change things here" { "read-only" }
                            " "
                            a href=(sign_in_link(&context.here)) { "Sign in" }
                        }
                    }
                }
                div.page {
                    @if let Some(notice) = &context.notice {
                        p.notice role="status" { (notice) }
                    }
                    @if let Some(fixed) = fixed { (fixed) }
                    main id="live" data-live=[live.then_some("2000")] { (main) }
                }
            }
        }
    }
}

/// The fields every action form carries: the CSRF token and where to return.
pub fn hidden_fields(context: &Context) -> Markup {
    html! {
        input type="hidden" name="csrf" value=(context.csrf.as_deref().unwrap_or(""));
        input type="hidden" name="return_to" value=(context.here);
    }
}

/// A button posting to `action`, shown only to a session that may operate.
pub fn action_button(context: &Context, action: &str, label: &str, confirm: Option<&str>) -> Markup {
    html! {
        @if context.may_operate() {
            form.inline method="post" action=(action) data-confirm=[confirm] {
                (hidden_fields(context))
                button type="submit" { (label) }
            }
        }
    }
}

/// A state's badge.
pub fn state_badge(state: &str) -> Markup {
    html! { span class={ "badge state-" (state) } { (state) } }
}

/// A job state's badge.
pub fn job_state(state: JobState) -> Markup {
    state_badge(state.as_str())
}

/// A time as "5 s ago" (or "in 5 s"), with the exact time on hover.
pub fn time(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Markup {
    let Some(at) = at else {
        return html! { span.muted { "–" } };
    };
    let exact = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let secs = (now - at).num_milliseconds() as f64 / 1000.0;
    let relative = if secs >= 0.0 { format!("{} ago", span(secs)) } else { format!("in {}", span(-secs)) };
    html! { time datetime=(exact) title=(exact) { (relative) } }
}

/// A time to the millisecond beside how long ago it was, so attempts a
/// few hundred milliseconds apart read apart (the date too when it is
/// not today's).
pub fn clock_time(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Markup {
    let Some(at) = at else {
        return html! { span.muted { "–" } };
    };
    let exact = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let clock = if at.date_naive() == now.date_naive() {
        at.format("%H:%M:%S%.3f").to_string()
    } else {
        at.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
    };
    let secs = (now - at).num_milliseconds() as f64 / 1000.0;
    let relative = if secs >= 0.0 { format!("{} ago", span(secs)) } else { format!("in {}", span(-secs)) };
    html! { time datetime=(exact) title=(exact) { (clock) " UTC (" (relative) ")" } }
}

/// Seconds as a short span: 4 s, 3 min, 2 h, 5 d.
pub fn span(secs: f64) -> String {
    match secs {
        s if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        s if s < 90.0 => format!("{s:.0} s"),
        s if s < 90.0 * 60.0 => format!("{:.0} min", s / 60.0),
        s if s < 36.0 * 3600.0 => format!("{:.0} h", s / 3600.0),
        s => format!("{:.0} d", s / 86_400.0),
    }
}

/// A bar filled to `fraction` (0 to 1), labelled with the percentage.
/// Its filled part is `parts`, each a share of the whole in its colour
/// (what completed in green, what failed in red, what was cancelled in
/// grey), so a failed workflow's full bar never reads as a success.
pub fn progress_bar(fraction: f64, label: &str, parts: &[(f64, Tone)]) -> Markup {
    let percent = (fraction.clamp(0.0, 1.0) * 100.0).floor();
    html! {
        div.progress role="progressbar" aria-valuemin="0" aria-valuemax="100" aria-valuenow=(percent) aria-label=(label) {
            div.fills {
                @for (share, tone) in parts.iter().filter(|(share, _)| *share > 0.0) {
                    div class={ "fill state-" (tone.state()) } style={ "width: " (format!("{:.2}", share.clamp(0.0, 1.0) * 100.0)) "%" } {}
                }
            }
            span.value { span { (percent) "%" } }
        }
    }
}

/// What a part of a progress bar counts, by its colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Ended well (green).
    Good,
    /// Failed or discarded (red).
    Failures,
    /// Cancelled by an operator (grey).
    Cancelled,
}

impl Tone {
    fn state(self) -> &'static str {
        match self {
            Tone::Good => "completed",
            Tone::Failures => "failed",
            Tone::Cancelled => "cancelled",
        }
    }
}

/// A JSON document, indented, in a block that scrolls.
pub fn json_block(value: &serde_json::Value) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    html! { pre.json { (text) } }
}

/// The first 12 characters of a digest, the whole on hover.
pub fn digest(digest: &str) -> Markup {
    html! { code title=(digest) { (digest.get(..12).unwrap_or(digest)) } }
}

/// A table's column heading: numbers align right, under their heading.
pub enum Head {
    /// A column of text.
    Text(&'static str),
    /// A column of numbers.
    Number(&'static str),
}

/// A table wrapped so that it scrolls sideways on a narrow screen instead
/// of widening the page.
pub fn table(head: &[Head], rows: Markup) -> Markup {
    html! {
        div.scroll {
            table {
                thead {
                    tr {
                        @for cell in head {
                            @match cell {
                                Head::Text(label) => th scope="col" { (label) },
                                Head::Number(label) => th.num scope="col" { (label) },
                            }
                        }
                    }
                }
                tbody { (rows) }
            }
        }
    }
}

/// Bytes as KiB, MiB or GiB.
pub fn bytes(count: u64) -> String {
    match count {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 => format!("{:.0} MiB", n as f64 / f64::from(1 << 20)),
        n if n >= 1 << 10 => format!("{:.0} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// A page for something that went wrong: its title and what to do.
pub fn problem(context: &Context, title: &str, message: &str) -> Markup {
    let main = html! {
        h1 { (title) }
        p.problem { (message) }
        p { a href="/" { "Back to the overview" } }
    };
    page_with(context, title, "", None, main, false)
}

/// The "Sign in" link of a page: back to the page once signed in. On the
/// sign-in form itself it is the form as it is, keeping where the form
/// returns to, so signing in from it never lands on the form again.
fn sign_in_link(here: &str) -> String {
    if here == "/login" || here.starts_with("/login?") {
        here.to_string()
    } else {
        format!("/login?return_to={}", super::super::query::encode(here))
    }
}

#[cfg(test)]
mod tests {
    use super::sign_in_link;

    #[test]
    fn the_sign_in_link_returns_to_the_page_and_the_form_keeps_its_own() {
        assert_eq!(sign_in_link("/jobs?state=failed"), "/login?return_to=%2Fjobs%3Fstate%3Dfailed");
        assert_eq!(sign_in_link("/login"), "/login");
        assert_eq!(sign_in_link("/login?return_to=%2Fkeys"), "/login?return_to=%2Fkeys");
    }
}
