//! The workflow pages: the list, and one workflow drawn as its graph (a
//! server-rendered SVG, layered left to right, each step coloured by its
//! state) above the table of its steps, where a step waiting for an event
//! says what it waits for and, in a signed-in session, can be approved or
//! rejected (the event it waits for, sent).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::layout::{Context, Head, Tone, hidden_fields, progress_bar, state_badge, table, time};
use crate::store::{IfFailed, Workflow, WorkflowStep};
use crate::text::clip;

/// Steps a layer draws one by one; a wider layer (a fan-out) draws its
/// steps in boxes counting them by state, so a graph of thousands stays legible.
const MAX_DRAWN_PER_LAYER: usize = 12;

/// A box's size and the gaps between boxes, in SVG units.
const BOX_W: f64 = 184.0;
const BOX_H: f64 = 40.0;
const GAP_X: f64 = 56.0;
const GAP_Y: f64 = 14.0;

/// A workflow's ended steps by how they ended, as shares of all of them.
fn parts(workflow: &Workflow) -> [(f64, Tone); 3] {
    let c = &workflow.counts;
    let count = |state: &str| c.by_state.get(state).copied().unwrap_or(0);
    let share = |n: i64| if c.total == 0 { 0.0 } else { n as f64 / c.total as f64 };
    let cancelled = count("cancelled");
    [
        (share(count("completed")), Tone::Good),
        (share(c.unsuccessful() - cancelled), Tone::Failures),
        (share(cancelled), Tone::Cancelled),
    ]
}

fn fraction_ended(workflow: &Workflow) -> f64 {
    let c = &workflow.counts;
    if c.total == 0 { 1.0 } else { c.ended() as f64 / c.total as f64 }
}

/// Workflows, newest first.
pub fn workflows(workflows: &[Workflow], now: DateTime<Utc>) -> Markup {
    html! {
        h1 { "Workflows" }
        @if workflows.is_empty() {
            p.muted { "No workflows yet: " code { "jobhost workflow create --file wf.json" } "." }
        } @else {
            (table(&[Head::Number("Id"), Head::Text("Label"), Head::Text("State"), Head::Text("Progress"), Head::Number("Steps"), Head::Number("Not completed"), Head::Text("Created"), Head::Text("Finished")], html! {
                @for workflow in workflows {
                    tr {
                        td.num { a href={ "/workflows/" (workflow.id) } { (workflow.id) } }
                        td { (workflow.label.as_deref().unwrap_or("")) }
                        td { (state_badge(workflow.state.as_str())) }
                        td.bar { (progress_bar(fraction_ended(workflow), &format!("workflow {} progress", workflow.id), &parts(workflow))) }
                        td.num { (workflow.counts.ended()) " / " (workflow.counts.total) }
                        td.num { (workflow.counts.unsuccessful()) }
                        td { (time(Some(workflow.created_at), now)) }
                        td { (time(workflow.finished_at, now)) }
                    }
                }
            }))
        }
    }
}

