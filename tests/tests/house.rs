//! The house's rules (issue 34), read from the code by `libshare_tests::house` (files, the
//! arrows of their paths, circles, floors): no circle of files but the one the design allows,
//! no sharectl file over 800 lines of code, and the container code owing nothing to either
//! Kubernetes path. `cargo run -p libshare-tests --bin house-facts` prints the facts.

use libshare_tests::house::{workspace, Crate};
use libshare_tests::workspace_root;

fn crates() -> Vec<Crate> {
    let crates = workspace(&workspace_root());
    assert!(
        crates.iter().any(|c| c.dir == "sharectl"),
        "the workspace's crates were not found"
    );
    crates
}

#[test]
fn no_circle_but_the_allowed_one() {
    // `hooks` holds the table of hooked functions and `procaddr` answers cuGetProcAddress
    // from it while `hooks`' dlsym answers through `procaddr`: one concept in two files
    // (ARCHITECTURE.md).
    let allowed = ["libshare/src/hooks.rs", "libshare/src/procaddr.rs"];
    let mut found = Vec::new();
    for c in crates() {
        for circle in &c.circles {
            let names: Vec<&str> = circle.iter().map(|&f| c.files[f].path.as_str()).collect();
            if names != allowed {
                found.push(names.join(" <-> "));
            }
        }
    }
    assert!(found.is_empty(), "circles of files: {found:#?}");
}

#[test]
fn no_sharectl_file_over_800_lines_of_code() {
    let c = crates().into_iter().find(|c| c.dir == "sharectl").unwrap();
    let big: Vec<String> = c
        .files
        .iter()
        .filter(|f| f.code_lines > 800)
        .map(|f| format!("{} ({} lines of code)", f.path, f.code_lines))
        .collect();
    assert!(big.is_empty(), "split: {big:?}");
}

#[test]
fn sharectl_commands_are_its_top_floor() {
    // `commands/<subcommand>.rs` are thin layers over libraries: no module of sharectl below
    // them (containers/, bench/, demo/, gpu_check/, the admin client, the node view) uses one,
    // so container injection owes nothing to a Kubernetes command and the reverse.
    let c = crates().into_iter().find(|c| c.dir == "sharectl").unwrap();
    let is_command = |p: &str| p.starts_with("sharectl/src/commands/");
    let mut up = Vec::new();
    for f in &c.files {
        if is_command(&f.path) || f.path == "sharectl/src/main.rs" {
            continue;
        }
        for &u in &f.uses {
            if is_command(&c.files[u].path) {
                up.push(format!("{} uses {}", f.path, c.files[u].path));
            }
        }
    }
    assert!(up.is_empty(), "{up:#?}");
}
