//! The body of each dashboard page, from what the store read: markup only,
//! no reads and no decisions about access (the handlers in the parent
//! module make those).

use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::layout::{
    Context, Head, Tone, action_button, bytes, clock_time, digest, hidden_fields, job_state, json_block, progress_bar,
    span, state_badge, table, time,
};
use crate::http::query::{JobQuery, encode};
use crate::http::views::{JobTypeView, QueueView, Throughput};
use crate::store::keyed_schedule::KeyedScheduleStatus;
use crate::store::rate::RateKeyStatus;
use crate::store::{Batch, HostRow, JobDetail, JobRow, JobState, KeyStatus, ScheduleStatus, Stats};

/// The overview: counts by state, throughput, warnings, queues.
pub fn overview(
    context: &Context,
    stats: &Stats,
    minute: &Throughput,
    hour: &Throughput,
    queues: &[QueueView],
    trends: Markup,
) -> Markup {
    html! {
        h1 { "Overview" }
        section.cards aria-label="Jobs by state" {
            @for state in JobState::ALL {
                a class={ "card state-" (state.as_str()) } href={ "/jobs?state=" (state.as_str()) } {
                    span.count { (stats.states.get(&state).copied().unwrap_or(0)) }
                    span.label { (state.as_str()) }
                }
            }
        }
        section.cards aria-label="Throughput" {
            div.card { span.count { (format!("{:.1}", minute.completed_per_sec)) } span.label { "completed / s, last minute" } }
            div.card { span.count { (hour.finished[&JobState::Completed]) } span.label { "completed, last hour" } }
            div.card { span.count { (hour.finished[&JobState::Failed]) } span.label { "failed, last hour" } }
            div.card {
                span.count { (stats.oldest_available_secs.map_or("–".to_string(), span)) }
                span.label { "oldest available job's wait" }
            }
            a.card href="/hosts" { span.count { (stats.hosts_alive) } span.label { "hosts alive" } }
        }
        @for host in &stats.hosts_silent {
            p.warning { "Host " code { (host.id) } " is presumed dead: silent " (span(host.silent_secs)) " (heartbeat every " (host.heartbeat_ms) " ms)." }
        }
        @for down in &stats.watchers_down {
            p.warning { "Host " code { (down.host) } " is not watching its components directory: " (down.error) }
        }
        @for mixed in &stats.mixed_components {
            p.warning { "Job type " strong { (mixed.job) } " is served by " (mixed.digests.len()) " different components." }
        }
        (trends)
        h2 { "Queues" }
        @if queues.is_empty() {
            p.muted { "No jobs yet." }
        } @else {
            (table(&[Head::Text("Queue"), Head::Number("Available"), Head::Number("Running"), Head::Number("Scheduled"), Head::Number("Blocked"), Head::Number("Failed"), Head::Number("Completed"), Head::Text("")], html! {
                @for queue in queues {
                    tr {
                        th scope="row" {
                            a href={ "/jobs?queue=" (encode(&queue.name)) } { (queue.name) }
                            @if queue.paused { " " span.badge.state-paused { "paused" } }
                        }
                        @for state in [JobState::Available, JobState::Running, JobState::Scheduled, JobState::Blocked, JobState::Failed, JobState::Completed] {
                            td.num { (queue.counts.get(&state).copied().unwrap_or(0)) }
                        }
                        td.actions {
                            @if queue.paused {
                                (queue_button(context, &queue.name, "resume", "Resume", None))
                            } @else {
                                (queue_button(context, &queue.name, "pause", "Pause", Some("Pause this queue? No host leases from it until it is resumed.")))
                            }
                        }
                    }
                }
            }))
        }
    }
}

/// A button pausing or resuming a queue. The name goes in the form, not
/// the path: a queue may be named `.` or `..`, which a browser would
/// resolve away in a path.
fn queue_button(context: &Context, queue: &str, action: &str, label: &str, confirm: Option<&str>) -> Markup {
    html! {
        @if context.may_operate() {
            form.inline method="post" action={ "/queues/" (action) } data-confirm=[confirm] {
                (hidden_fields(context))
                input type="hidden" name="queue" value=(queue);
                button type="submit" { (label) }
            }
        }
    }
}

