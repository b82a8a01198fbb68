//! kvroute's end-to-end pieces: process management for local deployments, the Kubernetes e2e
//! harness (real API server, a fake kubelet running mock workers as local processes), the
//! one-command demo and the routing benchmark.

pub mod bench;
pub mod demo;
pub mod harness;
pub mod local;
pub mod procs;
