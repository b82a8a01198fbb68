//! Component tests over real sockets on 127.0.0.1: a vLLM-shaped publisher (ZMQ PUB + ROUTER
//! replay) -> the sidecar -> a test Ingest receiver (the router's view of the worker).

#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{Publisher, Router, batch, cleared, removed, stored, wait_for};
use kvroute_hash::{chain, root_hash};
use kvroute_sidecar::hub::Hub;
use kvroute_sidecar::{Args, Running, start};

const MODEL: &str = "m";
const BS: u32 = 4;

fn args(p: &Publisher, routers: Vec<String>, queue_cap_blocks: usize) -> Args {
    Args {
        zmq_endpoint: p.pub_endpoint.clone(),
        zmq_bind: false,
        topic: String::new(),
        replay_endpoint: p.replay_endpoint.clone(),
        vllm_url: "http://127.0.0.1:9".into(),
        scrape_interval_ms: 200,
        routers,
        router_tls_dir: None,
        router_tls_server_name: String::new(),
        router_source_ip: None,
        tls_reload_interval_ms: 5_000,
        router_dns: None,
        router_dns_interval_ms: 10_000,
        worker_id: Some("ns/pod-0".into()),
        pod_name: "pod-0".into(),
        pod_namespace: "ns".into(),
        worker_address: "127.0.0.1:8000".into(),
        model: MODEL.into(),
        lora: None,
        lora_poll_interval_ms: 0,
        vllm_api_key: None,
        block_size: None,
        worker_set: "ws".into(),
        admin_addr: "127.0.0.1:0".parse().unwrap(),
        queue_cap_blocks,
        max_blocks_per_report: 64,
        replay_timeout_ms: 5_000,
        no_gpu: true,
        mock_gpus: 0,
        gpu_devices_file: String::new(),
    }
}

/// Tokens of block `i` of sequence `s` (distinct per block).
fn tokens(s: u32, blocks: std::ops::Range<u32>) -> Vec<u32> {
    blocks
        .flat_map(|b| (0..BS).map(move |t| s * 100_000 + b * BS + t))
        .collect()
}

/// vLLM-side hash of block `b` of sequence `s` (any unique number will do).
fn vh(s: u32, b: u32) -> u64 {
    (u64::from(s) << 32) | u64::from(b) | (1 << 63)
}

/// kvroute hashes the router computes for the first `n` blocks of sequence `s`.
fn kv(s: u32, n: u32) -> Vec<u64> {
    chain(root_hash(MODEL, None), &tokens(s, 0..n), BS as usize, &[])
}

