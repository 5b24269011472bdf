//! Containers: what a runtime puts into a container that asks for a shared GPU and what binds
//! it to the daemon, one module for the three paths (`sharectl cdi generate`, `sharectl hook`,
//! `sharectl runtime`) and the two Kubernetes plugins, owned by none of their commands:
//! - [`inject`]: the one list of edits (the mounts, the preload file) and the node's layout;
//! - [`oci`]: the runtime's state and the bundle's `config.json`, typed (`oci-spec`);
//! - [`mount`]: bind mounts made safely inside a container's root, in its mount namespace;
//! - [`hook`]: what the OCI hook does at createRuntime and poststop;
//! - [`cdi`]: CDI specs (the node's, and one per Kubernetes allocation or claim);
//! - [`runtime`]: the runc wrapper's edit of a bundle, and runc's argv;
//! - [`bind`]: a Kubernetes allocation's or claim's settings bound to the container on the
//!   daemon, in one request.

pub mod bind;
pub mod cdi;
pub mod hook;
pub mod inject;
pub mod mount;
pub mod oci;
pub mod runtime;
