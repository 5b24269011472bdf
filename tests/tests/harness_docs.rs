//! The documents name what exists (issue 34, build 6): every integration-test binary
//! (`tests/tests/*.rs`) has a row in `tests/README.md`; every workspace member and top-level
//! directory of code has a row in the README's Layout table, and every row of that table names
//! a directory that exists. A file added or removed without its row fails here, naming it.

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
    let cargo = read("Cargo.toml");
    let members = cargo
        .split("members = [")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .expect("Cargo.toml lists members");
    for m in members.split(',').map(|m| m.trim().trim_matches('"')) {
        let top = m.split('/').next().unwrap();
        assert!(
            rows.contains(&top),
            "README's Layout has no row for the workspace member {m}"
        );
    }
}
