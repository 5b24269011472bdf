//! libshare's node daemon as a library: `sharectl daemon` is a thin binary over it.
//!
//! - [`registry`]: the containers of a state directory (`<state dir>/containers/<name>/
//!   state.shm`), rescanned every 100 ms; each mapped read-write through `libshare_abi::State`.
//! - [`controller`]: the control loop: every period (default 5 ms, absolute deadlines on
//!   `CLOCK_MONOTONIC`), and at once when a production container begins or ends a busy phase
//!   (a futex wake from its shim, `futex_waitv`), read every container's counters into a
//!   [`policy::Snapshot`], call the pure policy, write the gates and refill the token buckets.
//! - [`policy`]: the pure sharing policy (`libshare` and the `time-slice` baseline), no I/O.
//! - [`view`]: a typed read-only snapshot of every container's state file (`sharectl status`,
//!   `sharectl top` and the metrics read through it).
//! - [`metrics`]: Prometheus metrics (`prometheus-client`) of the view and of the loop's
//!   [`controller::Health`], served on a localhost HTTP address and/or written to a textfile.
//!
//! Registration sockets, peer credentials, the admin socket, persistence and metrics come with
//! the node service; they plug in through [`registry::Registry`] (the set of containers) and
//! [`host::Host`] (the clock and sleeps).

pub mod admin;
pub mod authority;
pub mod book;
pub mod caps;
pub mod controller;
pub mod demote;
pub mod error;
pub mod host;
pub mod identity;
pub mod metrics;
pub mod nvml;
pub mod peer;
pub mod pins;
pub mod policy;
pub mod register;
pub mod registry;
pub mod server;
pub mod settings;
pub mod sockdiag;
pub mod turns;
pub mod view;

pub use controller::{run, Controller, ControllerConfig, RunStats};
pub use error::NodeError;
pub use policy::PolicyKind;
