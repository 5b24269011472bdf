//! Kernel slicing (issue 31, build 3): how an opportunistic kernel can be cut into block ranges so
//! that production, arriving while it runs, waits for one range instead of the whole kernel (the
//! mechanism Tally and LithOS use on real GPUs).
//!
//! Two pure parts, no FFI:
//! - [`ptx`] rewrites each `.entry` of a PTX module into a *sliced entry* that runs one block
//!   range of the original grid: the block index it reads is its own plus the range's offset, the
//!   grid size it reads is the whole grid's, both passed as six `.u32` parameters appended to the
//!   original ones. A kernel whose meaning depends on more than its block index and grid size
//!   (clusters, `%gridid`, a callee that reads the block index, module variables a second module
//!   would not share) is refused with the reason, and runs whole.
//! - [`plan`] cuts a grid into ranges along its outermost dimension, in the order the blocks are
//!   numbered, each range as small as the latency budget asks.
//!
//! What holds and what is assumed: a sliced launch runs the same blocks with the same
//! `blockIdx`/`gridDim` as the whole launch, one range after the other on the launch's stream.
//! That is the whole launch's meaning for every kernel whose blocks do not wait for blocks of a
//! *later* range (true of independent blocks, grid-stride loops, last-block reductions and
//! look-back scans, which wait only on earlier blocks); a kernel whose blocks wait for later ones
//! (a grid-wide barrier) must be launched cooperatively, and cooperative launches are never sliced.

pub mod plan;
pub mod ptx;

pub use plan::{pieces_for, plan, Slice};
pub use ptx::{rewrite, Kernel, Outcome, PtxError, Refusal, Rewritten};
