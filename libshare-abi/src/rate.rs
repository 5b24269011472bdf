//! The rate gate's word, defined once for the writer (the daemon's controller) and the readers
//! (opportunistic shims): `DeviceState::budget`, one atomic u64 per device of a container.
//!
//! ```text
//! bits 62..63  mode: 0 open (no limit), 1 paused (launch nothing new), 2 budget
//! bits 32..47  (budget) launches the container may have in flight (0 = no bound)
//! bits  0..31  (budget) GPU time the container may use in the current period, in µs
//! ```
//! 0 is "open", so a zeroed state (no daemon) never throttles anyone; production containers are
//! never given another word.

/// What the gate says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Launch freely.
    Open,
    /// Launch nothing new until the word changes.
    Paused,
    /// Launch while this period's GPU time lasts and fewer than `in_flight` launches (0: no
    /// bound) are outstanding.
    Budget { gpu_time_us: u32, in_flight: u16 },
}

const MODE_SHIFT: u32 = 62;
const IN_FLIGHT_SHIFT: u32 = 32;

impl Gate {
    pub fn encode(self) -> u64 {
        match self {
            Gate::Open => 0,
            Gate::Paused => 1 << MODE_SHIFT,
            Gate::Budget {
                gpu_time_us,
                in_flight,
            } => (2 << MODE_SHIFT) | (in_flight as u64) << IN_FLIGHT_SHIFT | gpu_time_us as u64,
        }
    }

    /// Any word decodes to some gate; an unknown mode is read as `Paused` (the safe side for
    /// an opportunistic job: a newer daemon's word never lets it run unbounded).
    pub fn decode(word: u64) -> Gate {
        match word >> MODE_SHIFT {
            0 => Gate::Open,
            2 => Gate::Budget {
                gpu_time_us: word as u32,
                in_flight: (word >> IN_FLIGHT_SHIFT) as u16,
            },
            _ => Gate::Paused,
        }
    }

    /// Whether a launch may go now, with `in_flight` launches outstanding and `used_us` of this
    /// period's GPU time spent.
    pub fn admits(self, in_flight: u32, used_us: u64) -> bool {
        match self {
            Gate::Open => true,
            Gate::Paused => false,
            Gate::Budget {
                gpu_time_us,
                in_flight: bound,
            } => used_us < gpu_time_us as u64 && (bound == 0 || in_flight < bound as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_zero_is_open() {
        assert_eq!(Gate::decode(0), Gate::Open);
        for g in [
            Gate::Open,
            Gate::Paused,
            Gate::Budget {
                gpu_time_us: 4_000,
                in_flight: 2,
            },
            Gate::Budget {
                gpu_time_us: u32::MAX,
                in_flight: u16::MAX,
            },
        ] {
            assert_eq!(Gate::decode(g.encode()), g);
        }
        assert_eq!(Gate::decode(3 << 62), Gate::Paused, "unknown modes pause");
    }

    #[test]
    fn a_budget_admits_while_time_and_window_last() {
        let g = Gate::Budget {
            gpu_time_us: 1_000,
            in_flight: 2,
        };
        assert!(g.admits(0, 0));
        assert!(g.admits(1, 999));
        assert!(!g.admits(2, 0), "window full");
        assert!(!g.admits(0, 1_000), "time spent");
        assert!(!Gate::Paused.admits(0, 0));
        assert!(Gate::Open.admits(u32::MAX, u64::MAX));
        let unbounded = Gate::Budget {
            gpu_time_us: 10,
            in_flight: 0,
        };
        assert!(unbounded.admits(1_000_000, 9));
    }
}
