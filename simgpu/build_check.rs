//! The prototype check of `build.rs`, in its own file so that `tests/prototypes.rs` can show it
//! catching a mismatch: every `fn cuXxx(..)` / `fn cuXxx / cuXxx_ptsz(..)` under `src/` (the
//! `driver!` exports and the few plain `extern "C"` ones) against the declaration list.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// An implemented export: where it is written and its parameters (name, Rust type as written).
pub struct Impl {
    pub at: String,
    pub params: Vec<(String, String)>,
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// `a: T, b: *mut U` (the text between a signature's parentheses) as (name, type) pairs, split at
/// commas outside `<>`/`()` (a function pointer type has its own).
fn split_params(list: &str) -> Vec<(String, String)> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    let mut push = |p: &str| {
        let p = p.trim();
        if let Some((n, t)) = p.split_once(':') {
            let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
            out.push((n.trim().to_string(), t));
        }
    };
    for (i, c) in list.char_indices() {
        match c {
            '<' | '(' => depth += 1,
            '>' if !list[..i].ends_with('-') => depth -= 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    push(&list[start..]);
    out
}

/// Every `fn cuXxx(..)` and `fn cuXxx / cuXxx_ptsz(..)` in `dir`, with its parameters.
/// Returns the files read. `root`: what locations are given relative to.
pub fn scan_impls(root: &Path, dir: &Path, out: &mut BTreeMap<String, Impl>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files.extend(scan_impls(root, &p, out));
            continue;
        }
        if p.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap_or(&p);
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            let line_start = offset;
            offset += line.len();
            if line.trim_start().starts_with("//") {
                continue;
            }
            let Some(pos) = line.find("fn cu") else {
                continue;
            };
            // Names (`a / b`), then the parameter list up to its matching parenthesis.
            let mut rest = &text[line_start + pos + 3..];
            let mut names = Vec::new();
            loop {
                let name = ident(rest);
                names.push(name.to_string());
                rest = rest[name.len()..].trim_start();
                match rest.strip_prefix('/') {
                    Some(r) => rest = r.trim_start(),
                    None => break,
                }
            }
            let Some(list) = rest.strip_prefix('(') else {
                continue;
            };
            let mut depth = 1;
            let close = list
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map(|(i, _)| i)
                .expect("unbalanced parentheses in a driver signature");
            let params = split_params(&list[..close]);
            let lineno = text[..line_start].matches('\n').count() + 1;
            for name in names.into_iter().filter(|n| n.starts_with("cu")) {
                let at = format!("{}:{lineno}", rel.display());
                let params = params.clone();
                out.insert(name, Impl { at, params });
            }
        }
        files.push(p);
    }
    files
}

/// Each implemented export's parameters against the declaration list: count and types
/// (`shim_headers::check_params`). One line per mismatch, naming the export, the parameter and
/// both types.
pub fn check_prototypes(implemented: &BTreeMap<String, Impl>) -> Vec<String> {
    let mut errors = Vec::new();
    for (name, imp) in implemented {
        let Some(proto) = shim_headers::prototype(name).filter(|p| !p.is_empty()) else {
            continue; // not a driver export, or declared without a prototype
        };
        let types: Vec<&str> = imp.params.iter().map(|(_, t)| t.as_str()).collect();
        match shim_headers::check_params(name, &types) {
            Ok(()) => {}
            Err(shim_headers::ParamMismatch::Types(bad)) => {
                for (i, c, r) in bad {
                    errors.push(format!(
                        "{name} ({}): parameter {} `{}` is `{r}` but `{c}` in the declaration list",
                        imp.at,
                        i + 1,
                        imp.params[i].0
                    ));
                }
            }
            Err(e) => errors.push(format!("{name} ({}): {e}; declared {proto}", imp.at)),
        }
    }
    errors
}
