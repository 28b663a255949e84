//! Charts of the fleet over time, drawn on the server as SVG: no client
//! library, no request beyond the page's own. The plot stretches to its
//! box (a unit of width per point), while its labels are HTML around it,
//! so they stay legible at a phone's width. Each point has a hit area
//! whose title holds its values; the page script shows them in the
//! chart's readout on hover or tap.

use chrono::{DateTime, Duration, Utc};
use maud::{Markup, PreEscaped, html};

use crate::store::history::{HistoryPoint, HistoryRange};

/// How a chart draws its series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Bars, the series stacked in order (counts).
    Stacked,
    /// A line per series (times, depths).
    Lines,
}

/// One series: its name, the CSS class giving its colour, a value per point.
pub struct Series {
    pub name: &'static str,
    pub class: &'static str,
    pub values: Vec<Option<f64>>,
}

/// A moment marked on the time axis (a deploy), with what happened.
pub struct Mark {
    pub at: DateTime<Utc>,
    pub label: String,
}

/// A chart of `range` over `points`' times.
pub struct Chart<'a> {
    pub title: &'static str,
    /// What a value counts, after the number (`jobs`, `ms`).
    pub unit: &'static str,
    pub shape: Shape,
    pub range: HistoryRange,
    pub times: Vec<DateTime<Utc>>,
    pub series: Vec<Series>,
    pub marks: &'a [Mark],
}

/// The plot's height in its own units; its width is one unit per point.
const HEIGHT: f64 = 100.0;

/// The thinnest a stacked segment with a value is drawn, in plot units.
const MIN_SEGMENT: f64 = 2.5;

/// A series of `points`, read by `value`.
pub fn series(
    name: &'static str,
    class: &'static str,
    points: &[HistoryPoint],
    value: impl Fn(&HistoryPoint) -> Option<f64>,
) -> Series {
    Series { name, class, values: points.iter().map(value).collect() }
}

/// A count as a series value.
pub fn count(n: i64) -> Option<f64> {
    Some(n as f64)
}

