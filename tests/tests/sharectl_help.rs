//! `sharectl`'s face: the help text of every subcommand and the exit codes of representative
//! invocations, held against golden files (`tests/golden/help/`), so that moving code around
//! (issue 34: sharectl as a thin CLI over libraries) cannot change what an operator sees or
//! what a script tests for.
//!
//! Every subcommand is found from `sharectl --help` itself (recursively): a new subcommand
//! without its golden file fails, and so does a golden file whose subcommand is gone. After a
//! deliberate change, `SHARECTL_HELP_BLESS=1` rewrites the files; review their diff.

use libshare_tests::artifacts;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn golden_dir() -> PathBuf {
    libshare_tests::workspace_root().join("tests/golden/help")
}

fn bless() -> bool {
    std::env::var("SHARECTL_HELP_BLESS").as_deref() == Ok("1")
}

fn sharectl(args: &[&str]) -> std::process::Output {
    Command::new(artifacts().bin("sharectl"))
        .args(args)
        .env("COLUMNS", "100")
        .env_remove("LIBSHARE_LOG")
        .output()
        .expect("run sharectl")
}

/// The subcommands a help text lists under `Commands:` (clap's layout: two spaces, the name,
/// spaces, its summary), `help` excepted.
fn listed(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if line == "Commands:" {
            inside = true;
            continue;
        }
        if inside {
            if !line.starts_with("  ") {
                break;
            }
            let name = line.split_whitespace().next().unwrap_or("");
            if !line.starts_with("   ") && !name.is_empty() && name != "help" {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// Compares (or, blessing, writes) one golden file.
fn check(file: &str, actual: &str, mismatches: &mut Vec<String>) {
    let path = golden_dir().join(file);
    if bless() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    match std::fs::read_to_string(&path) {
        Ok(expected) if expected == actual => {}
        Ok(expected) => mismatches.push(format!(
            "{file} differs:\n--- golden\n{expected}\n--- sharectl\n{actual}"
        )),
        Err(_) => mismatches.push(format!(
            "{file}: no golden file (new subcommand?)\n{actual}"
        )),
    }
}

#[test]
fn every_subcommands_help_is_its_golden_file() {
    let mut queue: Vec<Vec<String>> = vec![vec![]];
    let mut seen = BTreeSet::new();
    let mut mismatches = Vec::new();
    while let Some(path) = queue.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = sharectl(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "sharectl {}: {out:?}",
            args.join(" ")
        );
        let help = String::from_utf8(out.stdout).expect("help is UTF-8");
        let file = if path.is_empty() {
            "sharectl.txt".to_string()
        } else {
            format!("sharectl-{}.txt", path.join("-"))
        };
        check(&file, &help, &mut mismatches);
        seen.insert(file);
        for sub in listed(&help) {
            let mut p = path.clone();
            p.push(sub);
            queue.push(p);
        }
    }
    // `sharectl runtime --help` prints the wrapper's own options (above); `sharectl help
    // runtime` is clap's summary of the subcommand.
    let out = sharectl(&["help", "runtime"]);
    let help = String::from_utf8(out.stdout).unwrap();
    check("sharectl-help-runtime.txt", &help, &mut mismatches);
    seen.insert("sharectl-help-runtime.txt".into());
    let version = String::from_utf8(sharectl(&["--version"]).stdout).unwrap();
    check("sharectl-version.txt", &version, &mut mismatches);
    seen.insert("sharectl-version.txt".into());

    let exit = exit_codes();
    check("exit-codes.txt", &exit, &mut mismatches);
    seen.insert("exit-codes.txt".into());

    if !bless() {
        let on_disk: BTreeSet<String> = std::fs::read_dir(golden_dir())
            .expect("tests/golden/help")
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let stale: Vec<_> = on_disk.difference(&seen).collect();
        assert!(stale.is_empty(), "golden files of no subcommand: {stale:?}");
    }
    assert!(
        mismatches.is_empty(),
        "{}\n(after a deliberate change: SHARECTL_HELP_BLESS=1 and review the diff)",
        mismatches.join("\n\n")
    );
}

/// Representative invocations, each with its exit status and whether stderr is one
/// `sharectl:` line (a refusal) or clap's usage error: what scripts and runtimes test for.
fn exit_codes() -> String {
    let none = "/nonexistent/libshare-help-test";
    let cases: &[&[&str]] = &[
        &[],
        &["no-such-command"],
        &["set"],
        &["set", "web", "--memory", "1MiB", "--state-dir", none],
        &["set", "web", "--memory", "lots", "--state-dir", none],
        &["get", "web", "--state-dir", none],
        &["reset", "web", "--state-dir", none],
        &["status", "--state-dir", none],
        &["top", "--once", "--state-dir", none],
        &["health", "--state-dir", none],
        &["daemon", "--period", "0ms", "--state-dir", none],
        &["cdi", "generate", "--devices", "x"],
        &["hook", "--state-dir", none],
        &["runtime", "--", "frobnicate"],
        &["device-plugin", "--share", "0"],
        &["bench", "S0"],
        &["demo", "--duration", "0"],
    ];
    let mut out = String::new();
    for args in cases {
        let o = Command::new(artifacts().bin("sharectl"))
            .args(*args)
            .stdin(std::process::Stdio::null())
            .env_remove("LIBSHARE_LOG")
            .output()
            .expect("run sharectl");
        let err = String::from_utf8_lossy(&o.stderr);
        let kind =
            if err.starts_with("error:") || err.contains("\nUsage:") || err.starts_with("Usage:") {
                "usage"
            } else if err.lines().count() == 1 && err.starts_with("sharectl: ") {
                "one line"
            } else if err.is_empty() {
                "silent"
            } else {
                "other"
            };
        out.push_str(&format!(
            "sharectl {} -> {:?} ({kind})\n",
            args.join(" "),
            o.status.code()
        ));
    }
    out
}
