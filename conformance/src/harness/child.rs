//! The holder process of the process-level scenarios.
//!
//! The parent re-executes the test binary on the running test's own name with
//! `PALISADE_CONFORMANCE_CHILD` set; the same test function then plays the holder: it acquires,
//! announces its fence, and writes when told to. The parent freezes it with `SIGSTOP`, thaws
//! it with `SIGCONT`, or kills it with `SIGKILL`: a real process, its timers and connections
//! included, as in the chaos tests of the incident this project was built after.

use palisade_core::LockOptions;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_core::{FencedStore, FencedStoreExt, GrantFence, LockService, LockServiceExt, WriteBatch};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::harness::{Ctx, Failure};
use crate::{Namespace, Timing, attempt};

const ENV_CHILD: &str = "PALISADE_CONFORMANCE_CHILD";
const ENV_NS: &str = "PALISADE_CONFORMANCE_NS";
const ENV_RELAY: &str = "PALISADE_CONFORMANCE_RELAY";
const PREFIX: &str = "PALISADE-CHILD ";

/// What the child was asked to do, when this process is a child.
pub(crate) struct ChildRole {
    pub(crate) scenario: String,
    pub(crate) namespace: Namespace,
    pub(crate) relay: Option<SocketAddr>,
}

pub(crate) fn role() -> Option<ChildRole> {
    let scenario = std::env::var(ENV_CHILD).ok()?;
    let namespace = Namespace::from_name(&std::env::var(ENV_NS).ok()?);
    let relay = std::env::var(ENV_RELAY).ok().and_then(|a| a.parse().ok());
    Some(ChildRole { scenario, namespace, relay })
}

pub(crate) fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // libtest has already printed `test NAME ... ` without a newline: start a fresh line.
    let _ = writeln!(out, "\n{PREFIX}{line}");
    let _ = out.flush();
}

/// The holder: acquire, announce `acquired FENCE|-`, wait for `write` on stdin, write the
/// record `data` = `A` (with the fence if any), then report `wrote ok|stale P C|error KIND`,
/// whether its lost signal had fired, and how many stale-fence rejections it counted.
pub(crate) async fn hold_and_write<L, S>(ctx: &Ctx, lock: Arc<L>, store: Arc<S>, ns: &Namespace, timing: Timing)
where
    L: LockService + ?Sized,
    S: FencedStore,
{
    let Ok(key) = ns.key("paused") else { return say("error key") };
    let lease = match lock.lock(&key, LockOptions::ttl(timing.ttl).wait(Duration::from_secs(30))).await {
        Ok(lease) => lease,
        Err(e) => return say(&format!("error acquire {e}")),
    };
    say(&format!("acquired {}", lease.fence_if_any().map_or_else(|| "-".to_string(), |f| f.get().to_string())));
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    match stdin.next_line().await {
        Ok(Some(line)) if line == "write" => {}
        _ => return,
    }
    // Give the watchdog, which woke up together with us, a moment to fire.
    let lost = tokio::time::timeout(Duration::from_millis(100), lease.lost()).await.is_ok();
    let _ = ctx.take_counter(palisade_core::metrics::LOCK_FENCE_REJECTED_TOTAL);
    let batch = WriteBatch::new().put(ns.record("data"), b"A".to_vec()).put(ns.record("audit/A"), b"A".to_vec());
    let result = match lease.fence_if_any() {
        Some(fence) => store.write_fenced(&key, GrantFence::new(fence, lease.grant().grant_id()), &batch).await,
        None => store.apply_unfenced(&batch).await,
    };
    let rejected = ctx.take_counter(palisade_core::metrics::LOCK_FENCE_REJECTED_TOTAL).unwrap_or(0);
    let outcome = match result {
        Ok(()) => "ok".to_string(),
        Err(e) => match e.stale_fence_details() {
            Some((p, c)) => format!("stale {p} {c}"),
            None => format!("error {}", e.kind().as_str()),
        },
    };
    say(&format!("wrote {outcome} lost={lost} rejected={rejected}"));
}

/// The parent's handle on a holder process.
pub(crate) struct HolderProcess {
    child: Child,
    pid: Pid,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl HolderProcess {
    /// Starts the holder: this test binary, filtered to `ctx`'s test, in the child role.
    pub(crate) async fn spawn(ctx: &Ctx, ns: &Namespace, relay: Option<SocketAddr>) -> Result<Self, Failure> {
        let exe = attempt!(ctx, std::env::current_exe(), "locating the test binary");
        let mut cmd = Command::new(exe);
        cmd.args([ctx.test_name(), "--exact", "--nocapture", "--test-threads=1"])
            .env(ENV_CHILD, ctx.scenario())
            .env(ENV_NS, ns.name())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(addr) = relay {
            cmd.env(ENV_RELAY, addr.to_string());
        }
        let mut child = attempt!(ctx, cmd.spawn(), "spawning the holder process");
        let raw_pid = child.id().ok_or_else(|| ctx.fail("the holder process has no pid"))?;
        let pid = Pid::from_raw(attempt!(ctx, i32::try_from(raw_pid), "pid"));
        let stdin = child.stdin.take().ok_or_else(|| ctx.fail("no stdin pipe"))?;
        let stdout = child.stdout.take().ok_or_else(|| ctx.fail("no stdout pipe"))?;
        Ok(HolderProcess { child, pid, stdin, stdout: BufReader::new(stdout).lines() })
    }

    /// The next protocol line starting with `word`, skipping libtest's own output.
    pub(crate) async fn expect(&mut self, ctx: &Ctx, word: &str, within: Duration) -> Result<String, Failure> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let line = tokio::time::timeout_at(deadline, self.stdout.next_line()).await;
            let line = attempt!(ctx, line, format!("waiting for the holder to say `{word}`"));
            let line = attempt!(ctx, line, "reading the holder's output");
            let Some(line) = line else { return Err(ctx.fail(format!("the holder exited before saying `{word}`"))) };
            if let Some(rest) = line.find(PREFIX).map(|at| &line[at + PREFIX.len()..]) {
                if let Some(args) = rest.strip_prefix(word) {
                    return Ok(args.trim().to_string());
                }
                return Err(ctx.fail(format!("the holder said `{rest}`, expected `{word}`")));
            }
        }
    }

    /// Sends a command line to the holder.
    pub(crate) async fn tell(&mut self, ctx: &Ctx, line: &str) -> Result<(), Failure> {
        attempt!(ctx, self.stdin.write_all(format!("{line}\n").as_bytes()).await, "writing to the holder");
        attempt!(ctx, self.stdin.flush().await, "writing to the holder");
        Ok(())
    }

    /// Sends a signal to the holder.
    pub(crate) fn signal(&self, ctx: &Ctx, signal: Signal) -> Result<(), Failure> {
        kill(self.pid, signal).map_err(|e| ctx.fail(format!("sending {signal} to the holder: {e}")))
    }

    /// Waits for the holder to exit.
    pub(crate) async fn wait(mut self, ctx: &Ctx) -> Result<std::process::ExitStatus, Failure> {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
        Ok(attempt!(ctx, attempt!(ctx, status, "waiting for the holder to exit"), "holder exit status"))
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        // Thaw and kill: no frozen holder may outlive its test.
        let _ = kill(self.pid, Signal::SIGCONT);
        let _ = self.child.start_kill();
    }
}