/// One workflow: its graph, its counts and its steps.
pub fn workflow(context: &Context, workflow: &Workflow, now: DateTime<Utc>) -> Markup {
    html! {
        h1 { "Workflow " (workflow.id) " " (state_badge(workflow.state.as_str())) }
        @if let Some(label) = &workflow.label { p.lead { (label) } }
        (progress_bar(fraction_ended(workflow), "workflow progress", &parts(workflow)))
        section.cards aria-label="Steps by state" {
            div class="card state-total" { span.count { (workflow.counts.total) } span.label { "steps" } }
            @for (state, count) in &workflow.counts.by_state {
                div class={ "card state-" (state) } { span.count { (count) } span.label { (state) } }
            }
        }
        section aria-label="Graph" { div.graph { (graph(&workflow.steps)) } }
        @if layers(&workflow.steps) > 1 {
            p.scroll-hint { "The graph is wider than the screen: scroll it sideways." }
        }
        dl.facts {
            dt { "Created" } dd { (time(Some(workflow.created_at), now)) }
            @if workflow.cancelled_at.is_some() { dt { "Cancelled" } dd { (time(workflow.cancelled_at, now)) } }
            dt { "Finished" } dd { (time(workflow.finished_at, now)) }
        }
        h2 { "Steps" }
        (table(&[Head::Text("Step"), Head::Text("State"), Head::Text("Type"), Head::Number("Job"), Head::Text("After"), Head::Text("Ended")], html! {
            @for step in &workflow.steps {
                tr {
                    td { code { (step.name) } }
                    td {
                        (state_badge(step.state.as_str()))
                        @if let Some(error) = &step.error { " " span.warning-text { (error) } }
                        @if let Some(wait) = &step.wait {
                            @let shown = if context.sees_payloads { wait.describe(now) } else { wait.without_values().describe(now) };
                            div.wait { (if wait.ended_by.is_some() { "Waited for " } else { "Waits for " }) (shown) }
                            @if decidable(step) { (decision_buttons(context, workflow.id, step)) }
                        }
                    }
                    td { (step.job) }
                    td.num { @match step.job_id { Some(id) => a href={ "/jobs/" (id) } { (id) }, None => span.muted { "–" } } }
                    td.wrap { (after_text(step)) }
                    td { (time(step.ended_at, now)) }
                }
            }
        }))
    }
}

/// Whether a step waits, armed, for an event: what approve and reject send.
fn decidable(step: &WorkflowStep) -> bool {
    step.wait.as_ref().is_some_and(|w| w.key.is_some() && w.armed_at.is_some() && w.ended_by.is_none())
}

/// Approve and reject: each sends the event the step waits for, with the
/// decision in its payload; shown only in a signed-in session.
fn decision_buttons(context: &Context, workflow: i64, step: &WorkflowStep) -> Markup {
    html! {
        @if context.may_operate() {
            @for (decision, label, confirm) in [
                ("approve", "Approve", "Send the event this step waits for, approving it?"),
                ("reject", "Reject", "Send the event this step waits for, rejecting it?"),
            ] {
                form.inline method="post" action={ "/workflows/" (workflow) "/decide" } data-confirm=(confirm) {
                    (hidden_fields(context))
                    input type="hidden" name="step" value=(step.name);
                    input type="hidden" name="decision" value=(decision);
                    button type="submit" class=(if decision == "reject" { "decide-reject danger" } else { "decide-approve" }) {
                        (label)
                    }
                }
            }
        }
    }
}

/// The event approving or rejecting a waiting step sends: its key, and a
/// payload holding the fields its wait matches, `approved` and `by`; none
/// for a step that does not wait, armed, for an event.
pub fn decision_event(step: &WorkflowStep, approved: bool) -> Option<(String, serde_json::Value)> {
    let wait = step.wait.as_ref().filter(|_| decidable(step))?;
    let mut payload: serde_json::Map<String, serde_json::Value> =
        wait.matching.iter().map(|(field, value)| (field.clone(), value.clone().into())).collect();
    payload.insert("approved".into(), approved.into());
    payload.insert("by".into(), "dashboard".into());
    Some((wait.key.clone()?, payload.into()))
}

fn after_text(step: &WorkflowStep) -> String {
    let names: Vec<String> = step
        .after
        .iter()
        .map(|d| match d.if_failed {
            IfFailed::Cancel => d.step.clone(),
            policy => format!("{} ({})", d.step, policy.as_str()),
        })
        .collect();
    names.join(", ")
}

/// A box of the drawing: one step, or a wide layer's steps counted by state.
struct Node<'a> {
    layer: usize,
    row: usize,
    steps: Vec<&'a WorkflowStep>,
}

