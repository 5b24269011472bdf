//! simgpu's modules stand on floors (ARCHITECTURE.md draws them): the model (`model/`, `engine`,
//! `shared`, `sched`, `config`, `image`) below the process state (`sim`), below the exports
//! (`driver/`, `nvml`, `export_tables`). No module imports (by `use` or by a `crate::`/`super::`
//! path) one that imports it back, except the pairs in `ALLOWED`, each with its reason. This test
//! reads the sources and fails on any other cycle, naming it. Test code (`mod tests` blocks and
//! `tests.rs` files) may reach any floor and is not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The import pairs allowed to point at each other, with why.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// `driver/graph/exec.rs` → `driver::graph::exec`; `driver/mod.rs` → `driver`.
fn module_name(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_str().unwrap().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

fn sources(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, root, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(root).unwrap();
        if rel == Path::new("lib.rs") || path.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        // The unit tests at the end of a file are not part of its floor.
        let code = match src.find("#[cfg(test)]\nmod tests") {
            Some(i) => src[..i].to_string(),
            None => src,
        };
        out.insert(module_name(rel), code);
    }
}

/// Module → the crate modules its source names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut src = BTreeMap::new();
    sources(&root, &root, &mut src);
    let known: BTreeSet<String> = src.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (m, code) in &src {
        // `super::` of `a::b` is `a` (of `a::b` in `a/b/mod.rs` as well: both are module `a::b`).
        let parent = m.rsplit_once("::").map_or("", |p| p.0);
        let mut deps = BTreeSet::new();
        for path in paths(code, "crate::") {
            deps.extend(resolve(&path, &known));
        }
        for path in paths(code, "super::") {
            let full = if parent.is_empty() {
                path
            } else {
                format!("{parent}::{path}")
            };
            // `super::f` in a top-level-of-`a` file names `a` itself.
            deps.extend(resolve(&full, &known).or_else(|| {
                known
                    .contains(parent)
                    .then(|| parent.to_string())
                    .filter(|p| !p.is_empty())
            }));
        }
        deps.remove(m);
        graph.insert(m.clone(), deps);
    }
    graph
}

/// The longest known module that `a::b::c` starts with.
fn resolve(path: &str, known: &BTreeSet<String>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|p| known.contains(p))
}

/// Every path after `prefix`, with each top-level name of a `{a, b::{c, d}}` group: `a::b::c`.
fn paths(src: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let seg = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect::<String>()
            .trim_end_matches(':')
            .to_string()
    };
    for (i, _) in src.match_indices(prefix) {
        // `super::super::` is read from its first `super::`.
        if prefix == "super::" && src[..i].ends_with("super::") {
            continue;
        }
        let rest = &src[i + prefix.len()..];
        let head = seg(rest);
        let after = &rest[head.len()..];
        let group = after
            .strip_prefix("::{")
            .or_else(|| (head.is_empty()).then(|| rest.strip_prefix('{')).flatten());
        let Some(group) = group else {
            if !head.is_empty() {
                out.push(head);
            }
            continue;
        };
        let join = |name: &str| {
            if head.is_empty() {
                name.to_string()
            } else {
                format!("{head}::{name}")
            }
        };
        let (mut depth, mut start) = (0, 0);
        for (j, ch) in group.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.push(join(&seg(group[start..j].trim())));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(join(&seg(group[start..j].trim())));
                    start = j + 1;
                }
                _ => {}
            }
        }
    }
    out.retain(|p| !p.is_empty() && !p.ends_with("::"));
    out
}

fn allowed(a: &str, b: &str) -> bool {
    ALLOWED
        .iter()
        .any(|(x, y, _)| (a, b) == (*x, *y) || (a, b) == (*y, *x))
}

#[test]
fn modules_import_only_downwards() {
    let graph = imports();
    assert!(graph.len() >= 30, "read only {} modules", graph.len());
    let reaches = |from: &str, to: &str| -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            if m == to {
                return true;
            }
            if !seen.insert(m.clone()) {
                continue;
            }
            for d in graph.get(&m).into_iter().flatten() {
                if !allowed(&m, d) {
                    stack.push(d.clone());
                }
            }
        }
        false
    };
    let mut cycles = Vec::new();
    for (a, deps) in &graph {
        for b in deps {
            if !allowed(a, b) && reaches(b, a) {
                cycles.push(format!("{a} → {b} → … → {a}"));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles: {cycles:#?}\ngraph: {graph:#?}"
    );
    for (a, b, why) in ALLOWED {
        assert!(
            graph[*a].contains(*b) && graph[*b].contains(*a),
            "allowed pair {a} ↔ {b} ({why}) is no longer a pair: remove it from ALLOWED"
        );
    }
}

#[test]
fn the_reader_resolves_paths_groups_and_super() {
    let p = paths(
        "use crate::{a, b::{c, d}, e};\nfn f() { crate::g::h(); }\nuse crate::x::{y, z::w};",
        "crate::",
    );
    assert_eq!(p, ["a", "b", "e", "g::h", "x::y", "x::z::w"]);
    let known: BTreeSet<String> = ["driver", "driver::graph", "sim"].map(String::from).into();
    assert_eq!(
        resolve("driver::graph::capturing", &known).as_deref(),
        Some("driver::graph")
    );
    assert_eq!(resolve("driver::run", &known).as_deref(), Some("driver"));
    assert_eq!(resolve("nowhere::x", &known), None);
    assert_eq!(
        module_name(Path::new("driver/graph/mod.rs")),
        "driver::graph"
    );
}
