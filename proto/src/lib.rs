//! gRPC definitions shared by the kvroute sidecar and router.
//!
//! ```text
//! sidecar --Ingest.Report(stream WorkerReport)--> router
//!         <--------(stream IngestControl)--------
//! gateway --Picker.Pick / Report*---------------> router
//! ```
//!
//! The schema lives in `proto/kvroute.proto`; this crate only compiles it.

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("kvroute.v1");
}
