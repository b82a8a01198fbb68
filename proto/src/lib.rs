//! gRPC definitions shared by the kvroute sidecar and router.
//!
//! ```text
//! sidecar --Ingest.Report(stream WorkerReport)--> router
//!         <--------(stream IngestControl)--------
//! gateway --Picker.Pick / Report*---------------> router
//! router replica --Peers.Share(stream PeerUpdate)--> router replica
//! ```
//!
//! The schema lives in `proto/kvroute.proto`; this crate compiles it and says how large an
//! Ingest message may be ([`limits`]: the cap the router enforces and the splitting the
//! sidecar uses to stay within it).

pub mod limits;

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("kvroute.v1");
}
