//! The house as the code draws it (issue 34): for each crate of the workspace, its files, their
//! lines of code, and the arrows between them — file A uses file B when A names an item through
//! a path that reaches B's module (`crate::b::…`, `super::…`, `self::…`, or, in the crate's root,
//! a declared module by its bare name). `mod b;` is structure, not an arrow, and so is a module
//! naming its own descendants (a dispatch, a re-export); nothing under a `#[cfg(test)]` line
//! counts (unit tests reach back into their parent by design).
//!
//! From the arrows: the *circles* (strongly connected sets of two or more files) and the
//! *floors* (a file that uses no other file of its crate is on floor 1; any other is one above
//! the highest file it uses, a circle counting as one file). `tests/tests/house.rs` holds the
//! rules (no circle but the one the design allows, no oversized sharectl file);
//! `cargo run -p libshare-tests --bin house-facts [ROOT]` prints the facts of any checkout, so a
//! before and an after can be read the same way.
//!
//! It reads text, not the compiler's resolution: a path spelled through a `use` alias or a
//! glob import of a sibling's items is seen only where the alias or glob is written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file of a crate.
#[derive(Debug, Clone)]
pub struct File {
    /// Relative to the workspace root.
    pub path: String,
    /// Its module path inside the crate (`["bench", "s4"]`; empty for the crate's root).
    pub module: Vec<String>,
    /// Lines that are neither blank nor comments, above the file's first `#[cfg(test)]`.
    pub code_lines: usize,
    /// Indices (into the crate's files) of the files it uses.
    pub uses: BTreeSet<usize>,
}

/// One crate's files, arrows, circles and floors.
#[derive(Debug, Clone)]
pub struct Crate {
    /// The crate's directory relative to the workspace root (`sharectl`).
    pub dir: String,
    pub files: Vec<File>,
    /// Each circle's files (indices), two or more.
    pub circles: Vec<Vec<usize>>,
    /// Each file's floor (1 = uses nothing of its crate).
    pub floors: Vec<usize>,
}

impl Crate {
    /// The highest floor.
    pub fn height(&self) -> usize {
        self.floors.iter().copied().max().unwrap_or(0)
    }

    /// The number of arrows.
    pub fn arrows(&self) -> usize {
        self.files.iter().map(|f| f.uses.len()).sum()
    }
}

