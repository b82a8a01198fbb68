//! Golden bytes of a Pick API answer with the p90 bound, and the compatibility promise of
//! `ttft_p90_bound_seconds` (field 9): a gateway built before it still reads every other
//! field, and an answer from a router built before it decodes with no bound (0).

mod support;
use kvroute_proto::v1::PickResponse;
use kvroute_proto::v1::pick_response::Destination;
use prost::Message as _;
use support::{assert_golden, unhex};

const FIXTURE: &str = include_str!("golden/pick_response_bound.hex");

fn answer() -> PickResponse {
    PickResponse {
        decision_id: "d-1".into(),
        destination: Some(Destination::WorkerAddress("10.0.0.7:8000".into())),
        worker_id: "default/w0".into(),
        rewritten_body: Some(br#"{"model":"m"}"#.to_vec()),
        predicted_ttft_seconds: 0.25,
        reason: "lowest_predicted_ttft".into(),
        degraded: true,
        ttft_p90_bound_seconds: 0.4,
    }
}

#[test]
fn pick_response_with_a_bound_matches_the_golden_bytes() {
    assert_golden(&answer(), &unhex(FIXTURE));
}

/// `PickResponse` as gateways before the bound knew it (fields 1 to 8).
#[derive(Clone, PartialEq, prost::Message)]
struct OldPickResponse {
    #[prost(string, tag = "1")]
    decision_id: String,
    #[prost(string, tag = "2")]
    worker_address: String,
    #[prost(string, tag = "4")]
    worker_id: String,
    #[prost(bytes = "vec", optional, tag = "5")]
    rewritten_body: Option<Vec<u8>>,
    #[prost(double, tag = "6")]
    predicted_ttft_seconds: f64,
    #[prost(string, tag = "7")]
    reason: String,
    #[prost(bool, tag = "8")]
    degraded: bool,
}

#[test]
fn old_gateways_read_the_answer_and_old_answers_have_no_bound() {
    let old = OldPickResponse::decode(&unhex(FIXTURE)[..]).expect("an old gateway decodes it");
    assert_eq!(old.worker_address, "10.0.0.7:8000");
    assert_eq!(old.predicted_ttft_seconds, 0.25);
    assert!(old.degraded);
    let from_old_router = PickResponse::decode(&old.encode_to_vec()[..]).expect("decodes");
    assert_eq!(from_old_router.ttft_p90_bound_seconds, 0.0);
    assert_eq!(
        from_old_router,
        PickResponse {
            ttft_p90_bound_seconds: 0.0,
            ..answer()
        }
    );
}
