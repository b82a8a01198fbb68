//! The `kvroute-sidecar` binary under a real SIGTERM (what the kubelet sends when it stops a
//! worker pod): it closes its router stream gracefully (the router sees a clean end of
//! stream, not a reset) and exits with status 0.

#![cfg(unix)]

mod common;

use std::process::Stdio;

use common::{DEADLINE, Publisher, Router, wait_for};

#[tokio::test]
async fn sigterm_closes_the_router_stream_cleanly_and_exits_zero() {
    sigterm_ends_the_stream_cleanly(true).await;
}

/// SIGTERM while the call is still opening: the router has read the snapshot but not yet
/// answered. The stream still ends cleanly (this raced in a CI run: the sidecar dropped the
/// opening call, which resets the stream).
#[tokio::test]
async fn sigterm_while_the_stream_opens_still_ends_it_cleanly() {
    sigterm_ends_the_stream_cleanly(false).await;
}

async fn sigterm_ends_the_stream_cleanly(answering: bool) {
    let publisher = Publisher::start().await;
    let router = Router::start("127.0.0.1:0".parse().expect("addr"), false).await;
    router.set_answering(answering);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvroute-sidecar"))
        .args(["--zmq-endpoint", &publisher.pub_endpoint])
        .args(["--replay-endpoint", &publisher.replay_endpoint])
        .args(["--vllm-url", "http://127.0.0.1:9"])
        .args(["--router", &router.url()])
        .args(["--model", "m", "--worker-id", "ns/pod-0", "--no-gpu"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kvroute-sidecar");
    wait_for("the sidecar's snapshot", || {
        router.view.lock().snapshots >= 1
    })
    .await;

    let pid = child.id().expect("running");
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -TERM {pid}");
    // A router that answers late: the sidecar waits for it (within its close timeout).
    router.set_answering(true);
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("the sidecar exits after SIGTERM")
        .expect("wait");
    assert!(status.success(), "exit status {status:?}");

    wait_for("the stream's end", || {
        let v = router.view.lock();
        v.clean_ends + v.error_ends >= 1
    })
    .await;
    let v = router.view.lock();
    assert_eq!(
        (v.streams, v.clean_ends, v.error_ends),
        (1, 1, 0),
        "one stream, ended cleanly"
    );
}
