//! simgpu's modules stand on floors (ARCHITECTURE.md draws them), bottom up: what needs no
//! simulator (types, the image parser, the scheduler's pure core), the machine (configuration,
//! the shared state file), the model (`model/`: memory, modules, capture; `engine`), the
//! process's simulator (`sim`), and the exports (`driver/`, `nvml`). A module imports (by `use`
//! or by a `crate::`/`super::` path) only modules on its floor or below, and no two modules
//! import each other, directly or around a circle, except inside `ONE_FLOOR_CIRCLES`, each with
//! its reason. This test reads the sources and fails on any other, naming it. Test code
//! (`mod tests` blocks and `tests.rs` files) may reach any floor and is not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom up; a module is on the floor of the longest prefix listed (`driver` holds
/// `driver::graph::exec`). A new module must be placed here.
const FLOORS: &[&[&str]] = &[
    &["types", "log", "sched", "image", "integrity"],
    &["config", "shared", "cglimits"],
    &["model", "engine"],
    &["sim"],
    &["driver", "nvml", "stub"],
];

/// Modules whose submodules may import each other, with why. The circle is allowed inside
/// them only: an import from outside into one of them and back is still a cycle.
const ONE_FLOOR_CIRCLES: &[(&str, &str)] = &[(
    "driver",
    "the exports, one module per API group, call each other's helpers (cuMemFree frees pool, \
     managed, VMM and IPC memory; memory's copies reach arrays; a module load allocates its \
     globals; a launch reads the module's functions). None of them is below another.",
)];

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

/// The floor of module `m` (index into FLOORS).
fn floor(m: &str) -> Option<usize> {
    let within = |p: &str| m == p || m.starts_with(&format!("{p}::"));
    FLOORS.iter().position(|f| f.iter().any(|p| within(p)))
}

/// `driver::graph::exec` → `driver` (a module of ONE_FLOOR_CIRCLES stands for its submodules).
fn unit(m: &str) -> String {
    for (p, _) in ONE_FLOOR_CIRCLES {
        if m == *p || m.starts_with(&format!("{p}::")) {
            return p.to_string();
        }
    }
    m.to_string()
}

#[test]
fn every_module_is_on_a_floor_and_imports_only_down_or_across() {
    let graph = imports();
    assert!(graph.len() >= 30, "read only {} modules", graph.len());
    let mut wrong = Vec::new();
    for (a, deps) in &graph {
        let fa = floor(a).unwrap_or_else(|| panic!("module {a} is on no floor: add it to FLOORS"));
        for b in deps {
            let fb = floor(b).unwrap_or_else(|| panic!("module {b} is on no floor"));
            if fb > fa {
                wrong.push(format!("{a} (floor {fa}) imports {b} (floor {fb})"));
            }
        }
    }
    assert!(wrong.is_empty(), "imports up a floor: {wrong:#?}");
}

#[test]
fn modules_import_without_cycles() {
    // Modules of ONE_FLOOR_CIRCLES become one node each.
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, deps) in imports() {
        let e = graph.entry(unit(&a)).or_default();
        e.extend(deps.iter().map(|d| unit(d)));
    }
    for (a, deps) in graph.iter_mut() {
        deps.remove(a);
    }
    let reaches = |from: &str, to: &str| -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            if m == to {
                return true;
            }
            if seen.insert(m.clone()) {
                stack.extend(graph.get(&m).into_iter().flatten().cloned());
            }
        }
        false
    };
    let mut cycles = Vec::new();
    for (a, deps) in &graph {
        for b in deps {
            if reaches(b, a) {
                cycles.push(format!("{a} → {b} → … → {a}"));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles: {cycles:#?}\ngraph: {graph:#?}"
    );
}

#[test]
fn capture_is_model_and_the_graph_exports_are_a_leaf() {
    // Stream capture used to make driver/graph.rs the hub every export module imported; the
    // capture state is model::capture now, and nothing but graph's own files names driver::graph.
    let graph = imports();
    let users: Vec<&String> = graph
        .iter()
        .filter(|(m, deps)| {
            !m.starts_with("driver::graph") && deps.iter().any(|d| d.starts_with("driver::graph"))
        })
        .map(|(m, _)| m)
        .collect();
    assert!(
        users.is_empty(),
        "modules importing driver::graph: {users:?}"
    );
    assert!(
        graph["driver::memory"].contains("model::capture"),
        "the reader sees memory.rs ask model::capture whether a stream captures"
    );
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