async fn started(p: &mut Publisher, routers: Vec<String>, cap: usize) -> Running {
    let running = start(args(p, routers, cap)).await.unwrap();
    // Wait out ZMQ's slow joiner with empty batches; any that is lost is replayed.
    let m = running.metrics.clone();
    let start = tokio::time::Instant::now();
    while m.live_messages.get() == 0 {
        assert!(
            start.elapsed() < common::DEADLINE,
            "sidecar never subscribed"
        );
        p.publish(batch(vec![])).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    running
}

fn stored_blocks(s: u32, range: std::ops::Range<u32>) -> rmpv::Value {
    let parent = (range.start > 0).then(|| vh(s, range.start - 1));
    let hashes: Vec<u64> = range.clone().map(|b| vh(s, b)).collect();
    stored(&hashes, parent, &tokens(s, range), BS)
}

fn set(v: impl IntoIterator<Item = u64>) -> BTreeSet<u64> {
    v.into_iter().collect()
}

async fn converge(router: &Router, hub: &Arc<Hub>, expect: &BTreeSet<u64>) {
    wait_for("the router's view to match", || {
        let v = router.view.lock();
        v.blocks == *expect && set(hub.resident_set()) == *expect && v.epoch == Some(hub.epoch())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_is_replayed_without_resync() {
    let mut p = Publisher::start().await;
    let router = Router::start("127.0.0.1:0".parse().unwrap(), false).await;
    let running = started(&mut p, vec![router.url()], 1 << 20).await;
    let hub = running.hub.clone();
    let epoch = hub.epoch();

    p.publish(batch(vec![stored_blocks(1, 0..3)])).await;
    // Lost on the live stream (still in vLLM's replay buffer); the child chains on it.
    p.drop_live(batch(vec![stored_blocks(1, 3..5), removed(vh(1, 0))]));
    p.drop_live(batch(vec![stored_blocks(2, 0..2)]));
    p.publish(batch(vec![stored_blocks(1, 5..6)])).await;

    let all = kv(1, 6);
    let expect = set(all[1..].iter().copied().chain(kv(2, 2)));
    converge(&router, &hub, &expect).await;
    let m = &running.metrics;
    assert!(m.gaps.get() >= 1);
    assert!(m.replays.with_label_values(&["complete"]).get() >= 1);
    assert_eq!(
        m.unknown_parent.get(),
        0,
        "replayed parents placed the later blocks"
    );
    assert_eq!(m.resyncs.with_label_values(&["replay_failed"]).get(), 0);
    assert_eq!(hub.epoch(), epoch, "a replayed gap keeps the epoch");
    let v = router.view.lock();
    assert_eq!((v.seq_errors, v.first_report_not_snapshot), (0, 0));
    assert_eq!(v.block_size, BS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_beyond_the_replay_buffer_resyncs() {
    let mut p = Publisher::start().await;
    let router = Router::start("127.0.0.1:0".parse().unwrap(), false).await;
    let running = started(&mut p, vec![router.url()], 1 << 20).await;
    let hub = running.hub.clone();
    p.publish(batch(vec![stored_blocks(1, 0..2)])).await;
    converge(&router, &hub, &set(kv(1, 2))).await;
    let epoch = hub.epoch();

    let lost = p.drop_live(batch(vec![removed(vh(1, 1))]));
    p.forget_before(lost + 1);
    p.publish(batch(vec![stored_blocks(3, 0..1)])).await;
    // The removal is gone for good: drop everything, new epoch, keep what follows.
    converge(&router, &hub, &set(kv(3, 1))).await;
    assert!(hub.epoch() > epoch);
    let r = &running.metrics.resyncs;
    // The replay answers with a later seq than asked (lost) or falls short (failed).
    assert_eq!(
        r.with_label_values(&["replay_lost"]).get() + r.with_label_values(&["replay_failed"]).get(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_restart_starts_a_new_epoch() {
    let mut p = Publisher::start().await;
    let router = Router::start("127.0.0.1:0".parse().unwrap(), false).await;
    let running = started(&mut p, vec![router.url()], 1 << 20).await;
    let hub = running.hub.clone();
    p.publish(batch(vec![stored_blocks(1, 0..3)])).await;
    p.publish(batch(vec![stored_blocks(2, 0..1)])).await;
    converge(&router, &hub, &set(kv(1, 3).into_iter().chain(kv(2, 1)))).await;
    let epoch = hub.epoch();
    let snapshots = router.view.lock().snapshots;

    p.restart();
    p.publish(batch(vec![stored_blocks(4, 0..2)])).await;
    converge(&router, &hub, &set(kv(4, 2))).await;
    assert!(hub.epoch() > epoch, "new epoch after the restart");
    assert!(
        router.view.lock().snapshots > snapshots,
        "the router got a fresh snapshot"
    );
    assert_eq!(
        running
            .metrics
            .resyncs
            .with_label_values(&["vllm_restart"])
            .get(),
        1
    );
    // A prefix-cache reset is a delta (same epoch), not a resync.
    let epoch = hub.epoch();
    p.publish(batch(vec![cleared(), stored_blocks(5, 0..1)]))
        .await;
    converge(&router, &hub, &set(kv(5, 1))).await;
    assert_eq!(hub.epoch(), epoch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_restart_gets_a_fresh_snapshot() {
    let mut p = Publisher::start().await;
    let router = Router::start("127.0.0.1:0".parse().unwrap(), false).await;
    let url = router.url();
    let running = started(&mut p, vec![url.clone()], 1 << 20).await;
    let hub = running.hub.clone();
    p.publish(batch(vec![stored_blocks(1, 0..3)])).await;
    converge(&router, &hub, &set(kv(1, 3))).await;

    // The router asks for a snapshot (e.g. it saw a gap): it gets one on the same stream.
    router.request_snapshot().await;
    wait_for("a requested snapshot", || router.view.lock().snapshots >= 2).await;
    assert_eq!(router.view.lock().streams, 1);

    let addr = router.stop().await;
    // Changes while the router is down are not lost: the next stream starts with a snapshot.
    p.publish(batch(vec![removed(vh(1, 2)), stored_blocks(2, 0..2)]))
        .await;
    let router = Router::start(addr, false).await;
    let expect = set(kv(1, 2).into_iter().chain(kv(2, 2)));
    converge(&router, &hub, &expect).await;
    {
        let v = router.view.lock();
        assert_eq!(
            (v.snapshots, v.seq_errors, v.first_report_not_snapshot),
            (1, 0, 0)
        );
    }
    let connects = running.metrics.connects.with_label_values(&[&url]);
    wait_for("the second stream to be counted", || connects.get() >= 2).await;
}

/// mTLS: the sidecar presents its WorkerSet's certificate from the bound source address, and
/// after the files rotate to a new CA it reconnects with the new certificate, which is the
/// only one a restarted router (trusting the new CA alone) accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_streams_use_mtls_and_follow_a_rotation() {
    use kvroute_tls::testpki::{TestCa, write_dir};
    let tmp = tempfile::tempdir().unwrap();
    let (router_dir, sidecar_dir) = (tmp.path().join("router"), tmp.path().join("sidecar"));
    let ws = kvroute_tls::Identity::WorkerSet {
        namespace: "ns".into(),
        name: "ws".into(),
    };
    let router_id = kvroute_tls::Identity::Router {
        namespace: "ns".into(),
        pool: "p".into(),
    };
    let ca = TestCa::new("a");
    write_dir(
        &router_dir,
        &ca.leaf(Some(&router_id), &["localhost"]),
        &[&ca],
    );
    write_dir(&sidecar_dir, &ca.leaf(Some(&ws), &[]), &[&ca]);
    let server = kvroute_tls::WatchedServer::server(&router_dir).unwrap();
    let router = Router::start_tls("127.0.0.1:0".parse().unwrap(), server).await;
    let url = format!("http://localhost:{}", router.addr.port());

    let mut p = Publisher::start().await;
    let mut a = args(&p, vec![url], 1 << 20);
    a.router_tls_dir = Some(sidecar_dir.clone());
    a.router_tls_server_name = "localhost".into();
    a.router_source_ip = Some("127.0.0.9".parse().unwrap());
    a.tls_reload_interval_ms = 20;
    let running = start(a).await.unwrap();
    let m = running.metrics.clone();
    while m.live_messages.get() == 0 {
        p.publish(batch(vec![])).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let hub = running.hub.clone();
    p.publish(batch(vec![stored_blocks(1, 0..3)])).await;
    converge(&router, &hub, &set(kv(1, 3))).await;
    assert_eq!(
        router.view.lock().peer,
        Some((ws.uri(), "127.0.0.9".parse().unwrap()))
    );

    // Rotate to a new CA: the sidecar's files first (both CAs trusted), then the router
    // restarts trusting only the new CA. The sidecar's next connect uses its new files.
    let ca2 = TestCa::new("b");
    write_dir(&sidecar_dir, &ca2.leaf(Some(&ws), &[]), &[&ca, &ca2]);
    let addr = router.stop().await;
    write_dir(
        &router_dir,
        &ca2.leaf(Some(&router_id), &["localhost"]),
        &[&ca2],
    );
    let server = kvroute_tls::WatchedServer::server(&router_dir).unwrap();
    let router = Router::start_tls(addr, server).await;
    p.publish(batch(vec![stored_blocks(2, 0..2)])).await;
    let expect = set(kv(1, 3).into_iter().chain(kv(2, 2)));
    converge(&router, &hub, &expect).await;
    assert_eq!(
        router.view.lock().peer.as_ref().map(|p| p.0.clone()),
        Some(ws.uri())
    );
    // The files changed under the watch (possibly seen mid-write: then more than once).
    assert!(m.tls_reloads.with_label_values(&["reloaded"]).get() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_router_costs_bounded_memory_then_catches_up() {
    const CAP: usize = 256;
    let mut p = Publisher::start().await;
    let router = Router::start("127.0.0.1:0".parse().unwrap(), true).await;
    let url = router.url();
    let running = started(&mut p, vec![url.clone()], CAP).await;
    let hub = running.hub.clone();
    router.set_reading(false);

    // Churn: store 16 blocks, remove them again, many times over (the resident set stays small).
    // How much the transport absorbs before the sidecar's own queue fills (HTTP/2 windows,
    // socket buffers) depends on timing, so churn until the queue has overflowed at least
    // once (bounded), checking the cap after every batch.
    let mut max_queued = 0;
    let mut last = 10u32;
    for s in 10..20_000u32 {
        let mut events = vec![stored_blocks(s, 0..16)];
        if s > 10 {
            events.extend((0..16).map(|b| removed(vh(s - 1, b))));
        }
        p.publish(batch(events)).await;
        last = s;
        max_queued = max_queued.max(hub.queued_blocks(&url));
        assert!(hub.queued_blocks(&url) <= CAP, "queue stays under its cap");
        if s >= 810 && hub.overflows(&url) >= 1 {
            break;
        }
    }
    let m = &running.metrics;
    eprintln!(
        "max queued {max_queued}, overflows {}, stream failures {}, snapshots {}",
        hub.overflows(&url),
        m.connect_failures.with_label_values(&[&url]).get(),
        m.snapshots.with_label_values(&[&url]).get()
    );
    // The router stopped reading: the queue filled up to its cap and was coalesced.
    wait_for("the queue to overflow into a snapshot", || {
        hub.overflows(&url) >= 1
    })
    .await;

    // Once the router reads again, it converges on the current resident set.
    router.set_reading(true);
    converge(&router, &hub, &set(kv(last, 16))).await;
    assert!(
        running
            .metrics
            .queue_overflows
            .with_label_values(&[&url])
            .get()
            >= 1
            || hub.overflows(&url) >= 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_batch_larger_than_a_report_is_split() {
    let mut p = Publisher::start().await;
    let router = Router::start("127.0.0.1:0".parse().unwrap(), false).await;
    let running = started(&mut p, vec![router.url()], 1 << 20).await;
    let hub = running.hub.clone();
    wait_for("the first snapshot", || router.view.lock().snapshots >= 1).await;
    // One vLLM batch storing 300 blocks and evicting 5: more than `max_blocks_per_report`
    // (64) in one report, which the router would refuse above its message cap.
    p.publish(batch(vec![
        stored_blocks(1, 0..300),
        removed(vh(1, 0)),
        removed(vh(1, 1)),
        removed(vh(1, 2)),
        removed(vh(1, 3)),
        removed(vh(1, 4)),
    ]))
    .await;
    let expect = set(kv(1, 300)[5..].iter().copied());
    converge(&router, &hub, &expect).await;
    let v = router.view.lock();
    assert!(v.max_report_blocks <= 64, "{} blocks", v.max_report_blocks);
    assert_eq!(v.seq_errors, 0);
}
