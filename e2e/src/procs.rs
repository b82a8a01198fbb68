//! Child processes of local deployments (the demo, the live benchmark, the e2e fake kubelet).
//!
//! ```text
//! kvroute_exe() --spawn("mock-vllm", args)--> Child (own process group, killed on drop)
//!                                             wait_http_ok(url, deadline)
//! ```
//!
//! Every component runs as a subcommand of the single `kvroute` binary, so one build is enough
//! to start a whole deployment. Children are killed (SIGKILL to the process group) when their
//! [`Child`] is dropped, so a failing test or an interrupted demo leaves no processes behind.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Path of the `kvroute` binary: `$KVROUTE_EXE` if set; the running executable when it is
/// `kvroute` itself (the demo); otherwise `target/<profile>/kvroute` next to the running test
/// binary (cargo builds it for `cargo test --workspace`).
pub fn kvroute_exe() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVROUTE_EXE") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().context("cannot find the running executable")?;
    if me.file_stem().is_some_and(|s| s == "kvroute") {
        return Ok(me);
    }
    // target/debug/deps/<test>-<hash> -> target/debug/kvroute
    let mut dir = me.parent().map(Path::to_path_buf);
    while let Some(d) = dir {
        let candidate = d.join("kvroute");
        if candidate.is_file() {
            return Ok(candidate);
        }
        if d.file_name().is_some_and(|n| n == "target") {
            break;
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    bail!(
        "the `kvroute` binary was not found next to {}; build it (`cargo build -p kvroute-cli`) or set KVROUTE_EXE",
        me.display()
    )
}

/// A free TCP port on `ip` for a child to listen on, taken from just below the kernel's
/// ephemeral range and never handed out twice by this process.
///
/// Port 0 would give a port from the ephemeral range, which is also where every outgoing
/// connection (a sidecar dialling the router, a health poll) takes its source port: a port
/// picked that way could be taken by such a connection before the child bound it, and the
/// child failed with "address in use" once in a while. Another process may still take a port
/// first; callers that can pass `:0` to the child should prefer that.
pub fn free_port(ip: IpAddr) -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (lo, hi) = listen_range();
    let span = u32::from(hi - lo);
    // Start somewhere that depends on the process, so parallel test binaries spread out.
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + ((start + k) % span) as u16;
        if TcpListener::bind(SocketAddr::new(ip, port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port on {ip} between {lo} and {hi}")
}

/// Ports to hand out: up to 12,000 just below the ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`, 32768 when unreadable), never below 1024.
fn listen_range() -> (u16, u16) {
    let ephemeral_lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u16>().ok())
        })
        .unwrap_or(32_768);
    let hi = ephemeral_lo.max(2_048);
    (hi.saturating_sub(12_000).max(1_024), hi)
}

