//! The modules import one way. A cycle between two modules (the workflow
//! host trait implemented on the sandbox's state, reaching into its
//! fields; SQLite entity files calling each other) means neither can be
//! read, changed or tested without the other; this suite fails when one
//! appears. It reads `src/` as a reader would: each file is a module, and
//! each `crate::`, `super::` or `self::` path outside comments and tests
//! is an edge to the module that defines what it names, through the
//! parents' re-exports (`pub use`). A module's own parents and children
//! are not edges: a parent declaring its children is not a cycle. Two
//! groups in the store were cycles when this was written ([`KNOWN`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module under `src/` by its path (`store::sqlite::job`), with its
/// source before its tests.
fn modules() -> BTreeMap<String, (bool, String)> {
    let mut found = BTreeMap::new();
    let mut folders = vec![Path::new("src").to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            // The binary's crate is the library's one user: not a module of it.
            if path.extension().is_none_or(|ext| ext != "rs") || path == Path::new("src/main.rs") {
                continue;
            }
            let relative = path.strip_prefix("src").unwrap().with_extension("");
            let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            let folder_module = matches!(parts.last().map(String::as_str), Some("mod" | "lib"));
            if folder_module {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Up to the test module; without comments (a URL in a string
            // is cut too, which names no module either).
            let code = text.split("#[cfg(test)]\nmod ").next().unwrap();
            let code: String = code.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n");
            found.insert(parts.join("::"), (folder_module, code));
        }
    }
    found
}

/// The module a path used in `module` names (the deepest known prefix),
/// and the segments after it.
fn named<'p>(
    module: &str,
    folder_module: bool,
    path: &'p str,
    known: &BTreeMap<String, (bool, String)>,
) -> Option<(String, Vec<&'p str>)> {
    let mut segments = path.split("::").peekable();
    let mut base: Vec<&str> = match segments.peek() {
        Some(&"crate") => Vec::new(),
        Some(&"self" | &"super") => {
            let mut here: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
            // A file's `self` is its own module, `super` its folder's.
            if !folder_module && segments.peek() == Some(&"super") {
                here.pop();
                segments.next();
            }
            here
        }
        _ => return None,
    };
    if segments.peek() == Some(&"crate") || segments.peek() == Some(&"self") {
        segments.next();
    }
    while segments.peek() == Some(&"super") {
        base.pop();
        segments.next();
    }
    let rest: Vec<&str> = segments.collect();
    (0..=rest.len()).rev().find_map(|n| {
        let candidate = base.iter().chain(&rest[..n]).copied().collect::<Vec<_>>().join("::");
        known.contains_key(&candidate).then(|| (candidate, rest[n..].to_vec()))
    })
}

/// What each module re-exports (`pub use`), by (module, name): the module
/// that defines it. `crate::store::Error` is `store::error`'s, not the
/// parent's, so an import through a re-export is an edge to its home.
fn reexports(known: &BTreeMap<String, (bool, String)>) -> BTreeMap<(String, String), String> {
    let mut found = BTreeMap::new();
    for (module, (folder_module, code)) in known {
        for statement in code.split(';') {
            let Some(used) = statement.trim_start().strip_prefix("pub use ").or_else(|| {
                let restricted = statement.trim_start().strip_prefix("pub(")?;
                restricted.split_once(") use ").map(|(_, used)| used)
            }) else {
                continue;
            };
            let used = used.trim();
            let rooted = if ["crate::", "self::", "super::"].iter().any(|root| used.starts_with(root)) {
                used.to_string()
            } else {
                format!("self::{used}")
            };
            let mut spelled = Vec::new();
            spell_out(&rooted, String::new(), &mut spelled);
            for path in spelled {
                let item = path.rsplit("::").next().unwrap().to_string();
                if let Some((home, _)) = named(module, *folder_module, &path, known) {
                    found.insert((module.clone(), item), home);
                }
            }
        }
    }
    found
}

/// The module a path used in `module` reaches, through re-exports.
fn reached(
    module: &str,
    folder_module: bool,
    path: &str,
    known: &BTreeMap<String, (bool, String)>,
    reexported: &BTreeMap<(String, String), String>,
) -> Option<String> {
    let (mut home, rest) = named(module, folder_module, path, known)?;
    if let Some(first) = rest.first() {
        // A chain of re-exports is followed a few steps at most.
        for _ in 0..4 {
            match reexported.get(&(home.clone(), first.to_string())) {
                Some(next) if *next != home => home = next.clone(),
                _ => break,
            }
        }
    }
    Some(home)
}

