//! Fuzzes the endpoint picker's reading of Envoy's ext_proc messages: arbitrary bytes decoded
//! as a `ProcessingRequest` (protobuf), then every part the picker reads mapped (request and
//! response header blocks, the subset hint, the served endpoint). Nothing may panic; a subset
//! admits each endpoint it lists; and the routing answers built for the hinted endpoints carry
//! the same destination in the header and in the dynamic metadata.
#![no_main]

use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingRequest;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use kvroute_router::epp::protocol::{self, BodyMode, Subset};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = ProcessingRequest::decode(data) else {
        return;
    };
    let metadata = req.metadata_context.as_ref();
    let head = match &req.request {
        Some(Request::RequestHeaders(h)) | Some(Request::ResponseHeaders(h)) => {
            protocol::head(h.headers.as_ref())
        }
        _ => protocol::Head::default(),
    };
    let _ = protocol::served(metadata, &head.headers);
    let Subset::Only(endpoints) = protocol::subset(metadata) else {
        return;
    };
    let subset = Subset::Only(endpoints.clone());
    for e in &endpoints {
        assert!(subset.admits(e), "{e:?} not admitted by its own subset");
    }
    if endpoints.is_empty() {
        return;
    }
    for mode in [BodyMode::FullDuplex, BodyMode::PerMessage] {
        let replies = protocol::destination_replies(mode, &endpoints, b"{}", true);
        let routed = replies
            .iter()
            .map(protocol::destination_of)
            .find(|(h, m)| h.is_some() || m.is_some())
            .expect("a routing answer");
        assert_eq!(routed.0, routed.1, "header and metadata disagree");
        assert_eq!(
            routed.0.as_deref(),
            Some(protocol::destination_value(&endpoints).as_str())
        );
    }
});
