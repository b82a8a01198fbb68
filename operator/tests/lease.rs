//! The lease loop against a mocked API server: it creates a missing Lease and leads; it follows
//! a live Lease held by someone else; a write conflict (409) never makes it lead; a leader
//! whose rounds hang steps down at its renew deadline.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use kube::client::Body;
use kvroute_operator::election::Elector;
use kvroute_operator::lease::LeaseLoop;
use kvroute_operator::metrics::OperatorMetrics;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason, "metadata": {}})
}

/// `existing`: the Lease the server holds (None: 404). `conflict`: answer every write with 409.
fn fake(existing: Option<Value>, conflict: bool) -> (Client, Arc<Mutex<Vec<String>>>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let recorded = calls.clone();
    tokio::spawn(async move {
        let mut handle = pin!(handle);
        let mut stored = existing;
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            recorded
                .lock()
                .push(format!("{method} {}", req.uri().path()));
            let body: Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap_or_default())
                    .unwrap_or(Value::Null);
            let resp = match (method.as_str(), &stored) {
                ("GET", Some(l)) => respond(StatusCode::OK, l),
                ("GET", None) => respond(StatusCode::NOT_FOUND, &status(404, "NotFound")),
                (_, _) if conflict => respond(StatusCode::CONFLICT, &status(409, "Conflict")),
                ("POST" | "PUT", _) => {
                    let mut l = body.clone();
                    l["metadata"]["resourceVersion"] = json!("2");
                    stored = Some(l.clone());
                    respond(StatusCode::OK, &l)
                }
                _ => respond(
                    StatusCode::METHOD_NOT_ALLOWED,
                    &status(405, "MethodNotAllowed"),
                ),
            };
            send.send_response(resp);
        }
    });
    (Client::new(service, "kvroute-system"), calls)
}

fn start(
    client: Client,
    id: &str,
) -> (
    watch::Receiver<bool>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let metrics = OperatorMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let (tx, rx) = watch::channel(false);
    let stop = CancellationToken::new();
    let lease = LeaseLoop::new(
        Api::<Lease>::namespaced(client, "kvroute-system"),
        "kvroute-operator".into(),
        Elector::new(id, Duration::from_secs(15)),
        tx,
        metrics,
    );
    let task = tokio::spawn(lease.run(stop.clone()));
    (rx, stop, task)
}

/// Waits (bounded) until the call log has at least `n` entries.
async fn calls_at_least(calls: &Arc<Mutex<Vec<String>>>, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while calls.lock().len() < n {
            // Poll (bounded by the timeout); under paused time this lets the clock advance.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("calls in time");
}

#[tokio::test]
async fn creates_a_missing_lease_and_leads() {
    let (client, calls) = fake(None, false);
    let (mut rx, stop, task) = start(client, "op-a");
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|l| *l))
        .await
        .expect("leads in time")
        .expect("open");
    assert!(calls.lock().iter().any(|c| {
        c.starts_with("POST /apis/coordination.k8s.io/v1/namespaces/kvroute-system/leases")
    }));
    stop.cancel();
    task.await.expect("stops");
    // On shutdown it releases the lease (read, then a PUT clearing the holder).
    assert!(
        calls.lock().last().is_some_and(|c| c.starts_with("PUT ")),
        "{:?}",
        calls.lock()
    );
}

// Paused time: the loop's sleeps between rounds advance instantly once everything is idle.
#[tokio::test(start_paused = true)]
async fn follows_a_live_lease_and_never_leads_on_conflict() {
    let held = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kvroute-operator", "namespace": "kvroute-system", "resourceVersion": "1"},
        "spec": {"holderIdentity": "op-a", "leaseDurationSeconds": 15, "renewTime": "2026-01-01T00:00:00.000000Z"}});
    let (client, calls) = fake(Some(held), false);
    let (rx, stop, task) = start(client, "op-b");
    calls_at_least(&calls, 3).await;
    assert!(!*rx.borrow());
    stop.cancel();
    task.await.expect("stops");
    assert!(
        calls.lock().iter().all(|c| c.starts_with("GET ")),
        "a follower only reads: {:?}",
        calls.lock()
    );

    let free = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kvroute-operator", "namespace": "kvroute-system", "resourceVersion": "7"},
        "spec": {}});
    let (client, calls) = fake(Some(free), true);
    let (rx, stop, task) = start(client, "op-b");
    // GET, PUT (409), then the next round's GET: the first round's outcome is published by now.
    calls_at_least(&calls, 3).await;
    assert!(!*rx.borrow(), "a conflicting write must not make it leader");
    stop.cancel();
    task.await.expect("stops");
}

/// Answers the first `answered` requests like `fake(None, false)`, then never answers (the
/// requests stay pending: a hung API server). Returns the request log.
fn hangs_after(answered: usize) -> (Client, Arc<Mutex<Vec<String>>>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let recorded = calls.clone();
    tokio::spawn(async move {
        let mut handle = pin!(handle);
        let mut pending = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            recorded
                .lock()
                .push(format!("{method} {}", req.uri().path()));
            if recorded.lock().len() > answered {
                pending.push(send);
                continue;
            }
            let body: Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap_or_default())
                    .unwrap_or(Value::Null);
            let resp = match method.as_str() {
                "GET" => respond(StatusCode::NOT_FOUND, &status(404, "NotFound")),
                _ => {
                    let mut l = body;
                    l["metadata"]["resourceVersion"] = json!("2");
                    respond(StatusCode::OK, &l)
                }
            };
            send.send_response(resp);
        }
    });
    (Client::new(service, "kvroute-system"), calls)
}

// Paused time: the clock jumps to the next timer once every task waits, so the deadlines
// below are exact and the test takes no wall time.
#[tokio::test(start_paused = true)]
async fn a_leader_whose_rounds_hang_steps_down_at_its_renew_deadline() {
    // GET (404) and POST (created): leading. Every later request hangs.
    let (client, calls) = hangs_after(2);
    let metrics = OperatorMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let (tx, mut rx) = watch::channel(false);
    let stop = CancellationToken::new();
    let lease = LeaseLoop::new(
        Api::<Lease>::namespaced(client, "kvroute-system"),
        "kvroute-operator".into(),
        Elector::new("op-a", Duration::from_secs(15)),
        tx,
        metrics,
    );
    let (renew_deadline, round_timeout) = (lease.renew_deadline(), lease.round_timeout());
    assert_eq!(renew_deadline, Duration::from_secs(10));
    assert!(round_timeout < renew_deadline);
    let t0 = tokio::time::Instant::now();
    let task = tokio::spawn(lease.run(stop.clone()));
    rx.wait_for(|l| *l).await.expect("leads");
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "the first round renewed at once"
    );

    // Round 2 (at the tick, 3 s) hangs and times out after `round_timeout` (8 s): the lease
    // is still ours by the deadline, so it keeps leading; at 10 s it must stop.
    // Bounded in virtual time: a leader that never steps down fails here instead of hanging.
    tokio::time::timeout(renew_deadline * 6, rx.wait_for(|l| !*l))
        .await
        .expect("steps down before six renew deadlines")
        .expect("steps down");
    assert_eq!(t0.elapsed(), renew_deadline, "stepped down at the deadline");

    // Afterwards it is a candidate again (reads, still hanging), never a leader.
    tokio::time::sleep(renew_deadline * 3).await;
    assert!(!*rx.borrow());
    assert!(
        calls.lock()[2..].iter().all(|c| c.starts_with("GET ")),
        "no write after the first create: {:?}",
        calls.lock()
    );
    stop.cancel();
    task.await.expect("stops");
}
