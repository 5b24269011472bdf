//! A grid cut into block ranges.
//!
//! The cut is along the outermost dimension whose extent is above one (z, else y, else x): a range
//! of it holds whole planes (rows) of the inner dimensions, so the ranges, launched in order,
//! start blocks in the order their linear index `x + gx·(y + gy·z)` gives, as the whole launch
//! numbers them.

/// One range of a grid: the first block's index in the whole grid and the range's own grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub offset: [u32; 3],
    pub grid: [u32; 3],
}

/// How many ranges a kernel of `estimate_ns` needs so that each is at most `budget_ns`, at most
/// `max` (a budget of 0 asks for no slicing: one range).
pub fn pieces_for(estimate_ns: u64, budget_ns: u64, max: u32) -> u32 {
    if budget_ns == 0 {
        return 1;
    }
    let want = estimate_ns.div_ceil(budget_ns).max(1);
    u32::try_from(want).unwrap_or(u32::MAX).clamp(1, max.max(1))
}

/// `grid` cut into at most `pieces` ranges of nearly equal size (the first ones one plane larger),
/// fewer when the cut dimension is smaller than `pieces`. A grid with a zero extent gives no range.
pub fn plan(grid: [u32; 3], pieces: u32) -> impl Iterator<Item = Slice> {
    let empty = grid.contains(&0);
    let dim = (0..3).rev().find(|&d| grid[d] > 1).unwrap_or(0);
    let extent = grid[dim];
    let k = if empty { 0 } else { pieces.clamp(1, extent) };
    let (base, extra) = extent
        .checked_div(k)
        .map_or((0, 0), |base| (base, extent % k));
    (0..k).scan(0u32, move |start, i| {
        let len = base + u32::from(i < extra);
        let mut s = Slice {
            offset: [0; 3],
            grid,
        };
        s.offset[dim] = *start;
        s.grid[dim] = len;
        *start += len;
        Some(s)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn linear(grid: [u32; 3], b: [u32; 3]) -> u64 {
        u64::from(b[0])
            + u64::from(grid[0]) * (u64::from(b[1]) + u64::from(grid[1]) * u64::from(b[2]))
    }

    #[test]
    fn pieces() {
        assert_eq!(pieces_for(10_000_000, 2_000_000, 64), 5);
        assert_eq!(pieces_for(10_000_001, 2_000_000, 64), 6);
        assert_eq!(pieces_for(1_000, 2_000_000, 64), 1);
        assert_eq!(pieces_for(1 << 40, 1, 64), 64);
        assert_eq!(pieces_for(1 << 40, 0, 64), 1);
        assert_eq!(pieces_for(5, 1, 0), 1);
    }

    #[test]
    fn cuts_the_outermost_dimension() {
        let s: Vec<_> = plan([4, 3, 5], 2).collect();
        assert_eq!(
            s,
            [
                Slice {
                    offset: [0, 0, 0],
                    grid: [4, 3, 3]
                },
                Slice {
                    offset: [0, 0, 3],
                    grid: [4, 3, 2]
                },
            ]
        );
        let s: Vec<_> = plan([7, 1, 1], 3).collect();
        assert_eq!(s.iter().map(|s| s.grid[0]).collect::<Vec<_>>(), [3, 2, 2]);
        assert_eq!(plan([1, 1, 1], 8).count(), 1);
        assert_eq!(plan([0, 4, 1], 2).count(), 0);
    }

    proptest! {
        /// Every block of the grid runs exactly once, in the whole launch's linear order, in at
        /// most `pieces` ranges whose sizes differ by at most one plane.
        #[test]
        fn ranges_cover_the_grid_once_in_order(
            gx in 1u32..40, gy in 1u32..6, gz in 1u32..6, pieces in 1u32..50,
        ) {
            let grid = [gx, gy, gz];
            let slices: Vec<_> = plan(grid, pieces).collect();
            prop_assert!(!slices.is_empty() && slices.len() <= pieces as usize);
            let mut next = 0u64;
            for s in &slices {
                for z in 0..s.grid[2] {
                    for y in 0..s.grid[1] {
                        for x in 0..s.grid[0] {
                            let b = [x + s.offset[0], y + s.offset[1], z + s.offset[2]];
                            prop_assert!(b.iter().zip(grid).all(|(b, g)| *b < g));
                            prop_assert_eq!(linear(grid, b), next);
                            next += 1;
                        }
                    }
                }
            }
            prop_assert_eq!(next, u64::from(gx) * u64::from(gy) * u64::from(gz));
            let sizes: Vec<u64> = slices.iter().map(|s| s.grid.iter().map(|&g| u64::from(g)).product()).collect();
            let dim = (0..3).rev().find(|&d| grid[d] > 1).unwrap_or(0);
            let plane = next / u64::from(grid[dim]);
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(hi - lo <= plane, "sizes {:?}, plane {}", sizes, plane);
        }
    }
}
