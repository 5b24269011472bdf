//! Scenario benchmarks, run as real processes on simgpu. Each scenario returns its figures;
//! `simgpu-model` prints them as JSON and regenerates its section of BENCHMARKS.md, and the
//! crate's tests check generous sanity bounds on the same scenarios.

pub mod model;

use libshare_tests::SimGpu;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// A job program from `jobs/`, configured for `sim`.
pub fn job(sim: &SimGpu, name: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(libshare_tests::artifacts().bin(name));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    sim.configure(&mut cmd);
    cmd
}

/// The final JSON line of a finished job; panics with its stderr if it failed.
pub fn finish(child: Child, what: &str) -> Value {
    let out = child.wait_with_output().expect("wait for job");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["final"] == true)
        .unwrap_or_else(|| panic!("{what} printed no final line:\n{stdout}"))
}

/// Runs a job to completion; returns its final line and wall time in seconds.
pub fn run_job(sim: &SimGpu, name: &str, args: &[&str]) -> (Value, f64) {
    let t = Instant::now();
    let child = job(sim, name, args).spawn().expect("spawn job");
    let v = finish(child, name);
    (v, t.elapsed().as_secs_f64())
}

/// Median of `v` (NaN if empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A numeric field of a job's final line.
pub fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no numeric `{key}` in {v}"))
}