impl Node<'_> {
    fn x(&self) -> f64 {
        self.layer as f64 * (BOX_W + GAP_X)
    }

    fn y(&self) -> f64 {
        self.row as f64 * (BOX_H + GAP_Y)
    }

    /// The state that colours it: a lone step's own; of a group, the
    /// state of the step least far along (what it waits on), failures first.
    fn state(&self) -> &'static str {
        let unsuccessful = self.steps.iter().find(|s| s.state.is_final() && s.state.as_str() != "completed");
        unsuccessful.or_else(|| self.steps.iter().min_by_key(|s| s.state)).map_or("waiting", |s| s.state.as_str())
    }
}

/// A layer's boxes: a box per step, unless the layer is wider than
/// [`MAX_DRAWN_PER_LAYER`]; then steps named alike but for a number
/// (`thumb-1`, `thumb-2`, …) share a box, and if that is still too many,
/// the whole layer is one box.
fn boxes_of(steps: &[WorkflowStep], members: &[usize]) -> Vec<Vec<usize>> {
    if members.len() <= MAX_DRAWN_PER_LAYER {
        return members.iter().map(|&i| vec![i]).collect();
    }
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for &i in members {
        let stem = steps[i].name.trim_end_matches(|c: char| c.is_ascii_digit());
        match groups.iter_mut().find(|(s, _)| *s == stem) {
            Some((_, group)) => group.push(i),
            None => groups.push((stem, vec![i])),
        }
    }
    if groups.len() > MAX_DRAWN_PER_LAYER {
        return vec![members.to_vec()];
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// Each step's layer: one after its deepest dependency (steps come in
/// dependency order, so each is known when reached).
fn layer_of(steps: &[WorkflowStep]) -> Vec<usize> {
    let index: HashMap<&str, usize> = steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let mut layer_of = vec![0usize; steps.len()];
    for (i, step) in steps.iter().enumerate() {
        layer_of[i] =
            step.after.iter().filter_map(|d| index.get(d.step.as_str())).map(|&d| layer_of[d] + 1).max().unwrap_or(0);
    }
    layer_of
}

/// How many layers the graph draws.
fn layers(steps: &[WorkflowStep]) -> usize {
    layer_of(steps).into_iter().max().map_or(0, |deepest| deepest + 1)
}

/// The graph as an SVG: each step in the layer after its deepest
/// dependency, edges from each dependency to its dependent, each box
/// linking to its job once released.
fn graph(steps: &[WorkflowStep]) -> Markup {
    let index: HashMap<&str, usize> = steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let layer_of = layer_of(steps);
    let mut layers: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, &layer) in layer_of.iter().enumerate() {
        layers.entry(layer).or_default().push(i);
    }
    let mut nodes: Vec<Node> = Vec::new();
    let mut node_of = vec![0usize; steps.len()];
    for (&layer, members) in &layers {
        for (row, group) in boxes_of(steps, members).into_iter().enumerate() {
            for &i in &group {
                node_of[i] = nodes.len();
            }
            nodes.push(Node { layer, row, steps: group.iter().map(|&i| &steps[i]).collect() });
        }
    }
    let mut edges: Vec<(usize, usize, bool)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        for dep in &step.after {
            if let Some(&d) = index.get(dep.step.as_str()) {
                let edge = (node_of[d], node_of[i], dep.if_failed != IfFailed::Cancel);
                if !edges.contains(&edge) {
                    edges.push(edge);
                }
            }
        }
    }
    let width = nodes.iter().map(|n| n.x() + BOX_W).fold(0.0, f64::max) + 4.0;
    let height = nodes.iter().map(|n| n.y() + BOX_H).fold(0.0, f64::max) + 4.0;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "-2 -2 " (width) " " (height) } width=(width) height=(height)
            role="img" aria-label={ "The workflow's " (steps.len()) " steps and their dependencies" } {
            @for &(from, to, lenient) in &edges {
                @let (a, b) = (&nodes[from], &nodes[to]);
                @let (x1, y1, x2, y2) = (a.x() + BOX_W, a.y() + BOX_H / 2.0, b.x(), b.y() + BOX_H / 2.0);
                path class={ "edge" @if lenient { " lenient" } }
                    d={ "M" (x1) " " (y1) " C" (x1 + GAP_X / 2.0) " " (y1) " " (x2 - GAP_X / 2.0) " " (y2) " " (x2) " " (y2) } {}
            }
            @for node in &nodes {
                (node_box(node))
            }
        }
    }
}

