//! kvroute's end-to-end pieces: process management for local deployments, the Kubernetes e2e
//! harness (real API server, a fake kubelet running mock workers as local processes), the
//! one-command demo, the routing benchmark, the seeded fault suite and the soak, and a black-box conformance suite for Gateway API
//! Inference Extension endpoint pickers ([`epp_conformance`]).

pub mod bench;
pub mod demo;
pub mod epp_conformance;
pub mod fault_proxy;
pub mod faults;
pub mod harness;
pub mod local;
pub mod procs;
pub mod soak;
