//! The model below the simulator's process state (`sim.rs`) and the exports (`driver/`): the
//! objects the driver API hands out handles to, as the simulator holds them.

pub mod memory;
pub mod module;
