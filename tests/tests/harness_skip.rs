//! The harness's `skip()` on a real prerequisite, promtool (what `daemon_metrics` checks
//! `/metrics` with), removed from `PATH`: outside CI the check prints `SKIP:` with the reason and
//! the test passes; under `CI=true` the test fails and names what is missing, so CI is never green
//! on a skipped check.

use std::process::{Command, Output};

#[test]
#[ignore = "run by the tests below in a child process, with an empty PATH"]
fn promtool_check_without_promtool() {
    libshare_tests::promtool_check("libshare_up 1\n", "a metric");
}

/// This test binary again, running only `promtool_check_without_promtool`, with an empty `PATH`
/// and `CI` set or not; its output, stdout then stderr.
fn without_promtool(ci: bool) -> (Output, String) {
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "promtool_check_without_promtool",
        "--nocapture",
    ])
    .env("PATH", empty.path());
    if ci {
        cmd.env("CI", "true");
    } else {
        cmd.env_remove("CI");
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

#[test]
fn under_ci_a_missing_prerequisite_fails_the_test_and_names_it() {
    let (out, text) = without_promtool(true);
    assert!(!out.status.success(), "passed under CI=true:\n{text}");
    assert!(
        text.contains(
            "cannot run under CI=true: promtool check of a metric: promtool not available"
        ),
        "{text}"
    );
}

#[test]
fn outside_ci_a_missing_prerequisite_prints_skip_and_the_reason() {
    let (out, text) = without_promtool(false);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("SKIP: promtool check of a metric: promtool not available"),
        "{text}"
    );
    assert!(text.contains("1 passed"), "the check did not run:\n{text}");
}
