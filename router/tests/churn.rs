//! Worker churn: 10,000 workers come and go (appear, stream a 2,000-block snapshot, take a
//! request, stream closes, discovery drops them). Afterwards the worker table, the index,
//! `/debug/workers` and the metric series hold only the live workers.

use std::time::Duration;

use kvroute_router::churn::Churn;
use kvroute_router::metrics::RouterMetrics;
use kvroute_router::state::{RouterConfig, RouterState};

const CYCLES: u64 = 10_000;
const BLOCKS: usize = 2_000;
const LIVE: usize = 3;

#[test]
fn ten_thousand_workers_come_and_go_and_only_the_live_ones_remain() {
    let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let cfg = RouterConfig {
        retire_after: Duration::ZERO,
        seed: 1,
        ..RouterConfig::default()
    };
    let state = RouterState::new(cfg, metrics).expect("state");
    let mut churn = Churn::new(state, LIVE, BLOCKS);
    let mut retired = 0;
    for i in 0..CYCLES {
        retired += churn.cycle(i);
    }
    assert_eq!(
        retired as u64, CYCLES,
        "every churned worker is retired once"
    );
    let s = churn.state();
    s.set_discovery_synced();
    let report = s.workers_report(std::time::Instant::now());
    let mut ids: Vec<String> = report.workers.iter().map(|w| w.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, churn.live_ids(), "/debug/workers");
    assert!(
        report
            .workers
            .iter()
            .all(|w| w.routable && w.index_blocks == BLOCKS as u64)
    );
    assert_eq!(report.index_pairs, (LIVE * BLOCKS) as u64, "index pairs");
    assert_eq!(report.index_distinct_blocks, LIVE * BLOCKS, "index blocks");
    assert_eq!(report.in_flight, 0, "assignments released");
    assert_eq!(s.open_streams(), LIVE);
    s.refresh_gauges(std::time::Instant::now());
    let text = s.metrics().encode();
    assert!(
        !text.contains("pod-"),
        "no series of a retired worker:\n{text}"
    );
    assert!(
        text.contains(&format!("kvroute_router_workers_retired_total {CYCLES}")),
        "{text}"
    );
    assert!(
        text.contains("worker=\"live-0\""),
        "live workers keep their series"
    );
}