/// The paths in `code` that start at `crate`, `super` or `self`, a
/// braced group spelled out (`crate::a::{b, c::D}` is `crate::a::b` and
/// `crate::a::c::D`).
fn paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for root in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(root) {
            // Not the tail of a longer name or path (`super::super::`).
            if code[..at].chars().next_back().is_some_and(|c| word(c) || c == ':') {
                continue;
            }
            spell_out(&code[at..], String::new(), &mut found);
        }
    }
    found
}

fn word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The path at the start of `code`, after `prefix`, into `found`.
fn spell_out(code: &str, prefix: String, found: &mut Vec<String>) {
    let end = code.find(|c: char| !word(c) && c != ':').unwrap_or(code.len());
    let path = format!("{prefix}{}", &code[..end]);
    if !code[end..].starts_with('{') {
        found.push(path.trim_end_matches(':').to_string());
        return;
    }
    let mut depth = 0;
    let mut item_start = end + 1;
    for (i, c) in code[end..].char_indices().map(|(i, c)| (i + end, c)) {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                let item = code[item_start..].trim_start();
                if !item.starts_with(['}', ',']) {
                    spell_out(item, path.clone(), found);
                }
                item_start = i + 1;
                if c == '}' {
                    return;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
}

/// Each module's edges to modules neither its parent nor its child.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let known = modules();
    let reexported = reexports(&known);
    let related =
        |a: &str, b: &str| a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::")) || b.is_empty();
    known
        .iter()
        .map(|(module, (folder_module, code))| {
            let edges = paths(code)
                .into_iter()
                .filter_map(|used| reached(module, *folder_module, &used, &known, &reexported))
                .filter(|target| target != module && !related(module, target))
                .collect();
            (module.clone(), edges)
        })
        .collect()
}

/// The groups of modules that reach each other (Tarjan's strongly
/// connected components of more than one module).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, module: &'g str) {
            let at = self.index.len();
            self.index.insert(module, at);
            self.low.insert(module, at);
            self.stack.push(module);
            for next in &self.graph[module] {
                if !self.index.contains_key(next.as_str()) {
                    self.visit(next);
                    let low = self.low[module].min(self.low[next.as_str()]);
                    self.low.insert(module, low);
                } else if self.stack.contains(&next.as_str()) {
                    let low = self.low[module].min(self.index[next.as_str()]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == at {
                let split = self.stack.iter().position(|m| *m == module).unwrap();
                let group: Vec<String> = self.stack.split_off(split).into_iter().map(String::from).collect();
                if group.len() > 1 {
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for module in graph.keys() {
        if !walk.index.contains_key(module.as_str()) {
            walk.visit(module);
        }
    }
    walk.found
}

/// Cycles that were there when this suite was written, through the store's
/// re-exported types (`store::Error`, `store::JobState`, the enqueue's and
/// finish's plans): listed to be taken apart, not to grow. A group found
/// must lie inside one of these.
const KNOWN: &[&[&str]] = &[
    &["store::error", "store::fleet", "store::job"],
    &[
        "store::backend",
        "store::batch",
        "store::enqueue",
        "store::finish",
        "store::rate",
        "store::schedule",
        "store::workflow",
    ],
];

/// The groups found that no known cycle holds.
fn new_cycles(found: Vec<Vec<String>>) -> Vec<Vec<String>> {
    found
        .into_iter()
        .filter(|group| !KNOWN.iter().any(|known| group.iter().all(|m| known.contains(&m.as_str()))))
        .collect()
}

#[test]
fn no_two_modules_import_each_other() {
    let graph = imports();
    assert!(graph.len() > 100, "read every module: {}", graph.len());
    // The reader sees the edges the product has: a one-way import, and
    // one through a re-export (`super::Error` is `store::error`'s).
    assert!(graph["store::sqlite::batch"].contains("store::sqlite::job"), "{:?}", graph["store::sqlite::batch"]);
    assert!(graph["store::job"].contains("store::error"), "{:?}", graph["store::job"]);
    let found = new_cycles(cycles(&graph));
    assert!(found.is_empty(), "modules that import each other: {found:?}");
}

/// The reader finds a cycle when there is one, and a known group that
/// grows is a new cycle.
#[test]
fn a_cycle_is_found() {
    let mut graph = imports();
    graph.get_mut("store::sqlite::job").unwrap().insert("store::sqlite::batch".into());
    let found = new_cycles(cycles(&graph));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(&"store::sqlite::job".to_string()) && found[0].contains(&"store::sqlite::batch".to_string())
    );
    let mut graph = imports();
    graph.get_mut("store::error").unwrap().insert("store::lease".into());
    graph.get_mut("store::lease").unwrap().insert("store::job".into());
    assert_eq!(new_cycles(cycles(&graph)).len(), 1, "a module joining a known cycle");
}