/// The workspace's members as `Cargo.toml` lists them (`members = [...]`).
pub fn members(root: &Path) -> Vec<String> {
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    let members = cargo
        .split("members = [")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap_or("");
    members
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The workspace's members, each read as a crate.
pub fn workspace(root: &Path) -> Vec<Crate> {
    members(root)
        .iter()
        .filter_map(|m| read_crate(root, m))
        .collect()
}

/// Reads one crate (`dir/src`), or `None` when it has no `src/`.
pub fn read_crate(root: &Path, dir: &str) -> Option<Crate> {
    let src = root.join(dir).join("src");
    if !src.is_dir() {
        return None;
    }
    let mut paths = Vec::new();
    collect(&src, &mut paths);
    // A `tests.rs` is a unit-test module kept in a file of its own.
    paths.retain(|p| p.file_name().is_none_or(|n| n != "tests.rs"));
    paths.sort();
    // A `src/bin/*.rs` file is a crate of its own: it reaches the library by the crate's
    // name, not by `crate::`; it is a file of the house on floor 1 of its own graph.
    let mut files: Vec<File> = paths
        .iter()
        .map(|p| File {
            path: p
                .strip_prefix(root)
                .unwrap_or(p)
                .to_string_lossy()
                .into_owned(),
            module: module_of(&src, p),
            code_lines: 0,
            uses: BTreeSet::new(),
        })
        .collect();
    let by_module: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .filter(|(_, f)| !is_bin(&f.path))
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let modules: BTreeSet<Vec<String>> = by_module.keys().cloned().collect();
    for (i, p) in paths.iter().enumerate() {
        if is_bin(&files[i].path) {
            files[i].code_lines = code_lines(&read_code(p));
            continue;
        }
        let text = read_code(p);
        files[i].code_lines = code_lines(&text);
        let here = files[i].module.clone();
        let mut uses = BTreeSet::new();
        for path in paths_in(&without_comments(&text)) {
            let target = resolve(&path, &here, &modules);
            if let Some(target) = target {
                if let Some(j) = longest_file(&by_module, &target) {
                    // A module naming its own children (dispatch, re-exports) is their
                    // structure, as `mod` is, not a use.
                    let child = files[j].module.starts_with(&here) && j != i;
                    if j != i && !child {
                        uses.insert(j);
                    }
                }
            }
        }
        files[i].uses = uses;
    }
    let circles = circles(&files);
    let floors = floors(&files, &circles);
    Some(Crate {
        dir: dir.to_string(),
        files,
        circles,
        floors,
    })
}

fn is_bin(path: &str) -> bool {
    path.contains("/src/bin/")
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` → `[a, b]`, `src/a/mod.rs` → `[a]`, `src/lib.rs` / `src/main.rs` → `[]`.
fn module_of(src: &Path, p: &Path) -> Vec<String> {
    let rel = p.strip_prefix(src).unwrap_or(p);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !(parts.is_empty() && (stem == "lib" || stem == "main")) && stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The file's text above its first `#[cfg(test)]` (unit tests are not part of the house).
fn read_code(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    match text.find("#[cfg(test)]") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Lines that are neither blank nor a comment.
pub fn code_lines(text: &str) -> usize {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count()
}

/// The text with every `//` comment cut (doc comments too: a link to another module is a
/// cross-reference, not a use).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path of two or more segments in the text (`a::b::c`). `use a::{b, c::d}` yields
/// `a::b` and `a::c::d`.
fn paths_in(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts = (c.is_ascii_alphabetic() || c == b'_')
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
            && (i < 2 || &bytes[i - 2..i] != b"::");
        if !starts {
            i += 1;
            continue;
        }
        let (segs, end) = path_at(bytes, i);
        expand(text, segs, end, &mut out);
        i = end.max(i + 1);
    }
    out
}

/// Pushes the path `segs` (ending at `end` in `text`) and, when a group `::{…}` follows, every
/// path of the group, groups within it included.
fn expand(text: &str, segs: Vec<String>, end: usize, out: &mut Vec<Vec<String>>) {
    if text[end..].starts_with("::{") {
        let close = matching_brace(text.as_bytes(), end + 2);
        let inside = &text[end + 3..close.min(text.len())];
        let mut from = 0;
        for item in split_top(inside) {
            let at = from + (item.len() - item.trim_start().len());
            from += item.len() + 1;
            let (inner, inner_end) = path_at(inside.as_bytes(), at);
            let mut p = segs.clone();
            p.extend(inner);
            expand(inside, p, inner_end, out);
        }
    }
    if segs.len() >= 2 {
        out.push(segs);
    }
}

/// The `::`-separated identifiers starting at `i`, and where they end.
fn path_at(bytes: &[u8], mut i: usize) -> (Vec<String>, usize) {
    let mut segs = Vec::new();
    loop {
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        if i == start {
            break;
        }
        segs.push(String::from_utf8_lossy(&bytes[start..i]).into_owned());
        if bytes[i..].starts_with(b"::")
            && bytes
                .get(i + 2)
                .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
        {
            i += 2;
        } else {
            break;
        }
    }
    (segs, i)
}

fn matching_brace(bytes: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (k, b) in bytes.iter().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    bytes.len()
}

/// Splits `b, c::{d, e}, f` at its top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (k, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    out.push(&s[from..]);
    out
}

/// A path as written in module `here` → the absolute module path it names, when it names
/// something of this crate.
fn resolve(
    path: &[String],
    here: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let first = path[0].as_str();
    let rest = &path[1..];
    match first {
        "crate" => Some(rest.to_vec()),
        "self" => {
            let mut p = here.to_vec();
            p.extend_from_slice(rest);
            Some(p)
        }
        "super" => {
            let mut base = here.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            base.extend_from_slice(rest);
            Some(base)
        }
        // A module declared in `here` is reached by its bare name (2018's uniform paths):
        // in the crate's root, `commands::set`; in `bench`, `s4::run`.
        _ => {
            let mut p = here.to_vec();
            p.extend_from_slice(path);
            modules.contains(&p[..=here.len()].to_vec()).then_some(p)
        }
    }
}

/// The file whose module is the longest prefix of `target`.
fn longest_file(by_module: &BTreeMap<Vec<String>, usize>, target: &[String]) -> Option<usize> {
    (1..=target.len())
        .rev()
        .find_map(|n| by_module.get(&target[..n]).copied())
}

/// Strongly connected sets of two or more files (Tarjan's algorithm).
fn circles(files: &[File]) -> Vec<Vec<usize>> {
    struct Walk<'a> {
        files: &'a [File],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    impl Walk<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in &self.files[v].uses {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    set.push(w);
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    self.out.push(set);
                }
            }
        }
    }
    let n = files.len();
    let mut walk = Walk {
        files,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if walk.index[v].is_none() {
            walk.visit(v);
        }
    }
    walk.out
}