/// A free port on 127.0.0.1.
pub fn free_local_port() -> anyhow::Result<u16> {
    free_port(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A running child process. Killed with its whole process group when dropped.
pub struct Child {
    name: String,
    inner: tokio::process::Child,
    log: Option<PathBuf>,
}

impl Child {
    /// The name given at spawn time (for messages).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// OS process id, if still running.
    pub fn id(&self) -> Option<u32> {
        self.inner.id()
    }

    /// The file the child's stdout and stderr go to, if any.
    pub fn log_path(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// Returns the exit status if the child has exited.
    pub fn try_wait(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        Ok(self.inner.try_wait()?)
    }

    /// Sends SIGTERM and waits up to `grace` for the child to exit, then kills it.
    pub async fn stop(mut self, grace: Duration) -> anyhow::Result<()> {
        if let Some(pid) = self.inner.id() {
            signal(pid, "TERM");
            if tokio::time::timeout(grace, self.inner.wait()).await.is_ok() {
                return Ok(());
            }
        }
        self.kill_group();
        let _ = self.inner.wait().await;
        Ok(())
    }

    /// Kills the child's process group at once (SIGKILL) and waits for the child to exit.
    pub async fn kill(mut self) {
        self.kill_group();
        let _ = self.inner.wait().await;
    }

    /// Sends signal `sig` (a name `kill` understands: `"HUP"`, `"TERM"`) to the child.
    pub fn signal(&self, sig: &str) {
        if let Some(pid) = self.inner.id() {
            signal(pid, sig);
        }
    }

    /// Kills the child's process group at once.
    pub fn kill_group(&mut self) {
        if let Some(pid) = self.inner.id() {
            // Negative pid: the whole process group created by `spawn`.
            signal_group(pid, "KILL");
        }
        let _ = self.inner.start_kill();
    }

    /// The last `n` lines of the child's log (for error messages), backtrace frames left out
    /// so that the error above them shows.
    pub fn log_tail(&self, n: usize) -> String {
        let Some(path) = &self.log else {
            return String::new();
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !is_backtrace_frame(l)).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// `  12: some::function` or `             at src/file.rs:3:4`.
fn is_backtrace_frame(line: &str) -> bool {
    let t = line.trim_start();
    if t.len() == line.len() {
        return false;
    }
    t.starts_with("at ")
        || t.split_once(": ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// Options for [`spawn`].
#[derive(Clone, Debug, Default)]
pub struct SpawnOptions {
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Where stdout and stderr go; `None` discards them.
    pub log: Option<PathBuf>,
}

/// Starts `kvroute <subcommand> <args...>` in its own process group.
pub fn spawn_kvroute(
    name: &str,
    subcommand: &str,
    args: &[String],
    opts: &SpawnOptions,
) -> anyhow::Result<Child> {
    let exe = kvroute_exe()?;
    let mut full = vec![subcommand.to_string()];
    full.extend(args.iter().cloned());
    spawn(name, &exe, &full, opts)
}

/// Starts `program args...` in its own process group.
pub fn spawn(
    name: &str,
    program: &Path,
    args: &[String],
    opts: &SpawnOptions,
) -> anyhow::Result<Child> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    match &opts.log {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("create {}", dir.display()))?;
            }
            let out = std::fs::File::create(path)
                .with_context(|| format!("create {}", path.display()))?;
            let err = out.try_clone()?;
            cmd.stdout(out).stderr(err);
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    let inner = cmd
        .spawn()
        .with_context(|| format!("start {name}: {} {}", program.display(), args.join(" ")))?;
    Ok(Child {
        name: name.to_string(),
        inner,
        log: opts.log.clone(),
    })
}

/// Polls `url` until it answers 2xx or `timeout` passes. Fails early if `child` exits.
pub async fn wait_http_ok(
    url: &str,
    timeout: Duration,
    mut child: Option<&mut Child>,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(resp) = client.get(url).send().await
            && resp.status().is_success()
        {
            return Ok(());
        }
        if let Some(c) = child.as_deref_mut()
            && let Some(status) = c.try_wait()?
        {
            bail!(
                "{} exited ({status}) before {url} answered:\n{}",
                c.name(),
                c.log_tail(30)
            );
        }
        if Instant::now() >= deadline {
            let tail = child.map(|c| c.log_tail(30)).unwrap_or_default();
            bail!("{url} did not answer within {timeout:?}\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `check` until it returns `Ok(Some(v))` or `timeout` passes; the last error is reported.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            match last_err {
                Some(e) => bail!("timed out after {timeout:?} waiting for {what}: {e:#}"),
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `sig` (a name `kill` understands) to the process `pid`, ignoring failures.
pub fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn signal_group(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pid}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let (lo, hi) = listen_range();
        assert!(lo >= 1_024 && lo < hi, "{lo}..{hi}");
        let ports: Vec<u16> = (0..64)
            .map(|_| free_local_port().expect("a free port"))
            .collect();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "handed out twice: {ports:?}");
        for p in ports {
            assert!((lo..hi).contains(&p), "{p} outside {lo}..{hi}");
            TcpListener::bind(("127.0.0.1", p)).expect("still bindable");
        }
    }

    #[test]
    fn backtrace_frames_are_recognised() {
        assert!(is_backtrace_frame(
            "  14: tokio::runtime::Runtime::block_on"
        ));
        assert!(is_backtrace_frame("             at /src/main.rs:49:19"));
        assert!(!is_backtrace_frame(
            "Error: bind 127.0.0.1:8000: address in use"
        ));
        assert!(!is_backtrace_frame("    Caused by: x"));
        assert!(!is_backtrace_frame("12: not indented"));
    }
}
