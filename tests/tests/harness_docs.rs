//! The documents name what exists (issue 34, build 6): every integration-test binary
//! (`tests/tests/*.rs`) has a row in `tests/README.md`; every workspace member and top-level
//! directory of code has a row in the README's Layout table, and every row of that table names
//! a directory that exists; every module of every crate is named in the README's Layout or in
//! ARCHITECTURE.md, and every `*.rs` file the documents name exists. A file added or removed
//! without its row fails here, naming it.

use libshare_tests::workspace_root;

fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace_root().join(rel)).unwrap()
}

#[test]
fn every_test_binary_has_a_row_in_the_tests_readme() {
    let readme = read("tests/README.md");
    let mut missing = Vec::new();
    for f in std::fs::read_dir(workspace_root().join("tests/tests")).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "rs") {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            if !readme.contains(&format!("`{name}`")) {
                missing.push(name);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "tests/README.md has no row for {missing:?}"
    );
}

#[test]
fn the_layout_table_names_every_member_and_only_what_exists() {
    let readme = read("README.md");
    let layout = readme
        .split("\n## Layout\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README.md has a Layout section");
    let rows: Vec<&str> = layout
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split("/` |").next())
        .collect();
    for row in &rows {
        assert!(
            workspace_root().join(row).is_dir(),
            "README's Layout names {row}/, which does not exist"
        );
    }
    let members = libshare_tests::house::members(&workspace_root());
    assert!(!members.is_empty(), "Cargo.toml lists members");
    for m in &members {
        let top = m.split('/').next().unwrap();
        assert!(
            rows.contains(&top),
            "README's Layout has no row for the workspace member {m}"
        );
    }
}

/// The backticked words of a text (`a`, `src/b.rs`).
fn ticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Every `.rs` file under the workspace (target/ and dot-directories left out), relative.
fn rust_files() -> Vec<String> {
    fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if p.is_dir() {
                walk(&p, root, out);
            } else if name.ends_with(".rs") {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(&workspace_root(), &workspace_root(), &mut out);
    out
}

#[test]
fn every_module_is_named_in_the_layout_or_the_architecture() {
    let docs = format!("{}\n{}", read("README.md"), read("ARCHITECTURE.md"));
    let words: Vec<&str> = ticked(&docs);
    // A module is named when a backticked word holds it as a whole word: `registry`,
    // `hooks.rs`, `src/bench/`, `policy` (`libshare`, `time-slice`).
    let named = |m: &str| {
        words.iter().any(|w| {
            w.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|part| part == m)
        })
    };
    let mut missing = Vec::new();
    for c in libshare_tests::house::workspace(&workspace_root()) {
        let src = workspace_root().join(&c.dir).join("src");
        for e in std::fs::read_dir(&src).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let module = match name.strip_suffix(".rs") {
                Some(m) => m.to_string(),
                None if e.path().is_dir() && name != "bin" => name.clone(),
                None => continue,
            };
            if ["lib", "main", "tests"].contains(&module.as_str()) {
                continue;
            }
            if !named(&module) {
                missing.push(format!("{}/src/{name}", c.dir));
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "modules that neither README.md's Layout nor ARCHITECTURE.md names: {missing:?}"
    );
}

#[test]
fn every_rust_file_the_documents_name_exists() {
    let files = rust_files();
    let mut stale = Vec::new();
    for doc in ["README.md", "ARCHITECTURE.md", "tests/README.md"] {
        for w in ticked(&read(doc)) {
            if !w.ends_with(".rs") || w.contains(['*', ' ', '<']) {
                continue;
            }
            let exists = files
                .iter()
                .any(|f| f == w || f.ends_with(&format!("/{w}")));
            if !exists {
                stale.push(format!("{doc}: {w}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "files the documents name that do not exist: {stale:?}"
    );
}