/// Each file's floor: 1 when it uses nothing, else one above the highest it uses (a circle's
/// files share one floor).
fn floors(files: &[File], circles: &[Vec<usize>]) -> Vec<usize> {
    let n = files.len();
    let mut group: Vec<usize> = (0..n).collect();
    for c in circles {
        for &f in c {
            group[f] = c[0];
        }
    }
    let mut floor = vec![0usize; n];
    fn floor_of(
        g: usize,
        files: &[File],
        group: &[usize],
        floor: &mut Vec<usize>,
        visiting: &mut BTreeSet<usize>,
    ) -> usize {
        if floor[g] > 0 {
            return floor[g];
        }
        visiting.insert(g);
        let mut top = 0;
        for (f, file) in files.iter().enumerate() {
            if group[f] != g {
                continue;
            }
            for &w in &file.uses {
                let wg = group[w];
                if wg != g && !visiting.contains(&wg) {
                    top = top.max(floor_of(wg, files, group, floor, visiting));
                }
            }
        }
        visiting.remove(&g);
        floor[g] = top + 1;
        floor[g]
    }
    let mut visiting = BTreeSet::new();
    (0..n)
        .map(|f| floor_of(group[f], files, &group, &mut floor, &mut visiting))
        .collect()
}

/// The facts of every crate, as lines (what `house-facts` prints).
pub fn report(crates: &[Crate]) -> String {
    let mut s = String::new();
    let total_files: usize = crates.iter().map(|c| c.files.len()).sum();
    s.push_str(&format!("{} crates, {} files\n", crates.len(), total_files));
    for c in crates {
        let lines: usize = c.files.iter().map(|f| f.code_lines).sum();
        let biggest = c.files.iter().max_by_key(|f| f.code_lines);
        s.push_str(&format!(
            "\n{}: {} files, {} lines of code, {} arrows, {} floors, {} circles; largest {} ({})\n",
            c.dir,
            c.files.len(),
            lines,
            c.arrows(),
            c.height(),
            c.circles.len(),
            biggest.map(|f| f.path.as_str()).unwrap_or("-"),
            biggest.map(|f| f.code_lines).unwrap_or(0),
        ));
        for circle in &c.circles {
            let names: Vec<&str> = circle.iter().map(|&f| c.files[f].path.as_str()).collect();
            s.push_str(&format!("  circle: {}\n", names.join(" <-> ")));
        }
        let mut order: Vec<usize> = (0..c.files.len()).collect();
        order.sort_by_key(|&f| (std::cmp::Reverse(c.floors[f]), c.files[f].path.clone()));
        for f in order {
            let file = &c.files[f];
            s.push_str(&format!(
                "  floor {:>2}  {:>5}  {}\n",
                c.floors[f], file.code_lines, file.path
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn paths_and_groups_are_read() {
        let text = "use crate::a::{b, c::{d, e}};\nlet x = super::f::g(); // crate::h\n";
        let p = paths_in(text);
        assert!(p.contains(&s(&["crate", "a", "b"])));
        assert!(p.contains(&s(&["crate", "a", "c", "d"])));
        assert!(p.contains(&s(&["crate", "a", "c", "e"])));
        assert!(p.contains(&s(&["super", "f", "g"])));
        assert!(p.contains(&s(&["crate", "h"])));
    }

    #[test]
    fn super_and_self_resolve_against_the_module() {
        let modules: BTreeSet<Vec<String>> = [
            s(&["bench"]),
            s(&["bench", "s4"]),
            s(&["bench", "exec"]),
            s(&["cdi"]),
        ]
        .into();
        let here = s(&["bench", "s4"]);
        assert_eq!(
            resolve(&s(&["super", "exec", "run"]), &here, &modules),
            Some(s(&["bench", "exec", "run"]))
        );
        assert_eq!(
            resolve(&s(&["super", "super", "cdi"]), &here, &modules),
            Some(s(&["cdi"]))
        );
        assert_eq!(
            resolve(&s(&["self", "x"]), &here, &modules),
            Some(s(&["bench", "s4", "x"]))
        );
        assert_eq!(resolve(&s(&["std", "fs"]), &here, &modules), None);
        assert_eq!(
            resolve(&s(&["exec", "run"]), &s(&["bench"]), &modules),
            Some(s(&["bench", "exec", "run"]))
        );
        assert_eq!(
            resolve(&s(&["bench", "exec"]), &[], &modules),
            Some(s(&["bench", "exec"]))
        );
    }

    #[test]
    fn circles_and_floors() {
        let file = |uses: &[usize]| File {
            path: String::new(),
            module: vec![],
            code_lines: 0,
            uses: uses.iter().copied().collect(),
        };
        // 0 -> 1 <-> 2 -> 3
        let files = vec![file(&[1]), file(&[2]), file(&[1, 3]), file(&[])];
        let c = circles(&files);
        assert_eq!(c, vec![vec![1, 2]]);
        assert_eq!(floors(&files, &c), vec![3, 2, 2, 1]);
    }
}