/// The jobs page's heading and filter form, which the live refresh leaves
/// alone so that a filter being typed is not lost.
pub fn job_filters(query: &JobQuery) -> Markup {
    let selected = query.state.as_deref().unwrap_or("");
    let field = |value: &Option<String>| value.clone().unwrap_or_default();
    let filtered = query.to_query_string();
    let title = if selected.is_empty() { "Jobs".to_string() } else { format!("Jobs: {selected}") };
    html! {
        h1 { (title) }
        details.filters open {
        summary { "Filter" @if !filtered.is_empty() { " (on)" } }
        form.filters method="get" action="/jobs" {
            label { "State"
                select name="state" {
                    option value="" selected[selected.is_empty()] { "any" }
                    @for state in JobState::ALL {
                        option value=(state.as_str()) selected[selected == state.as_str()] { (state.as_str()) }
                    }
                }
            }
            label { "Type" input name="job" value=(field(&query.job)) size="12"; }
            label { "Queue" input name="queue" value=(field(&query.queue)) size="10"; }
            label { "Key" input name="key" value=(field(&query.key)) size="12"; }
            label { "Batch" input name="batch" value=(field(&query.batch)) size="6" inputmode="numeric"; }
            label { "Since" input name="since" value=(field(&query.since)) placeholder="e.g. 2026-12-01T09:00:00Z" size="22"; }
            label { "Until" input name="until" value=(field(&query.until)) placeholder="RFC 3339" size="22"; }
            button type="submit" { "Filter" }
            @if !filtered.is_empty() { a.reset href="/jobs" { "Clear" } }
        }
        }
    }
}

/// A page of jobs with the bulk actions and the cursor links.
pub fn jobs(context: &Context, query: &JobQuery, rows: &[JobRow], next: Option<i64>, now: DateTime<Utc>) -> Markup {
    let selected = query.state.as_deref().unwrap_or("");
    let filtered = query.to_query_string();
    let ended = JobState::parse(selected).is_some_and(JobState::is_final);
    let retry_all = JobState::parse(selected).is_some_and(|s| retryable(s) || s == JobState::Scheduled);
    html! {
        @if context.may_operate() && query.narrows() {
            div.bulk {
                @if retry_all {
                    form.inline method="post" action="/jobs/retry" data-confirm="Retry every job this filter matches?" {
                        (hidden_fields(context)) (filter_fields(query))
                        button type="submit" { "Retry all matching" }
                    }
                }
                @if !ended {
                    form.inline method="post" action="/jobs/cancel" data-confirm="Cancel every job this filter matches?" {
                        (hidden_fields(context)) (filter_fields(query))
                        button.danger type="submit" { "Cancel all matching" }
                    }
                }
            }
        }
        @if rows.is_empty() {
            p.muted { "No jobs match." }
        } @else {
            (table(&[Head::Number("Id"), Head::Text("Type"), Head::Text("Queue"), Head::Text("State"), Head::Number("Attempt"), Head::Text("Key"), Head::Text("Enqueued"), Head::Text("Finished"), Head::Text("Last error"), Head::Text("")], html! {
                @for row in rows {
                    tr {
                        td.num { a href={ "/jobs/" (row.id) } { (row.id) } }
                        td { (row.job) }
                        td { (row.queue) }
                        td { (job_state(row.state)) }
                        td.num { (row.attempts) }
                        td { @if let Some(key) = &row.concurrency_key { code { (key) } } }
                        td { (time(Some(row.enqueued_at), now)) }
                        td { (time(row.finished_at, now)) }
                        td.error { (row.error.as_deref().map(one_line).unwrap_or_default()) }
                        td.actions {
                            @if retryable(row.state) {
                                (action_button(context, &format!("/jobs/{}/retry", row.id), "Retry", None))
                            }
                        }
                    }
                }
            }))
        }
        nav.pages aria-label="Pages" {
            @if query.before.is_some() {
                a href={ "/jobs?" (filtered) } { "← Newest" }
            }
            @if let Some(next) = next {
                a href={ "/jobs?" (filtered) @if !filtered.is_empty() { "&" } "before=" (next) } { "Older →" }
            }
        }
    }
}

/// Whether a job in `state` can be run again: it ended without success.
fn retryable(state: JobState) -> bool {
    matches!(state, JobState::Failed | JobState::Discarded | JobState::Cancelled)
}

/// The filter's fields and its cursor, hidden, for a bulk form: pressed
/// again after a pass that left more, it goes on below that pass.
fn filter_fields(query: &JobQuery) -> Markup {
    html! {
        @for (name, value) in query.narrowing() {
            input type="hidden" name=(name) value=(value);
        }
        @if let Some(before) = query.before.as_deref().filter(|b| !b.trim().is_empty()) {
            input type="hidden" name="before" value=(before);
        }
    }
}