fn node_box(node: &Node) -> Markup {
    let (x, y) = (node.x(), node.y());
    let (title, detail, link) = match node.steps.as_slice() {
        [step] => (
            clip(&step.name, 22),
            format!("{} · {}", step.job, step.state.as_str()),
            step.job_id.map(|id| format!("/jobs/{id}")),
        ),
        steps => {
            let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
            for step in steps {
                *by_state.entry(step.state.as_str()).or_default() += 1;
            }
            let counts: Vec<String> = by_state.iter().map(|(s, n)| format!("{n} {s}")).collect();
            let stem = steps[0].name.trim_end_matches(|c: char| c.is_ascii_digit());
            let alike = steps.iter().all(|s| s.name.trim_end_matches(|c: char| c.is_ascii_digit()) == stem);
            let title = if alike {
                format!("{}… ×{}", clip(stem, 16), steps.len())
            } else {
                format!("{} steps", steps.len())
            };
            (title, counts.join(", "), None)
        }
    };
    let full = node.steps.iter().map(|s| s.name.as_str()).take(50).collect::<Vec<_>>().join(", ");
    let shape = html! {
        g class={ "node state-" (node.state()) } {
            title { (full) }
            rect x=(x) y=(y) width=(BOX_W) height=(BOX_H) rx="6" {}
            text x=(x + 8.0) y=(y + 16.0) class="name" { (title) }
            text x=(x + 8.0) y=(y + 32.0) class="detail" { (clip(&detail, 31)) }
        }
    };
    match link {
        Some(href) => html! { a href=(href) { (shape) } },
        None => shape,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StepState;
    use crate::store::workflow::StepDependency;

    fn step(name: &str, state: StepState, after: &[&str]) -> WorkflowStep {
        WorkflowStep {
            name: name.into(),
            job: "work".into(),
            job_id: Some(1),
            state,
            after: after.iter().map(|s| StepDependency { step: s.to_string(), if_failed: IfFailed::Cancel }).collect(),
            error: None,
            ended_at: None,
            wait: None,
        }
    }

    #[test]
    fn a_diamond_is_drawn_in_three_layers_and_a_wide_fan_out_as_one_box() {
        let diamond = [
            step("a", StepState::Completed, &[]),
            step("b", StepState::Running, &["a"]),
            step("c", StepState::Failed, &["a"]),
            step("d", StepState::Waiting, &["b", "c"]),
        ];
        let svg = graph(&diamond).into_string();
        assert_eq!(svg.matches("<rect").count(), 4);
        assert_eq!(svg.matches("class=\"edge\"").count(), 4);
        assert!(svg.contains("state-failed"), "{svg}");
        let x_of_d = 2.0 * (BOX_W + GAP_X);
        assert!(svg.contains(&format!("x=\"{x_of_d}\"")), "d in the third layer: {svg}");

        let mut fan: Vec<WorkflowStep> = vec![step("root", StepState::Completed, &[])];
        fan.extend((0..999).map(|i| step(&format!("r{i}"), StepState::Completed, &["root"])));
        let names: Vec<String> = (0..999).map(|i| format!("r{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        fan.push(step("join", StepState::Available, &names));
        let svg = graph(&fan).into_string();
        assert_eq!(svg.matches("<rect").count(), 3, "root, the 999 as one box, the join");
        assert!(svg.contains("r… ×999"), "steps named alike, counted: {svg}");
        assert!(svg.contains("999 completed"), "{svg}");
        assert_eq!(svg.matches("class=\"edge\"").count(), 2, "edges between boxes, once each");
    }
}
