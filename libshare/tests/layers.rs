//! libshare's modules are layers: no module imports (by `use` or by a `crate::` path) one that
//! imports it back, except `hooks` ↔ `procaddr` (`cuGetProcAddress` must hand out hooks). This
//! test reads the sources and fails on any other cycle, naming it.

use std::collections::{BTreeMap, BTreeSet};

/// Module → the crate modules its source names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        if name == "lib" {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        modules.insert(name, names(&src));
    }
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    for deps in modules.values_mut() {
        deps.retain(|d| known.contains(d));
    }
    for (m, deps) in modules.iter_mut() {
        deps.remove(m);
    }
    modules
}

/// Every `crate::a` path and every name in `use crate::{a, b::{..}}`.
fn names(src: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in src.match_indices("crate::") {
        let rest = &src[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: `{a, b::{c, d}, e}` → a, b, e.
            let (mut depth, mut start) = (0, 0);
            for (j, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident(group[start..j].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

#[test]
fn modules_import_only_downwards() {
    let graph = imports();
    assert!(graph.len() >= 15, "read only {} modules", graph.len());
    let allowed =
        |a: &str, b: &str| matches!((a, b), ("hooks", "procaddr") | ("procaddr", "hooks"));
    // Every cycle goes through an edge a → b with a path b →* a; report each such edge.
    let reaches = |from: &str, to: &str, skip: (&str, &str)| -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            if m == to {
                return true;
            }
            if !seen.insert(m.clone()) {
                continue;
            }
            for d in &graph[&m] {
                if (m.as_str(), d.as_str()) != skip && !allowed(&m, d) {
                    stack.push(d.clone());
                }
            }
        }
        false
    };
    let mut cycles = Vec::new();
    for (a, deps) in &graph {
        for b in deps {
            if !allowed(a, b) && reaches(b, a, ("", "")) {
                cycles.push(format!("{a} → {b} → … → {a}"));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles: {cycles:#?}\ngraph: {graph:#?}"
    );
    assert!(
        graph["hooks"].contains("procaddr") && graph["procaddr"].contains("hooks"),
        "the one allowed pair is still read"
    );
}

#[test]
fn the_reader_sees_paths_and_groups() {
    let n = names("use crate::{a, b::{c, d}, e};\nfn f() { crate::g::h(); }\n");
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        ["a", "b", "e", "g"],
        "a cycle through any of these would be caught"
    );
}
