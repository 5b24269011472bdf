//! Small statistics helpers: percentiles and latency summaries.

use serde_json::{json, Value};

/// The `p`-th percentile (0–100) of already **sorted** samples, by the nearest-rank method:
/// the smallest sample such that at least `p` % of the samples are ≤ it. `p = 0` gives the
/// minimum, `p = 100` the maximum. `None` for no samples or a `p` outside 0–100.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// The `p`-th percentile of unsorted samples (sorts a copy). See [`percentile_sorted`].
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    let mut v = samples.to_vec();
    sort(&mut v);
    percentile_sorted(&v, p)
}

fn sort(v: &mut [f64]) {
    v.sort_by(|a, b| a.total_cmp(b));
}

/// Summary of a set of samples (e.g. latencies in ms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises the samples; `None` if there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        sort(&mut v);
        let p = |q| percentile_sorted(&v, q).unwrap_or(f64::NAN);
        Some(Summary {
            count: v.len(),
            min: v[0],
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: p(50.0),
            p90: p(90.0),
            p99: p(99.0),
            max: v[v.len() - 1],
        })
    }

    /// As a JSON object with values rounded to 3 decimals; `null` fields for no samples.
    pub fn to_json(summary: Option<Summary>) -> Value {
        match summary {
            Some(s) => json!({
                "count": s.count,
                "min": round3(s.min),
                "mean": round3(s.mean),
                "p50": round3(s.p50),
                "p90": round3(s.p90),
                "p99": round3(s.p99),
                "max": round3(s.max),
            }),
            None => json!({
                "count": 0, "min": null, "mean": null, "p50": null, "p90": null, "p99": null, "max": null,
            }),
        }
    }
}

/// Rounds to 3 decimals (for readable JSON).
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A rate over the time since the previous call: `(count - last_count) / (t - last_t)`.
#[derive(Debug, Default, Clone)]
pub struct RateWindow {
    last_t: f64,
    last_count: u64,
}

impl RateWindow {
    pub fn new(t: f64, count: u64) -> Self {
        RateWindow {
            last_t: t,
            last_count: count,
        }
    }

    /// Rate since the previous call (0 if no time passed), and starts a new window.
    pub fn tick(&mut self, t: f64, count: u64) -> f64 {
        let dt = t - self.last_t;
        let dc = count.saturating_sub(self.last_count);
        self.last_t = t;
        self.last_count = count;
        if dt > 0.0 {
            dc as f64 / dt
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(percentile_sorted(&v, 50.0), Some(50.0));
        assert_eq!(percentile_sorted(&v, 99.0), Some(99.0));
        assert_eq!(percentile_sorted(&v, 99.5), Some(100.0));
        assert_eq!(percentile_sorted(&v, 100.0), Some(100.0));
        // Classic nearest-rank example: {15, 20, 35, 40, 50}.
        let w = [15.0, 20.0, 35.0, 40.0, 50.0];
        assert_eq!(percentile_sorted(&w, 5.0), Some(15.0));
        assert_eq!(percentile_sorted(&w, 30.0), Some(20.0));
        assert_eq!(percentile_sorted(&w, 40.0), Some(20.0));
        assert_eq!(percentile_sorted(&w, 50.0), Some(35.0));
        assert_eq!(percentile_sorted(&w, 100.0), Some(50.0));
    }

    #[test]
    fn edge_cases() {
        assert_eq!(percentile_sorted(&[], 50.0), None);
        assert_eq!(percentile_sorted(&[7.0], 0.0), Some(7.0));
        assert_eq!(percentile_sorted(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile_sorted(&[1.0, 2.0], -1.0), None);
        assert_eq!(percentile_sorted(&[1.0, 2.0], 100.1), None);
        assert_eq!(percentile_sorted(&[1.0, 2.0], f64::NAN), None);
    }

    #[test]
    fn unsorted_input() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&v, 50.0), Some(3.0));
        assert_eq!(percentile(&v, 100.0), Some(5.0));
        // A single outlier shows in p99 only when it is more than 1 % of the samples.
        let mut w = vec![1.0; 99];
        w.push(100.0);
        assert_eq!(percentile(&w, 99.0), Some(1.0));
        assert_eq!(percentile(&w, 99.1), Some(100.0));
    }

    #[test]
    fn summary() {
        assert_eq!(Summary::of(&[]), None);
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.count, 4);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 4.0);
        assert_eq!(s.mean, 2.5);
        assert_eq!(s.p50, 2.0);
        assert_eq!(s.p99, 4.0);
        let j = Summary::to_json(Some(s));
        assert_eq!(j["p50"], 2.0);
        assert!(Summary::to_json(None)["p99"].is_null());
    }

    #[test]
    fn rate_window() {
        let mut w = RateWindow::new(0.0, 0);
        assert_eq!(w.tick(2.0, 100), 50.0);
        assert_eq!(w.tick(3.0, 130), 30.0);
        assert_eq!(w.tick(3.0, 130), 0.0);
    }
}

/// Gaps of a Poisson process of rate 1, from a seed: `next_gap` × the mean gap is the next
/// one. A SplitMix64 generator written here rather than `rand`'s: the same seed must give the
/// same arrival times in every version, so runs compared across commits replay the same load.
#[derive(Clone, Debug)]
pub struct Exponential {
    state: u64,
}

impl Exponential {
    pub fn new(seed: u64) -> Self {
        Exponential { state: seed }
    }

    /// A uniform draw in (0, 1].
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// The next gap, in units of the mean gap (exponentially distributed, mean 1).
    pub fn next_gap(&mut self) -> f64 {
        -self.uniform().ln()
    }
}

#[cfg(test)]
mod exponential_tests {
    use super::Exponential;

    #[test]
    fn gaps_have_mean_one_and_the_exponential_spread_and_replay_from_a_seed() {
        let mut e = Exponential::new(7);
        let gaps: Vec<f64> = (0..100_000).map(|_| e.next_gap()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
        // P(gap > 1) = 1/e for an exponential distribution.
        let over = gaps.iter().filter(|&&g| g > 1.0).count() as f64 / gaps.len() as f64;
        assert!(
            (over - (-1.0f64).exp()).abs() < 0.01,
            "P(gap > mean) {over}"
        );
        assert!(gaps.iter().all(|&g| g >= 0.0 && g.is_finite()));
        let mut again = Exponential::new(7);
        assert_eq!(again.next_gap(), gaps[0]);
        assert_ne!(Exponential::new(8).next_gap(), gaps[0]);
    }
}
