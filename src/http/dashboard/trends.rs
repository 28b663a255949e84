//! The fleet over time on the dashboard: the overview's throughput and
//! queue depth, and a job type's own page with its throughput, run times,
//! failures, waits and depth, deploys marked on the time axis.

use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::chart::{self, Chart, Mark, Shape, count, series};
use super::layout::{Head, digest, table, time};
use crate::http::query::encode;
use crate::http::views::JobTypeView;
use crate::store::DeploymentEntry;
use crate::store::history::{HistoryPoint, HistoryRange};

fn times(points: &[HistoryPoint]) -> Vec<DateTime<Utc>> {
    points.iter().map(|p| p.at).collect()
}

/// Finished jobs per step, completed and failed stacked.
fn throughput(range: HistoryRange, points: &[HistoryPoint], marks: &[Mark], all_ends: bool) -> Markup {
    let mut drawn = vec![
        series("completed", "completed", points, |p| count(p.completed)),
        series("failed", "failed", points, |p| count(p.failed)),
    ];
    if all_ends {
        drawn.push(series("discarded", "discarded", points, |p| count(p.discarded)));
        drawn.push(series("cancelled", "cancelled", points, |p| count(p.cancelled)));
    }
    chart::render(&Chart {
        title: "Throughput",
        unit: "jobs",
        shape: Shape::Stacked,
        range,
        times: times(points),
        series: drawn,
        marks,
    })
}

/// Live jobs at each step's last sample. A step with no sample between
/// two sampled ones had no live jobs (a sample writes rows only for
/// queues with some), so it is drawn at zero: a spike rises from the axis,
/// not from mid-air. Before the first sample and after the last (the
/// current minute, until its first sample) nothing is known, and nothing
/// is drawn.
fn depth(range: HistoryRange, points: &[HistoryPoint], marks: &[Mark]) -> Markup {
    let is_sampled = |p: &HistoryPoint| p.available.is_some() || p.scheduled.is_some() || p.blocked.is_some();
    let known = points.iter().position(is_sampled).zip(points.iter().rposition(is_sampled));
    let sampled = |value: fn(&HistoryPoint) -> Option<i64>| {
        move |p: &HistoryPoint| match value(p) {
            Some(n) => Some(n as f64),
            None if known.is_some_and(|(first, last)| (points[first].at..=points[last].at).contains(&p.at)) => {
                Some(0.0)
            }
            None => None,
        }
    };
    chart::render(&Chart {
        title: "Queue depth",
        unit: "jobs",
        shape: Shape::Lines,
        range,
        times: times(points),
        series: vec![
            series("available", "available", points, sampled(|p| p.available)),
            series("scheduled", "scheduled", points, sampled(|p| p.scheduled)),
            series("blocked", "blocked", points, sampled(|p| p.blocked)),
        ],
        marks,
    })
}

/// The overview's charts: throughput and depth over `range`.
pub fn overview(range: HistoryRange, points: &[HistoryPoint]) -> Markup {
    html! {
        section.trends aria-label="Over time" {
            div.trends-head { h2 { "Over time" } (chart::range_switch(range, "/")) }
            (extent(range, points))
            div.charts {
                (throughput(range, points, &[], false))
                (depth(range, points, &[]))
            }
        }
    }
}

/// A job type's page: its card, then its charts and deploys over `range`.
pub fn job_type(
    view: &JobTypeView,
    range: HistoryRange,
    points: &[HistoryPoint],
    deploys: &[DeploymentEntry],
    now: DateTime<Utc>,
) -> Markup {
    let name = &view.registered.name;
    let marks: Vec<Mark> = deploys
        .iter()
        .map(|d| Mark {
            at: d.at,
            label: format!(
                "{} {} at {} UTC",
                d.action.as_str(),
                d.digest.as_deref().map(short).unwrap_or(""),
                d.at.format("%b %d %H:%M:%S")
            ),
        })
        .collect();
    html! {
        h1 { (name) }
        (super::pages::type_card(view, now))
        div.trends-head { h2 { "Over time" } (chart::range_switch(range, &format!("/types/{}", encode(name)))) }
        (extent(range, points))
        div.charts {
            (throughput(range, points, &marks, true))
            (chart::render(&Chart {
                title: "Run time",
                unit: "ms",
                shape: Shape::Lines,
                range,
                times: times(points),
                series: vec![
                    series("p50", "p50", points, |p| p.run_p50_ms),
                    series("p95", "p95", points, |p| p.run_p95_ms),
                ],
                marks: &marks,
            }))
            (chart::render(&Chart {
                title: "Failures",
                unit: "attempts",
                shape: Shape::Stacked,
                range,
                times: times(points),
                series: vec![
                    series("failed", "failed", points, |p| count(p.failed)),
                    series("retried", "retried", points, |p| count(p.retried)),
                ],
                marks: &marks,
            }))
            (chart::render(&Chart {
                title: "Wait before start",
                unit: "ms",
                shape: Shape::Lines,
                range,
                times: times(points),
                series: vec![
                    series("p50", "p50", points, |p| p.wait_p50_ms),
                    series("p95", "p95", points, |p| p.wait_p95_ms),
                ],
                marks: &marks,
            }))
            (depth(range, points, &marks))
        }
        h2 { "Deploys" }
        @if deploys.is_empty() {
            p.muted { "Not deployed through the database: hosts serve it from their directories." }
        } @else {
            (table(&[Head::Text("When"), Head::Text("Action"), Head::Text("Component")], html! {
                @for entry in deploys.iter().rev() {
                    tr {
                        td { (time(Some(entry.at), now)) }
                        td { (entry.action.as_str()) }
                        td { @if let Some(d) = &entry.digest { (digest(d)) } @else { span.muted { "none" } } }
                    }
                }
            }))
        }
    }
}

/// How much history the range holds, and how long a bar is: an hour of
/// data in the week's view is one bar, which reads as a chart broken
/// unless it says so.
fn extent(range: HistoryRange, points: &[HistoryPoint]) -> Markup {
    let has_data = |p: &&HistoryPoint| {
        p.completed + p.failed + p.discarded + p.cancelled + p.retried + p.runs > 0
            || p.available.is_some()
            || p.scheduled.is_some()
            || p.blocked.is_some()
    };
    let step = crate::text::millis(range.step_minutes() * 60_000);
    html! {
        p.history-extent {
            @match points.iter().find(has_data) {
                None => { "No history in this range yet." }
                Some(first) => {
                    "History from " (first.at.format("%b %d %H:%M")) " UTC"
                    @if range.step_minutes() > 1 { "; each bar is " (step) }
                    "."
                }
            }
        }
    }
}

/// A digest's first characters, as a mark's label shows it.
fn short(digest: &str) -> &str {
    let digest = digest.strip_prefix("sha256:").unwrap_or(digest);
    &digest[..digest.len().min(12)]
}