/// The chart's markup.
pub fn render(chart: &Chart) -> Markup {
    let width = chart.times.len().max(1) as f64;
    let top = nice_ceiling(highest(chart));
    let scale = |value: f64| HEIGHT - value / top * HEIGHT;
    let step = Duration::minutes(chart.range.step_minutes());
    let first = chart.times.first().copied().unwrap_or_else(Utc::now);
    let marks: Vec<(f64, &Mark)> = chart
        .marks
        .iter()
        .map(|mark| ((mark.at - first).num_milliseconds() as f64 / step.num_milliseconds() as f64, mark))
        .filter(|(x, _)| (0.0..=width).contains(x))
        .collect();
    let mut plot = String::new();
    // Grid lines at a quarter, half and three quarters of the scale.
    for quarter in [0.25, 0.5, 0.75] {
        let y = HEIGHT * quarter;
        plot.push_str(&format!(r#"<line class="grid" x1="0" x2="{width}" y1="{y}" y2="{y}"/>"#));
    }
    match chart.shape {
        Shape::Stacked => {
            for i in 0..chart.times.len() {
                // Stacked from the bottom up. A few failures among hundreds
                // of completions stay visible: a segment with a value is
                // never thinner than MIN_SEGMENT (the readout has the
                // exact figure).
                let heights = stacked_heights(chart.series.iter().map(|s| s.values[i].unwrap_or(0.0)), top);
                let mut bottom = HEIGHT;
                for (series, height) in chart.series.iter().zip(heights) {
                    if height > 0.0 {
                        let y = bottom - height;
                        plot.push_str(&format!(
                            r#"<rect class="{}" x="{:.2}" y="{y:.3}" width="0.8" height="{height:.3}"/>"#,
                            series.class,
                            i as f64 + 0.1
                        ));
                        bottom = y;
                    }
                }
            }
        }
        Shape::Lines => {
            for series in &chart.series {
                for run in runs(&series.values) {
                    let points: Vec<String> =
                        run.iter().map(|(i, v)| format!("{:.2},{:.3}", *i as f64 + 0.5, scale(*v))).collect();
                    if points.len() == 1 {
                        // A lone value shows as a dot: a line of no length
                        // with round caps, which the stretched plot cannot
                        // widen into a dash.
                        plot.push_str(&format!(
                            r#"<polyline class="{} dot" points="{} {}"/>"#,
                            series.class, points[0], points[0]
                        ));
                    } else {
                        plot.push_str(&format!(
                            r#"<polyline class="{}" points="{}"/>"#,
                            series.class,
                            points.join(" ")
                        ));
                    }
                }
            }
        }
    }
    for (x, _) in &marks {
        plot.push_str(&format!(r#"<line class="mark" x1="{x:.2}" x2="{x:.2}" y1="0" y2="{HEIGHT}"/>"#));
    }
    html! {
        figure.chart data-chart=(chart.title) {
            figcaption {
                span.chart-title { (chart.title) }
                span.legend {
                    @for series in &chart.series {
                        span { i class={ "swatch " (series.class) } {} (series.name) }
                    }
                    @if !marks.is_empty() { span { i.swatch.mark {} "deploy" } }
                }
            }
            div.plot {
                span.ymax { (number(top)) " " (unit(chart.unit, top)) }
                svg viewBox={ "0 0 " (width) " " (HEIGHT) } preserveAspectRatio="none" role="img"
                    aria-label={ (chart.title) ", " (chart.range.name()) } {
                    // Under the plot, which lets pointers through to them,
                    // so a highlighted point never pales its bars.
                    @for (i, at) in chart.times.iter().enumerate() {
                        rect.hit x=(i) y="0" width="1" height=(HEIGHT) data-i=(i) {
                            title { (readout(chart, i, *at)) }
                        }
                    }
                    g.drawn { (PreEscaped(plot)) }
                    @for (x, mark) in &marks {
                        rect.hit.mark-hit x=(format!("{:.2}", x - 0.3)) y="0" width="0.6" height=(HEIGHT) {
                            title { (mark.label) }
                        }
                    }
                }
            }
            div.axis {
                span { (axis_time(chart.range, first)) }
                span { (axis_time(chart.range, first + step * (chart.times.len() as i32 / 2))) }
                span { "now (UTC)" }
            }
            p.readout aria-live="polite" { "Point at or tap the chart for its values." }
        }
    }
}

/// The heights of one bar's segments, bottom up: each to scale, but a
/// segment with a value at least MIN_SEGMENT tall; what that adds past the
/// plot's top is taken from the tallest segment, so the bar stays within
/// the plot and the small ones stay visible.
fn stacked_heights(values: impl Iterator<Item = f64>, top: f64) -> Vec<f64> {
    let mut heights: Vec<f64> =
        values.map(|value| if value > 0.0 { (value / top * HEIGHT).max(MIN_SEGMENT) } else { 0.0 }).collect();
    let excess = heights.iter().sum::<f64>() - HEIGHT;
    if excess > 0.0
        && let Some(tallest) = heights.iter_mut().max_by(|a, b| a.total_cmp(b))
    {
        *tallest = (*tallest - excess).max(0.0);
    }
    heights
}

/// The values of point `i`, as the readout shows them.
fn readout(chart: &Chart, i: usize, at: DateTime<Utc>) -> String {
    let step = Duration::minutes(chart.range.step_minutes());
    let values: Vec<String> = chart
        .series
        .iter()
        .map(|series| match series.values[i] {
            Some(value) => format!("{} {} {}", series.name, number(value), unit(chart.unit, value)),
            None => format!("{} –", series.name),
        })
        .collect();
    format!("{}–{} UTC: {}", at.format("%b %d %H:%M"), (at + step).format("%H:%M"), values.join(", "))
}

/// A unit after `value`: "1 job", "2 jobs"; units that are not plural
/// nouns ("ms") stay as they are.
fn unit(plural: &'static str, value: f64) -> &'static str {
    match plural.strip_suffix('s') {
        Some(one) if value == 1.0 && plural != "ms" => one,
        _ => plural,
    }
}

/// The runs of consecutive values a line joins (a gap breaks it).
fn runs(values: &[Option<f64>]) -> Vec<Vec<(usize, f64)>> {
    let mut runs: Vec<Vec<(usize, f64)>> = Vec::new();
    let mut current = Vec::new();
    for (i, value) in values.iter().enumerate() {
        match value {
            Some(v) => current.push((i, *v)),
            None if !current.is_empty() => runs.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs
}

/// The largest value drawn: a stack's total, or a line's peak.
fn highest(chart: &Chart) -> f64 {
    let points = chart.times.len();
    match chart.shape {
        Shape::Stacked => (0..points)
            .map(|i| chart.series.iter().map(|s| s.values[i].unwrap_or(0.0)).sum::<f64>())
            .fold(0.0, f64::max),
        Shape::Lines => chart.series.iter().flat_map(|s| s.values.iter().flatten()).copied().fold(0.0, f64::max),
    }
}

/// The scale's top: the value rounded up to 1, 2 or 5 times a power of
/// ten, and at least 1.
pub fn nice_ceiling(value: f64) -> f64 {
    if value.is_nan() || value <= 1.0 {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|top| *top >= value).unwrap_or(10.0 * power)
}

/// A value as the labels show it: whole numbers plain, fractions to one
/// decimal, thousands grouped by a thin space.
fn number(value: f64) -> String {
    if value.fract() == 0.0 || value >= 100.0 {
        let whole = value.round() as i64;
        let digits = whole.abs().to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push('\u{2009}');
            }
            grouped.push(c);
        }
        if whole < 0 { format!("-{grouped}") } else { grouped }
    } else {
        format!("{value:.1}")
    }
}

/// A time on the axis: the hour and minute, with the day for a week.
fn axis_time(range: HistoryRange, at: DateTime<Utc>) -> String {
    match range {
        HistoryRange::Week => at.format("%b %d %H:%M").to_string(),
        _ => at.format("%H:%M").to_string(),
    }
}

/// Links to each range, the current one marked.
pub fn range_switch(current: HistoryRange, path: &str) -> Markup {
    html! {
        nav.range aria-label="Time range" {
            @for range in HistoryRange::ALL {
                a href={ (path) "?range=" (range.name()) } aria-current=[(range == current).then_some("true")] { (range.name()) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_rounds_up_to_a_readable_top() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(10.0), 10.0);
        assert_eq!(nice_ceiling(120.0), 200.0);
        assert_eq!(nice_ceiling(5001.0), 10_000.0);
    }

    #[test]
    fn a_few_failures_stay_visible_on_the_tallest_bar() {
        let heights = stacked_heights([996.0, 2.0, 1.0, 1.0].into_iter(), 1000.0);
        assert!(heights[1..].iter().all(|h| *h >= MIN_SEGMENT), "{heights:?}");
        assert!((heights.iter().sum::<f64>() - HEIGHT).abs() < 1e-9, "within the plot: {heights:?}");
        assert_eq!(stacked_heights([0.0, 50.0].into_iter(), 100.0), [0.0, 50.0]);
    }

    #[test]
    fn a_gap_breaks_a_line() {
        let runs = runs(&[Some(1.0), None, Some(2.0), Some(3.0), None]);
        assert_eq!(runs, vec![vec![(0, 1.0)], vec![(2, 2.0), (3, 3.0)]]);
    }

    #[test]
    fn numbers_are_grouped_and_rounded() {
        assert_eq!(number(1234567.0), "1\u{2009}234\u{2009}567");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(7.0), "7");
    }

    #[test]
    fn stacked_bars_are_drawn_to_scale_with_a_readout_per_point() {
        let times: Vec<DateTime<Utc>> =
            (0..3).map(|i| DateTime::from_timestamp(1_800_000_000 + i * 60, 0).unwrap()).collect();
        let chart = Chart {
            title: "Throughput",
            unit: "jobs",
            shape: Shape::Stacked,
            range: HistoryRange::Hour,
            times,
            series: vec![
                Series { name: "completed", class: "completed", values: vec![Some(3.0), Some(0.0), Some(1.0)] },
                Series { name: "failed", class: "failed", values: vec![Some(2.0), Some(0.0), Some(0.0)] },
            ],
            marks: &[],
        };
        let html = render(&chart).into_string();
        // The top is 5: the first stack fills the plot, its failed part on top.
        assert!(
            html.contains(r#"<rect class="completed" x="0.10" y="40.000" width="0.8" height="60.000"/>"#),
            "{html}"
        );
        assert!(html.contains(r#"<rect class="failed" x="0.10" y="0.000" width="0.8" height="40.000"/>"#));
        assert_eq!(html.matches("class=\"hit\"").count(), 3);
        assert!(html.contains("completed 3 jobs, failed 2 jobs"));
    }
}
