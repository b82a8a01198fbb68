//! Golden bytes of a `LoadSample` with per-GPU stats, and the compatibility promise of the
//! `gpus` field: a router built before it still reads `gpu`, and a sample from a sidecar built
//! before it decodes with no `gpus`.

mod support;
use kvroute_proto::v1::{GpuStats, LoadSample};
use prost::Message as _;
use support::{assert_golden, unhex};

const FIXTURE: &str = include_str!("golden/load_sample_gpus.hex");

fn gpu(index: u32, uuid: &str) -> GpuStats {
    GpuStats {
        utilization_percent: 97,
        memory_used_bytes: 40 << 30,
        memory_total_bytes: 48 << 30,
        temperature_celsius: 71,
        power_milliwatts: 290_000,
        sm_clock_mhz: 2_520,
        index,
        uuid: uuid.to_string(),
        throttle_reasons: 0x40,
        ecc_uncorrected_errors: 0,
        recent_xid: if index == 1 { 79 } else { 0 },
        xid_events: u64::from(index),
    }
}

fn sample() -> LoadSample {
    let gpus = vec![
        gpu(0, "GPU-00000000-1111-2222-3333-444444444444"),
        gpu(1, "GPU-55555555-6666-7777-8888-999999999999"),
    ];
    LoadSample {
        timestamp_ms: 1_764_590_000_000,
        num_requests_waiting: 2,
        num_requests_running: 5,
        kv_cache_usage: 0.5,
        gpu: gpus.first().cloned(),
        scrape_failed: false,
        kv_capacity_tokens: 52_000,
        gpus,
        lora_adapters: None,
    }
}

#[test]
fn load_sample_with_gpus_matches_the_golden_bytes() {
    assert_golden(&sample(), &unhex(FIXTURE));
}

/// `LoadSample` as routers before `gpus` knew it (fields 1 to 7).
#[derive(Clone, PartialEq, prost::Message)]
struct OldLoadSample {
    #[prost(uint64, tag = "1")]
    timestamp_ms: u64,
    #[prost(uint32, tag = "2")]
    num_requests_waiting: u32,
    #[prost(uint32, tag = "3")]
    num_requests_running: u32,
    #[prost(double, tag = "4")]
    kv_cache_usage: f64,
    #[prost(message, optional, tag = "5")]
    gpu: Option<OldGpuStats>,
    #[prost(bool, tag = "6")]
    scrape_failed: bool,
    #[prost(uint64, tag = "7")]
    kv_capacity_tokens: u64,
}

/// `GpuStats` before index, uuid, throttle, ECC and XID fields.
#[derive(Clone, PartialEq, prost::Message)]
struct OldGpuStats {
    #[prost(uint32, tag = "1")]
    utilization_percent: u32,
    #[prost(uint64, tag = "2")]
    memory_used_bytes: u64,
    #[prost(uint64, tag = "3")]
    memory_total_bytes: u64,
    #[prost(uint32, tag = "4")]
    temperature_celsius: u32,
    #[prost(uint32, tag = "5")]
    power_milliwatts: u32,
    #[prost(uint32, tag = "6")]
    sm_clock_mhz: u32,
}

#[test]
fn an_old_router_reads_the_first_gpu_and_skips_the_rest() {
    let old = OldLoadSample::decode(unhex(FIXTURE).as_slice()).unwrap();
    assert_eq!(old.num_requests_running, 5);
    assert_eq!(old.kv_capacity_tokens, 52_000);
    let gpu = old.gpu.expect("the first GPU in field 5");
    assert_eq!((gpu.utilization_percent, gpu.temperature_celsius), (97, 71));
}

#[test]
fn an_old_sidecar_sample_decodes_without_gpus() {
    let old = OldLoadSample {
        timestamp_ms: 7,
        num_requests_waiting: 1,
        gpu: Some(OldGpuStats {
            utilization_percent: 10,
            ..Default::default()
        }),
        ..Default::default()
    };
    let new = LoadSample::decode(old.encode_to_vec().as_slice()).unwrap();
    assert!(new.gpus.is_empty());
    assert_eq!(
        new.gpu.map(|g| (g.utilization_percent, g.uuid)),
        Some((10, String::new()))
    );
}

const LORA_FIXTURE: &str = include_str!("golden/load_sample_lora.hex");

fn lora_sample() -> LoadSample {
    use kvroute_proto::v1::{LoraAdapter, LoraAdapters};
    LoadSample {
        timestamp_ms: 1_764_590_000_000,
        num_requests_running: 1,
        lora_adapters: Some(LoraAdapters {
            adapters: vec![
                LoraAdapter {
                    name: "sql".into(),
                    base_model: "qwen3".into(),
                },
                LoraAdapter {
                    name: "chat-de".into(),
                    base_model: String::new(),
                },
            ],
        }),
        ..Default::default()
    }
}

#[test]
fn load_sample_with_lora_adapters_matches_the_golden_bytes() {
    assert_golden(&lora_sample(), &unhex(LORA_FIXTURE));
}

#[test]
fn an_old_router_skips_the_adapters_and_an_old_sidecar_sends_none() {
    let old = OldLoadSample::decode(unhex(LORA_FIXTURE).as_slice()).unwrap();
    assert_eq!(old.num_requests_running, 1);
    let from_old = OldLoadSample {
        timestamp_ms: 3,
        ..Default::default()
    };
    let new = LoadSample::decode(from_old.encode_to_vec().as_slice()).unwrap();
    assert_eq!(new.lora_adapters, None, "absent, not an empty list");
    // An empty list is present on the wire: the sidecar says "no adapter".
    let empty = LoadSample {
        lora_adapters: Some(Default::default()),
        ..Default::default()
    };
    let back = LoadSample::decode(empty.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back.lora_adapters, Some(Default::default()));
}
