//! `house-facts [ROOT]`: every workspace crate's files, lines of code, floors and circles as
//! `libshare_tests::house` reads them (issue 34's before and after: run it in two checkouts).

fn main() {
    let root = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(libshare_tests::workspace_root);
    let crates = libshare_tests::house::workspace(&root);
    if crates.is_empty() {
        eprintln!(
            "house-facts: no workspace crate under {}: give a checkout's root",
            root.display()
        );
        std::process::exit(2);
    }
    print!("{}", libshare_tests::house::report(&crates));
}
