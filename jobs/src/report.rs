//! JSON-lines output on stdout.

use serde_json::{Map, Value};
use std::io::Write;
use std::time::{Duration, Instant};

/// Prints one JSON object per line, each with `"job"`, `"t"` (seconds since [`Reporter::new`])
/// and `"event"`.
pub struct Reporter {
    job: &'static str,
    start: Instant,
    /// `CLOCK_MONOTONIC` at `start`, seconds: lets a reader put several jobs on one time axis.
    mono_start: f64,
    interval: Duration,
    next: Instant,
}

impl Reporter {
    /// Starts the clock. `interval` is how often [`Reporter::due`] says a progress line is due
    /// (zero: never).
    pub fn new(job: &'static str, interval: Duration) -> Self {
        let start = Instant::now();
        Reporter {
            job,
            start,
            mono_start: libshare_abi::rate::now_s(),
            interval,
            next: start + interval,
        }
    }

    /// When the clock started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Seconds since the start.
    pub fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Whether a progress line is due now; if so, schedules the next one.
    pub fn due(&mut self) -> bool {
        if self.interval.is_zero() {
            return false;
        }
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        while self.next <= now {
            self.next += self.interval;
        }
        true
    }

    /// Seconds from the start to `at`.
    pub fn t_of(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    /// The `"start"` line (configuration, device), with `"mono_s"`: the monotonic clock at the
    /// start, so `t` of several jobs can be put on one axis.
    pub fn started(&self, fields: Value) {
        let mut fields = fields;
        if let Value::Object(o) = &mut fields {
            o.insert(
                "mono_s".into(),
                Value::from((self.mono_start * 1e6).round() / 1e6),
            );
        }
        self.emit("start", false, fields);
    }

    /// A trace line (`--trace`): `event` (e.g. `iter`) that ran from `begin` to `end`, as `"t"`
    /// and `"end"` in seconds since the start with µs precision, plus `fields`.
    pub fn trace(&self, event: &str, begin: Instant, end: Instant, fields: Value) {
        let mut m = Map::new();
        m.insert("job".into(), Value::from(self.job));
        m.insert("t".into(), Value::from(micros(self.t_of(begin))));
        m.insert("event".into(), Value::from(event));
        m.insert("end".into(), Value::from(micros(self.t_of(end))));
        if let Value::Object(o) = fields {
            m.extend(o);
        }
        self.write_line(&Value::Object(m).to_string());
    }

    /// A `"progress"` line.
    pub fn progress(&self, fields: Value) {
        self.emit("progress", false, fields);
    }

    /// The final summary line (`"final": true`).
    pub fn finish(&self, fields: Value) {
        self.emit("final", true, fields);
    }

    fn emit(&self, event: &str, is_final: bool, fields: Value) {
        self.write_line(&render(self.job, self.t(), event, is_final, fields));
    }

    fn write_line(&self, line: &str) {
        let mut out = std::io::stdout().lock();
        // A closed stdout (the reader went away) must not kill the job mid-run: ignore it.
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Seconds rounded to the microsecond (the times of a trace line).
pub fn micros(s: f64) -> f64 {
    (s * 1e6).round() / 1e6
}

/// Builds one output line: `job`, `t` (ms precision), `event`, optionally `final`, then the
/// fields of `fields` (an object; anything else is stored under `"value"`).
pub fn render(job: &str, t: f64, event: &str, is_final: bool, fields: Value) -> String {
    let mut m = Map::new();
    m.insert("job".into(), Value::from(job));
    m.insert("t".into(), Value::from((t * 1000.0).round() / 1000.0));
    m.insert("event".into(), Value::from(event));
    if is_final {
        m.insert("final".into(), Value::from(true));
    }
    match fields {
        Value::Object(o) => m.extend(o),
        Value::Null => {}
        other => {
            m.insert("value".into(), other);
        }
    }
    Value::Object(m).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn line_shape() {
        let l = render("train", 1.23456, "progress", false, json!({"iters": 3}));
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["job"], "train");
        assert_eq!(v["t"], 1.235);
        assert_eq!(v["event"], "progress");
        assert_eq!(v["iters"], 3);
        assert!(v.get("final").is_none());
        assert!(!l.contains('\n'));

        let f: Value =
            serde_json::from_str(&render("train", 2.0, "final", true, json!({}))).unwrap();
        assert_eq!(f["final"], true);
    }
}