/// An error on one line, shortened for a table cell.
fn one_line(error: &str) -> String {
    let line = error.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(120) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// One job in full.
pub fn job(context: &Context, job: &JobDetail, now: DateTime<Utc>) -> Markup {
    let row = &job.row;
    let live = !row.state.is_final();
    html! {
        h1 { "Job " (row.id) " " (job_state(row.state)) }
        div.actions {
            @if retryable(row.state) || row.state == JobState::Scheduled {
                (action_button(context, &format!("/jobs/{}/retry", row.id), if live { "Run now" } else { "Retry" }, None))
            }
            @if live {
                (action_button(context, &format!("/jobs/{}/cancel", row.id), "Cancel", Some("Cancel this job?")))
            }
        }
        @if let Some(progress) = &job.progress {
            @if let Some(fraction) = fraction_of(progress) {
                section { h2 { "Progress" } (progress_bar(fraction, "job progress", &[(fraction, Tone::Good)])) }
            }
        }
        dl.facts {
            dt { "Type" } dd { a href={ "/jobs?job=" (encode(&row.job)) } { (row.job) } }
            dt { "Queue" } dd { (row.queue) }
            dt { "Priority" } dd { (job.priority) }
            dt { "Attempts" } dd { (row.attempts) " of " (job.max_attempts) }
            @if let Some(key) = &row.concurrency_key {
                dt { "Concurrency key" } dd { a href={ "/jobs?key=" (encode(key)) } { code { (key) } } }
            }
            @if let Some(batch) = job.batch_id { dt { "Batch" } dd { a href={ "/batches/" (batch) } { (batch) } } }
            @if let Some(step) = &job.workflow {
                dt { "Workflow" } dd { a href={ "/workflows/" (step.id) } { (step.id) } " step " code { (step.step) } }
            }
            @if let Some(parent) = job.parent_id { dt { "Enqueued by" } dd { a href={ "/jobs/" (parent) } { "job " (parent) } } }
            @if let Some(host) = &job.host_id { dt { "Host" } dd { code { (host) } } }
            dt { "Enqueued" } dd { (time(Some(row.enqueued_at), now)) }
            @if live { dt { "Due" } dd { (time(job.run_at, now)) } }
            dt { "Started" } dd { (time(row.started_at, now)) }
            dt { "Finished" } dd { (time(row.finished_at, now)) }
        }
        @if context.sees_payloads {
            section { h2 { "Payload" } (json_block(&job.payload)) }
            @if let Some(output) = &job.output { section { h2 { "Output" } (json_block(output)) } }
        } @else {
            section.hidden-data {
                h2 { "Payload" }
                p.muted { "The payload, output and logs are hidden: this session's token was made without --payloads." }
            }
        }
        (attempt_timeline(&crate::attempts::of(job), now, context.sees_payloads))
        @if let Some(log) = job.log.as_ref().filter(|log| context.sees_payloads && log.as_object().is_some_and(|l| !l.is_empty())) {
            section { h2 { "Log of the last attempt" } (run_log(log)) }
        }
    }
}

/// Every attempt, oldest first: host, start, run time, ending, error, its
/// outbound requests and log (folded; the last attempt's is shown below;
/// none unless `logs`), and the wait before it.
fn attempt_timeline(attempts: &[crate::attempts::Attempt], now: DateTime<Utc>, logs: bool) -> Markup {
    html! {
        @if !attempts.is_empty() {
            section {
                h2 { "Attempts" }
                ol.attempts {
                    @for (i, attempt) in attempts.iter().enumerate() {
                        @if let Some(waited) = attempt.waited_ms {
                            @if i > 0 && attempts[i - 1].ending == "retried" {
                                li.wait title="A retry waits out its backoff, then is made available by the next maintenance pass, at most --maintenance-interval (1 s by default) later" {
                                    "waited " (span(waited / 1000.0)) " (its backoff, then the next maintenance pass)"
                                }
                            } @else {
                                li.wait { "waited " (span(waited / 1000.0)) }
                            }
                        }
                        li.attempt {
                            div.attempt-head {
                                strong { @if attempt.attempt == 0 { "Before any attempt" } @else { "Attempt " (attempt.attempt) } }
                                " " (state_badge(&attempt.ending))
                                @if let Some(host) = &attempt.host { " on " code { (host) } }
                                @if attempt.started_at.is_some() { " · started " (clock_time(attempt.started_at, now)) }
                                @if let Some(ms) = attempt.ran_ms { " · ran " (span(ms / 1000.0)) }
                                @if attempt.outbound > 0 { " · " (attempt.outbound) " outbound request" @if attempt.outbound > 1 { "s" } }
                            }
                            @if let Some(error) = &attempt.error { pre { (error) } }
                            @if let Some(log) = attempt.log.as_ref().filter(|_| logs && i + 1 < attempts.len()) {
                                @if log.get("lines").and_then(|l| l.as_array()).is_some_and(|l| !l.is_empty()) || attempt.outbound > 0 {
                                    details { summary { "Its log" } (run_log(log)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A run's log: its lines by level, then what it wrote to stdout and
/// stderr; a log of another shape as its JSON.
fn run_log(log: &serde_json::Value) -> Markup {
    let Some(lines) = log.get("lines").and_then(|l| l.as_array()) else {
        return json_block(log);
    };
    let text = |name: &str| log.get(name).and_then(|t| t.as_str()).filter(|t| !t.is_empty()).map(str::to_string);
    html! {
        @if !lines.is_empty() {
            pre.log {
                @for line in lines {
                    @let level = line.get("level").and_then(|l| l.as_str()).unwrap_or("info");
                    span class={ "level level-" (level) } { (level) } " "
                    (line.get("message").and_then(|m| m.as_str()).unwrap_or("")) "\n"
                }
            }
        }
        @for (name, label) in [("stdout", "Standard output"), ("stderr", "Standard error")] {
            @if let Some(text) = text(name) { h3 { (label) } pre.log { (text) } }
        }
        @if let Some(calls) = log.get("outbound").and_then(|c| c.as_array()).filter(|c| !c.is_empty()) {
            h3 { "Outbound requests" }
            // Sizes and time share a column; on a phone each request is a
            // block of lines (the `stacked` style), so every figure shows.
            div.stacked { (table(&[Head::Text("Request, under the declared rule"), Head::Text("Result"), Head::Number("Sent, received, time")], html! {
                @for call in calls {
                    @let text = |name: &str| call.get(name).and_then(|v| v.as_str()).unwrap_or("").to_string();
                    @let number = |name: &str| call.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
                    tr {
                        td.wrap { code { (text("method")) " " (text("origin")) (text("path")) } br; span.muted { (text("rule")) } }
                        td.wrap {
                            @if let Some(status) = call.get("status").and_then(|s| s.as_u64()) { (status) " " }
                            @if let Some(error) = call.get("error").and_then(|e| e.as_str()) { span.warning-text { (one_line(error)) } }
                        }
                        td.num {
                            (bytes(number("request_bytes"))) " sent" br;
                            (bytes(number("response_bytes"))) " received" br;
                            (number("ms")) " ms"
                        }
                    }
                }
            })) }
        }
        @if let Some(elapsed) = log.get("elapsed_us").and_then(|e| e.as_f64()) {
            p.muted { "Ran for " (span(elapsed / 1e6)) "." }
        }
    }
}

/// A progress document's fraction done, when it has `done` and `total`.
fn fraction_of(progress: &serde_json::Value) -> Option<f64> {
    let done = progress.get("done")?.as_f64()?;
    let total = progress.get("total")?.as_f64()?;
    (total > 0.0).then(|| done / total)
}

/// The concurrency keys with holders or blocked jobs, then the rate keys
/// with starts in their window or a throttle in force.
pub fn keys(keys: &[KeyStatus], rate_keys: &[RateKeyStatus]) -> Markup {
    html! {
        h1 { "Keys" }
        (concurrency_keys(keys))
        (rate_key_table(rate_keys))
    }
}

/// The rate keys counting starts now, and the throttled ones.
fn rate_key_table(keys: &[RateKeyStatus]) -> Markup {
    html! {
        h2 { "Rate keys" }
        @if keys.is_empty() {
            p.muted { "No key has started a rate-limited run within its window, and none is throttled." }
        } @else {
            (table(&[Head::Text("Type"), Head::Text("Key"), Head::Number("Starts in window"), Head::Text("Throttled"), Head::Number("Sent back"), Head::Number("Throttles")], html! {
                @for key in keys {
                    tr {
                        td { (key.job) }
                        td { code { (key.key) } }
                        td.num {
                            @if let (Some(limit), Some(period_ms)) = (key.limit, key.period_ms) {
                                (key.starts_in_window) " / " (limit) " per " (crate::text::millis(period_ms))
                            } @else { "no limit" }
                        }
                        td {
                            @if let Some(secs) = key.throttled_secs { (state_badge("throttled")) " " (span(secs)) " more" } @else { "–" }
                        }
                        td.num { (key.sent_back) }
                        td.num { (key.throttles) }
                    }
                }
            }))
        }
    }
}

/// The concurrency keys with holders or blocked jobs.
fn concurrency_keys(keys: &[KeyStatus]) -> Markup {
    html! {
        h2 { "Concurrency keys" }
        @if keys.is_empty() {
            p.muted { "No key has holders or blocked jobs." }
        } @else {
            (table(&[Head::Text("Type"), Head::Text("Key"), Head::Number("Slots"), Head::Text("Holding"), Head::Number("Blocked"), Head::Text("Oldest wait")], html! {
                @for key in keys {
                    tr {
                        td { (key.job) }
                        td { a href={ "/jobs?job=" (encode(&key.job)) "&key=" (encode(&key.key)) } { code { (key.key) } } }
                        td.num {
                            (key.holders) " / " (key.limit.map_or("none".to_string(), |l| l.to_string()))
                        }
                        td {
                            @for holder in &key.holding {
                                a href={ "/jobs/" (holder.id) } { "job " (holder.id) }
                                @if let Some(host) = &holder.host_id { " on " code { (host) } } @else { " (" (holder.state) ")" }
                                br;
                            }
                        }
                        td.num { a href={ "/jobs?state=blocked&job=" (encode(&key.job)) "&key=" (encode(&key.key)) } { (key.blocked) } }
                        td { (key.oldest_blocked_secs.map_or("–".to_string(), span)) }
                    }
                }
            }))
        }
    }
}

/// A batch callback's name as a label: `on_finish` reads "On finish", as
/// the other facts' labels are written.
fn callback_label(kind: &str) -> String {
    let words = kind.replace('_', " ");
    let mut chars = words.chars();
    chars.next().map_or_else(String::new, |first| first.to_uppercase().chain(chars).collect())
}

/// The hosts, alive or presumed dead.
pub fn hosts(hosts: &[HostRow], now: DateTime<Utc>) -> Markup {
    html! {
        h1 { "Hosts" }
        @if hosts.is_empty() {
            p.muted { "No host has joined this database yet." }
        } @else {
            (table(&[Head::Text("Host"), Head::Text("State"), Head::Text("Last seen"), Head::Text("Heartbeat"), Head::Text("Started"), Head::Text("Version"), Head::Text("Job types")], html! {
                @for host in hosts {
                    tr {
                        td { code { (host.id) } br; span.muted { (host.hostname) ", pid " (host.pid) } }
                        td { (state_badge(if host.alive { "alive" } else { "silent" })) }
                        td { (span(host.silent_secs)) " ago" }
                        td { (span(host.heartbeat_ms as f64 / 1000.0)) }
                        td { (time(Some(host.started_at), now)) }
                        td { (host.version) }
                        td {
                            (host.job_types.join(", "))
                            @if let Some(error) = &host.watcher_error { br; span.warning-text { "watcher down: " (error) } }
                        }
                    }
                }
            }))
        }
    }
}

/// The registered job types with what each declared.
pub fn job_types(types: &[JobTypeView], now: DateTime<Utc>) -> Markup {
    html! {
        h1 { "Job types" }
        @if types.is_empty() {
            p.muted { "No component has registered a job type yet." }
        }
        @for view in types {
            (type_card(view, now))
        }
    }
}

/// One job type: its component, deploy, configuration, outbound rules and
/// the hosts serving it.
pub fn type_card(view: &JobTypeView, now: DateTime<Utc>) -> Markup {
    let name = &view.registered.name;
    html! {
        section.type-card {
            h2 {
                a href={ "/types/" (encode(name)) } { (name) }
                " " a.small href={ "/jobs?job=" (encode(name)) } { "its jobs" }
            }
            p.muted { "Component " (digest(&view.registered.digest)) ", registered " (time(Some(view.registered.updated_at), now)) }
            @if let Some(deployed) = &view.deployed {
                p.deployed {
                    "Deployed through the database: " (digest(&deployed.digest))
                    @if deployed.action == crate::store::DeployAction::Rollback { " (a rollback)" }
                    ", " (time(Some(deployed.deployed_at), now))
                }
            }
            @if let Some(error) = &view.registered.config_error {
                p.warning { "The stored configuration cannot be read: " (error) }
            }
            @if let Some(config) = &view.registered.config {
                (config_facts(config))
                @if !config.outbound.is_empty() || !view.grants.is_empty() {
                    (outbound_rules(name, &config.outbound, &view.grants))
                }
            }
            p {
                "Served by: "
                @if view.hosts.is_empty() { span.muted { "no host" } }
                @for host in &view.hosts {
                    code { (host.host) } " "
                    @if let Some(d) = &host.digest { (digest(d)) " " }
                    (state_badge(if host.alive { "alive" } else { "silent" })) " "
                }
            }
        }
    }
}

/// The origins a type's component declares, each beside the grants that
/// meet it (or the command that would grant it), then grants that meet no
/// declared rule and so allow nothing.
fn outbound_rules(
    job_type: &str,
    declared: &[crate::types::OutboundRule],
    grants: &[crate::store::grant::OutboundGrant],
) -> Markup {
    use crate::outbound::OriginPattern;
    let pattern = |text: &str| text.parse::<OriginPattern>().ok();
    let meets = |rule: &crate::types::OutboundRule, grant: &crate::store::grant::OutboundGrant| matches!((pattern(&rule.origin), pattern(&grant.origin)), (Some(a), Some(b)) if a.overlaps(&b));
    let list = |items: &[String], none: &str| if items.is_empty() { none.to_string() } else { items.join(", ") };
    let stray: Vec<_> = grants.iter().filter(|g| !declared.iter().any(|rule| meets(rule, g))).collect();
    html! {
        h3 { "Outbound HTTP" }
        (table(&[Head::Text("Declared origin"), Head::Text("Granted"), Head::Text("Methods"), Head::Text("Secrets")], html! {
            @for rule in declared {
                @let granted: Vec<_> = grants.iter().filter(|g| meets(rule, g)).collect();
                tr {
                    td { code { (rule.origin) } }
                    td.wrap {
                        @if granted.is_empty() {
                            span.warning-text { "not granted" } br;
                            @let command = pattern(&rule.origin).map(|origin| {
                                let rule = crate::outbound::Rule { origin, methods: rule.methods.clone(), secrets: rule.secrets.clone() };
                                crate::outbound::policy::grant_command(job_type, &rule)
                            });
                            @if let Some(command) = command { code { (command) } }
                            @if !rule.secrets.is_empty() {
                                br;
                                span.muted {
                                    "to carry " (rule.secrets.join(", ")) ": set "
                                    @for (n, name) in rule.secrets.iter().enumerate() {
                                        @if n > 0 { " and " }
                                        code { "jobhost secret set " (name) }
                                    }
                                    ", then grant again adding "
                                    code { @for name in &rule.secrets { "--secret " (name) " " } }
                                }
                            }
                        }
                        @for (n, grant) in granted.iter().enumerate() {
                            @if n > 0 { br; }
                            (state_badge("granted")) " " code { (grant.origin) } " " (grant_terms(grant))
                        }
                    }
                    td { (list(&rule.methods, "any")) }
                    td { (list(&rule.secrets, "none")) }
                }
            }
            @for grant in &stray {
                tr {
                    td.muted { "none declared" }
                    td { code { (grant.origin) } " " span.warning-text { "granted, but allows nothing: the component does not declare it" } }
                    td { (list(&grant.methods, "any")) }
                    td { (list(&grant.secrets, "none")) }
                }
            }
        }))
    }
}

/// A grant's methods, secrets and options, in words.
fn grant_terms(grant: &crate::store::grant::OutboundGrant) -> String {
    let mut terms =
        vec![if grant.methods.is_empty() { "any declared method".to_string() } else { grant.methods.join(",") }];
    if !grant.secrets.is_empty() {
        terms.push(format!("secrets {}", grant.secrets.join(",")));
    }
    if grant.private {
        terms.push("private addresses".into());
    }
    if !grant.secret_headers.is_empty() {
        terms.push(format!("secrets in headers {} only", grant.secret_headers.join(", ")));
    }
    if !grant.secrets_in.is_empty() {
        terms.push(format!("secrets also in the {}", grant.secrets_in.join(" and ")));
    }
    if grant.idempotency_key {
        terms.push("Idempotency-Key".into());
    }
    format!("({})", terms.join("; "))
}

/// A JSON scalar as text, without a string's quotes.
fn plain(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// What a job type declared, in words.
fn config_facts(config: &crate::types::JobConfig) -> Markup {
    let field = |value: &serde_json::Value, name: &str| value.get(name).map(plain).unwrap_or_default();
    let concurrency = config.concurrency.as_ref().map(|c| serde_json::to_value(c).unwrap_or_default());
    let unique = config.unique.as_ref().map(|u| serde_json::to_value(u).unwrap_or_default());
    html! {
        dl.facts {
            dt { "Queue" } dd { (config.queue) ", priority " (config.priority) }
            dt { "Attempts" } dd {
                (config.max_attempts) ", backoff " (span(config.backoff.base_ms as f64 / 1000.0))
                " doubling to " (span(config.backoff.cap_ms as f64 / 1000.0))
            }
            dt { "Limits" } dd { (span(config.timeout_ms as f64 / 1000.0)) " per run, " (bytes(config.memory_limit_bytes)) " of memory" }
            @if let Some(c) = &concurrency {
                dt { "Concurrency" } dd {
                    (field(c, "limit")) " at a time per key " code { (field(c, "key")) }
                    ", lease " (field(c, "duration_secs")) " s; when full: " (field(c, "on_conflict"))
                }
            }
            @if let Some(rate) = &config.rate_limit {
                dt { "Rate limit" } dd {
                    (rate.limit) " starts per " (crate::text::millis(rate.period_ms as i64)) " per key " code { (rate.key.as_str()) }
                }
            }
            @if let Some(u) = &unique {
                dt { "Unique" } dd {
                    "key " code { (field(u, "key")) } ", " (field(u, "strategy")) "; a duplicate: " (field(u, "on_duplicate"))
                }
            }
            @if let Some(schedule) = &config.schedule {
                dt { "Schedule" } dd {
                    code { (schedule.cron) } " in " (schedule.time_zone) ", backfill " (schedule.backfill)
                }
            }
        }
    }
}

/// The batches, newest first.
pub fn batches(batches: &[Batch], now: DateTime<Utc>) -> Markup {
    html! {
        h1 { "Batches" }
        @if batches.is_empty() {
            p.muted { "No batches yet." }
        } @else {
            (table(&[Head::Number("Id"), Head::Text("Label"), Head::Text("State"), Head::Text("Progress"), Head::Number("Members"), Head::Number("Failed"), Head::Text("Created"), Head::Text("Finished")], html! {
                @for batch in batches {
                    tr {
                        td.num { a href={ "/batches/" (batch.id) } { (batch.id) } }
                        td { (batch.label.as_deref().unwrap_or("")) }
                        td { (state_badge(batch.state.as_str())) }
                        td.bar { (progress_bar(batch.progress, &format!("batch {} progress", batch.id), &batch_parts(batch))) }
                        td.num { (batch.counts.ended()) " / " (batch.counts.total) }
                        td.num { (batch.counts.failed + batch.counts.discarded) }
                        td { (time(Some(batch.created_at), now)) }
                        td { (time(batch.finished_at, now)) }
                    }
                }
            }))
        }
    }
}

/// A batch's progress by how its members ended: the failed and discarded
/// share in red, the cancelled in grey, and the rest of its progress (the
/// completed members and the running ones' own progress) in green, so
/// the fill matches the figure.
fn batch_parts(batch: &Batch) -> [(f64, Tone); 3] {
    let c = &batch.counts;
    let share = |n: i64| if c.total == 0 { 0.0 } else { n as f64 / c.total as f64 };
    let (failures, cancelled) = (share(c.failed + c.discarded), share(c.cancelled));
    [
        ((batch.progress - failures - cancelled).max(0.0), Tone::Good),
        (failures, Tone::Failures),
        (cancelled, Tone::Cancelled),
    ]
}

/// One batch: its counts, callbacks and times.
pub fn batch(batch: &Batch, now: DateTime<Utc>) -> Markup {
    let counts = &batch.counts;
    html! {
        h1 { "Batch " (batch.id) " " (state_badge(batch.state.as_str())) }
        @if let Some(label) = &batch.label { p.lead { (label) } }
        (progress_bar(batch.progress, "batch progress", &batch_parts(batch)))
        section.cards aria-label="Members by state" {
            @for (label, count) in [("total", counts.total), ("pending", counts.pending), ("running", counts.running), ("completed", counts.completed), ("failed", counts.failed), ("discarded", counts.discarded), ("cancelled", counts.cancelled)] {
                div class={ "card state-" (label) } { span.count { (count) } span.label { (label) } }
            }
        }
        p { a href={ "/jobs?batch=" (batch.id) } { "List its members" } }
        dl.facts {
            dt { "Created" } dd { (time(Some(batch.created_at), now)) }
            dt { "Closed" } dd { (time(batch.closed_at, now)) }
            dt { "Finished" } dd { (time(batch.finished_at, now)) }
            @for (kind, job) in batch.callbacks.named() {
                dt { (callback_label(kind)) }
                dd {
                    (job)
                    @if let Some(id) = batch.callback_jobs.get(kind) { ": " a href={ "/jobs/" (id) } { "job " (id) } }
                    @if let Some(error) = batch.callback_errors.get(kind) { ": " span.warning-text { (error) } }
                }
            }
        }
    }
}

/// How many schedules made at run time one page of the schedules shows.
pub const KEYED_PAGE: i64 = 100;

/// The schedules: those job types declare, then a page of those made at
/// run time (`more` when a page follows, `later` when this is not the
/// first), with pause, resume and trigger-now for a caller who may change
/// things.
pub fn schedules(
    context: &Context,
    schedules: &[ScheduleStatus],
    keyed: &[KeyedScheduleStatus],
    more: bool,
    later: bool,
    now: DateTime<Utc>,
) -> Markup {
    html! {
        h1 { "Schedules" }
        h2 { "Declared by job types" }
        @if schedules.is_empty() {
            p.muted { "No job type declares a schedule." }
        } @else {
            (table(&[Head::Text("Type"), Head::Text("Cron"), Head::Text("Zone"), Head::Text("Last tick"), Head::Text("Next tick"), Head::Number("Backfill"), Head::Text("Served")], html! {
                @for schedule in schedules {
                    tr {
                        td { a href={ "/jobs?job=" (encode(&schedule.job)) } { (schedule.job) } }
                        td { code { (schedule.cron) } }
                        td { (schedule.time_zone) }
                        td { (time(schedule.last_tick, now)) }
                        td { (time(schedule.next_tick, now)) }
                        td.num { (schedule.backfill) }
                        td { (state_badge(if schedule.served { "alive" } else { "silent" })) }
                    }
                }
            }))
        }
        h2 { "Made at run time" }
        @if keyed.is_empty() && later {
            p.muted { "No more. " a href="/schedules" { "← First page" } }
        } @else if keyed.is_empty() {
            p.muted { "None yet: " code { "jobhost schedule add JOB KEY --cron ..." } ", " code { "PUT /api/schedules/JOB/KEY" } " or SQL's " code { "jobhost.schedule_upsert" } " makes one." }
        } @else {
            div.stacked.keyed-schedules {
                (table(&[Head::Text("Schedule"), Head::Text("Calendar"), Head::Text("Ticks"), Head::Text("State"), Head::Text("")], html! {
                    @for status in keyed {
                        @let s = &status.schedule;
                        tr {
                            td {
                                a href={ "/jobs?job=" (encode(&s.job)) } { (s.job) }
                                " " code.key { (s.key) }
                            }
                            td {
                                code { (s.cron) } " " span.muted { (s.time_zone) }
                                br;
                                span.muted { "overlap " (s.overlap.as_str().replace('_', "-")) }
                                @if s.jitter_ms > 0 {
                                    span.muted { ", jitter " (humantime::format_duration(std::time::Duration::from_millis(s.jitter_ms))) }
                                }
                            }
                            td {
                                span.muted { "last " } (time(status.last_tick, now))
                                @if let Some(id) = status.last_job { " " a href={ "/jobs/" (id) } { "job " (id) } }
                                br;
                                span.muted { "next " }
                                @if s.paused { span.muted { "paused" } } @else { (time(status.next_tick, now)) }
                            }
                            td {
                                @if s.paused {
                                    (state_badge("paused"))
                                    @if !s.note.is_empty() { " " span.note { (s.note) } }
                                } @else if let Some(error) = &status.error {
                                    span.warning-text { (error) }
                                } @else if status.buffered_tick.is_some() {
                                    "a tick buffered"
                                } @else if status.triggered_at.is_some() {
                                    "triggered"
                                } @else {
                                    (state_badge("alive"))
                                }
                                @if status.skipped > 0 { br; span.muted { (status.skipped) " skipped" } }
                            }
                            td.actions {
                                @if s.paused {
                                    (schedule_button(context, status, "resume", "Resume", None))
                                } @else {
                                    (schedule_button(context, status, "pause", "Pause", Some("Pause this schedule? Its ticks until it is resumed are not made up.")))
                                }
                                (schedule_button(context, status, "trigger", "Run now", None))
                            }
                        }
                    }
                }))
            }
            @if later || more {
                p.pager {
                    @if later { a href="/schedules" { "← First page" } }
                    @if later && more { " · " }
                    @if let (true, Some(last)) = (more, keyed.last()) {
                        a href={ "/schedules?after=" (encode(&format!("{}/{}", last.schedule.job, last.schedule.key))) } { "Next " (KEYED_PAGE) " →" }
                    }
                }
            }
        }
    }
}

/// A button pausing, resuming or triggering a keyed schedule, its type and
/// key in the form (a key may hold any character).
fn schedule_button(
    context: &Context,
    status: &KeyedScheduleStatus,
    action: &str,
    label: &str,
    confirm: Option<&str>,
) -> Markup {
    html! {
        @if context.may_operate() {
            form.inline method="post" action={ "/schedules/" (action) } data-confirm=[confirm] {
                (hidden_fields(context))
                input type="hidden" name="job" value=(status.schedule.job);
                input type="hidden" name="key" value=(status.schedule.key);
                button type="submit" { (label) }
            }
        }
    }
}

/// The sign-in form.
/// The sign-in form; `problem` says why the last try was refused.
pub fn login(return_to: &str, reads_need_login: bool, problem: Option<&str>) -> Markup {
    html! {
        h1 { "Sign in" }
        @if reads_need_login {
            p { "This server shows its jobs, and changes them, only for those with the token it was started with." }
        } @else {
            p { "Changes (retry, cancel, pause) need the token this server was started with." }
        }
        @if let Some(problem) = problem { p.problem { (problem) } }
        form.login method="post" action="/login" {
            input type="hidden" name="return_to" value=(return_to);
            label { "Token" input type="password" name="token" autocomplete="current-password" required autofocus; }
            button type="submit" { "Sign in" }
        }
    }
}
