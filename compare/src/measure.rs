//! One way of measuring, used by `palisade compare` and by every benchmark in
//! `integration/benches`, so that their figures are produced by the same code.
//!
//! A [`Variant`] is a named cycle: one acquire + release through Palisade, or the raw server
//! operations it is compared with. The variants of one comparison run on the same keys (a task's
//! cycle `n` uses key `n % keys` of that task) and the same concurrency, each first in a warm-up
//! that is thrown away, then in rounds that take turns (interleaved), so that drift on a shared
//! machine hits every variant alike. A figure is the median over rounds with its min–max.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

/// What a cycle returns: nothing, or why it failed (a failed cycle ends the measurement).
pub type CycleResult = Result<(), String>;

/// A boxed future, as the closures of a [`Variant`] return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Where in a run a cycle is: its task, the key it uses, and how many cycles that task ran before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The task's index, `0..tasks`.
    pub task: usize,
    /// The key's index within the task, `0..keys`: the same for every variant.
    pub key: usize,
    /// How many cycles this task completed before this one.
    pub n: u64,
}

type CycleFn = dyn Fn(Slot) -> BoxFuture<CycleResult> + Send + Sync;
type HookFn = dyn Fn() -> BoxFuture<CycleResult> + Send + Sync;

/// One path to measure: a name and its cycle.
#[derive(Clone)]
pub struct Variant {
    /// How the reports name it.
    pub name: String,
    cycle: Arc<CycleFn>,
}

impl Variant {
    /// A variant whose cycle is `cycle(slot)`.
    pub fn new<F, Fut>(name: impl Into<String>, cycle: F) -> Variant
    where
        F: Fn(Slot) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = CycleResult> + Send + 'static,
    {
        Variant { name: name.into(), cycle: Arc::new(move |slot| Box::pin(cycle(slot))) }
    }

    fn run(&self, slot: Slot) -> BoxFuture<CycleResult> {
        (self.cycle)(slot)
    }
}

impl std::fmt::Debug for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variant").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Work run before each variant's turn in every round (not timed): etcd's benchmark compacts
/// the history here so every variant starts from the same server state.
#[derive(Clone)]
pub struct Hook(Arc<HookFn>);

impl Hook {
    /// A hook running `f()`.
    pub fn new<F, Fut>(f: F) -> Hook
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = CycleResult> + Send + 'static,
    {
        Hook(Arc::new(move || Box::pin(f())))
    }

    /// Runs the hook once, outside any measurement.
    pub async fn call(&self) -> CycleResult {
        (self.0)().await
    }

    async fn run(hook: Option<&Hook>) -> CycleResult {
        match hook {
            Some(h) => (h.0)().await,
            None => Ok(()),
        }
    }
}

/// How much to measure.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Sequential cycles per variant per round (latency).
    pub cycles: usize,
    /// Interleaved rounds.
    pub rounds: usize,
    /// One throughput window.
    pub window: Duration,
    /// Concurrent tasks of each throughput measurement.
    pub concurrency: Vec<usize>,
    /// Keys each task cycles over.
    pub keys: usize,
    /// Handoffs per variant per round.
    pub handoffs: usize,
}

impl Plan {
    /// The benchmarks' and `palisade compare`'s full plan: 1,000 cycles × 5 rounds, three 2-s
    /// windows at 1, 16 and 64 tasks, 200 handoffs × 3 rounds.
    pub fn full() -> Plan {
        Plan {
            cycles: 1000,
            rounds: 5,
            window: Duration::from_secs(2),
            concurrency: vec![1, 16, 64],
            keys: 16,
            handoffs: 200,
        }
    }

    /// A short plan for CI (`palisade compare --quick`): the same shape, fewer samples.
    pub fn quick() -> Plan {
        Plan {
            cycles: 100,
            rounds: 3,
            window: Duration::from_millis(200),
            concurrency: vec![1, 16, 64],
            keys: 16,
            handoffs: 15,
        }
    }
}

/// A figure over rounds: the median, and the lowest and highest round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// The median of the rounds.
    pub median: f64,
    /// The lowest round.
    pub min: f64,
    /// The highest round.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (empty: all zero).
    pub fn of(mut values: Vec<f64>) -> Spread {
        if values.is_empty() {
            return Spread { median: 0.0, min: 0.0, max: 0.0 };
        }
        values.sort_by(f64::total_cmp);
        Spread { median: values[values.len() / 2], min: values[0], max: values[values.len() - 1] }
    }

    /// The spread as a Markdown cell of whole numbers (rates): `median (min–max)`.
    pub fn rate_cell(&self) -> String {
        format!("{:.0} ({:.0}–{:.0})", self.median, self.min, self.max)
    }

    /// `self ÷ base` on medians (0 when the base is 0).
    pub fn ratio_to(&self, base: &Spread) -> f64 {
        if base.median > 0.0 { self.median / base.median } else { 0.0 }
    }
}

/// Latency figures of one variant, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// The variant's name.
    pub name: String,
    /// p50 of every round's samples pooled.
    pub p50_ms: f64,
    /// p99 of every round's samples pooled.
    pub p99_ms: f64,
    /// Each round's own p50: how stable the figure is.
    pub round_p50_ms: Spread,
    /// Every sample, sorted (for charts).
    #[serde(skip)]
    pub samples_ms: Vec<f64>,
}

impl Latency {
    fn of(name: &str, rounds: Vec<Vec<Duration>>) -> Latency {
        let round_p50 = rounds.iter().map(|r| percentile(&sorted_ms(r), 50)).collect();
        let all: Vec<Duration> = rounds.into_iter().flatten().collect();
        let samples = sorted_ms(&all);
        Latency {
            name: name.to_string(),
            p50_ms: percentile(&samples, 50),
            p99_ms: percentile(&samples, 99),
            round_p50_ms: Spread::of(round_p50),
            samples_ms: samples,
        }
    }

    /// Two Markdown cells: `p50 (lowest–highest round p50) | p99`, in milliseconds.
    pub fn cells(&self) -> String {
        format!("{:.3} ({:.3}–{:.3}) | {:.3}", self.p50_ms, self.round_p50_ms.min, self.round_p50_ms.max, self.p99_ms)
    }

    /// `self ÷ base` on p50.
    pub fn ratio_to(&self, base: &Latency) -> f64 {
        if base.p50_ms > 0.0 { self.p50_ms / base.p50_ms } else { 0.0 }
    }
}

fn sorted_ms(v: &[Duration]) -> Vec<f64> {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// The `p`-th percentile of sorted values (nearest rank below; 0 for none).
pub fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(sorted.len() - 1) * p.min(100) / 100]
}

/// Throughput of one variant at one concurrency, in cycles per second.
#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    /// The variant's name.
    pub name: String,
    /// Concurrent tasks.
    pub tasks: usize,
    /// Cycles per second over the rounds.
    pub per_sec: Spread,
}

impl Rate {
    /// `self ÷ base` on medians.
    pub fn ratio_to(&self, base: &Rate) -> f64 {
        self.per_sec.ratio_to(&base.per_sec)
    }
}

async fn sequential(variant: &Variant, cycles: usize, keys: usize) -> Result<Vec<Duration>, String> {
    let mut lat = Vec::with_capacity(cycles);
    for n in 0..cycles {
        let slot = Slot { task: 0, key: n % keys.max(1), n: n as u64 };
        let t = Instant::now();
        variant.run(slot).await.map_err(|e| format!("{}: {e}", variant.name))?;
        lat.push(t.elapsed());
    }
    Ok(lat)
}

/// Sequential latency of each variant (one task): a warm-up of a fifth of `plan.cycles`, then
/// `plan.rounds` interleaved rounds of `plan.cycles` each, `before` ahead of every turn.
pub async fn latency(variants: &[Variant], plan: &Plan, before: Option<&Hook>) -> Result<Vec<Latency>, String> {
    for v in variants {
        Hook::run(before).await?;
        sequential(v, (plan.cycles / 5).max(10), plan.keys).await?;
    }
    let mut rounds: Vec<Vec<Vec<Duration>>> = vec![Vec::new(); variants.len()];
    for _ in 0..plan.rounds {
        for (v, out) in variants.iter().zip(&mut rounds) {
            Hook::run(before).await?;
            out.push(sequential(v, plan.cycles, plan.keys).await?);
        }
    }
    Ok(variants.iter().zip(rounds).map(|(v, r)| Latency::of(&v.name, r)).collect())
}

/// Cycles per second of `variant` with `tasks` tasks at once for `window`.
pub async fn window(variant: &Variant, tasks: usize, window: Duration, keys: usize) -> Result<f64, String> {
    let start = Instant::now();
    let until = start + window;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let v = variant.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    let slot = Slot { task, key: (n % keys.max(1) as u64) as usize, n };
                    v.run(slot).await.map_err(|e| format!("{}: {e}", v.name))?;
                    n += 1;
                }
                Ok::<u64, String>(n)
            })
        })
        .collect();
    let mut total = 0;
    let mut failure = None;
    for h in handles {
        match h.await {
            Ok(Ok(n)) => total += n,
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(format!("{}: a task failed: {e}", variant.name)),
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(total as f64 / start.elapsed().as_secs_f64()),
    }
}

/// Throughput of each variant at `tasks` tasks: a warm-up window of a quarter of `plan.window`,
/// then `plan.rounds` interleaved windows, `before` ahead of every turn.
pub async fn throughput(
    variants: &[Variant],
    tasks: usize,
    plan: &Plan,
    before: Option<&Hook>,
) -> Result<Vec<Rate>, String> {
    for v in variants {
        Hook::run(before).await?;
        window(v, tasks, plan.window / 4, plan.keys).await?;
    }
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _ in 0..plan.rounds {
        for (v, out) in variants.iter().zip(&mut rounds) {
            Hook::run(before).await?;
            out.push(window(v, tasks, plan.window, plan.keys).await?);
        }
    }
    Ok(variants.iter().zip(rounds).map(|(v, r)| Rate { name: v.name.clone(), tasks, per_sec: Spread::of(r) }).collect())
}

/// Throughput of each variant at every concurrency of the plan.
pub async fn throughput_all(variants: &[Variant], plan: &Plan, before: Option<&Hook>) -> Result<Vec<Rate>, String> {
    let mut out = Vec::new();
    for &tasks in &plan.concurrency {
        out.extend(throughput(variants, tasks, plan, before).await?);
    }
    Ok(out)
}

type HandoffFn = dyn Fn(usize) -> BoxFuture<Result<Vec<Duration>, String>> + Send + Sync;

/// A contended handoff to measure: `run(n)` performs `n` handoffs (a waiter already waiting
/// when the holder releases) and returns, for each, the time from the holder's release
/// returning to the waiter holding.
#[derive(Clone)]
pub struct Handoff {
    /// How the reports name it.
    pub name: String,
    run: Arc<HandoffFn>,
}

impl Handoff {
    /// A handoff variant running `run(n)`.
    pub fn new<F, Fut>(name: impl Into<String>, run: F) -> Handoff
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Duration>, String>> + Send + 'static,
    {
        Handoff { name: name.into(), run: Arc::new(move |n| Box::pin(run(n))) }
    }

    /// Palisade's handoff on `key`: `holder` takes the lock, a waiter on `waiter` calls `lock`
    /// and waits, the holder releases after `settle`; the waiter's lease is released after.
    pub fn service<S>(
        name: impl Into<String>,
        holder: Arc<S>,
        waiter: Arc<S>,
        key: palisade::ResourceKey,
        ttl: Duration,
        settle: Duration,
    ) -> Handoff
    where
        S: palisade::LockService + ?Sized + 'static,
    {
        use palisade::{LockOptions, LockServiceExt};
        let take = move |svc: Arc<S>| {
            let key = key.clone();
            move || {
                let (svc, key) = (Arc::clone(&svc), key.clone());
                async move {
                    svc.lock(&key, LockOptions::ttl(ttl).wait(Duration::from_secs(10))).await.map_err(|e| e.to_string())
                }
            }
        };
        Handoff::between(
            name,
            take(holder),
            take(waiter),
            |lease: palisade::Lease<S>| async move { lease.release().await.map_err(|e| e.to_string()) },
            settle,
        )
    }

    /// Palisade's handoff on `key` from a holder in another process (`palisade holder`, this
    /// binary, started on `url` for each run): the holder takes the lock, a waiter on `waiter`
    /// calls `lock` and waits, the holder releases after `settle`; the time runs from the holder's release returning to the
    /// waiter's grant, by the wall clock both processes read. A run measures one handoff in
    /// `every` of those asked for (at least one), for settles long enough to make many slow.
    pub fn from_another_process<S>(
        name: impl Into<String>,
        waiter: Arc<S>,
        url: &str,
        key: palisade::ResourceKey,
        settle: Duration,
        every: usize,
    ) -> Handoff
    where
        S: palisade::LockService + ?Sized + 'static,
    {
        use palisade::{LockOptions, LockServiceExt};
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let url = url.to_string();
        Handoff::new(name, move |n| {
            let (waiter, url, key) = (Arc::clone(&waiter), url.clone(), key.clone());
            async move {
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let mut child = tokio::process::Command::new(exe)
                    .args(["holder", "--lock", &url, "--domain", key.domain(), "--id", key.id()])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| format!("cannot start the holder: {e}"))?;
                let mut stdin = child.stdin.take().ok_or("no holder stdin")?;
                let mut lines = tokio::io::BufReader::new(child.stdout.take().ok_or("no holder stdout")?).lines();
                let mut line = async || match tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await {
                    Ok(Ok(Some(line))) => Ok(line),
                    Ok(Ok(None)) => Err("the holder exited".to_string()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("the holder said nothing for 60 s".to_string()),
                };
                let mut out = Vec::new();
                for _ in 0..n.div_ceil(every.max(1)) {
                    stdin.write_all(b"take\n").await.map_err(|e| e.to_string())?;
                    let said = line().await?;
                    if said != "acquired" {
                        return Err(format!("the holder said {said:?}"));
                    }
                    let waiting = tokio::spawn({
                        let (waiter, key) = (Arc::clone(&waiter), key.clone());
                        async move {
                            let got = waiter
                                .lock(&key, LockOptions::ttl(Duration::from_secs(10)).wait(Duration::from_secs(30)))
                                .await;
                            (std::time::SystemTime::now(), got)
                        }
                    });
                    tokio::time::sleep(settle).await;
                    stdin.write_all(b"go\n").await.map_err(|e| e.to_string())?;
                    let said = line().await?;
                    let released = said
                        .strip_prefix("released ")
                        .and_then(|nanos| nanos.parse::<u64>().ok())
                        .map(|nanos| std::time::UNIX_EPOCH + Duration::from_nanos(nanos))
                        .ok_or_else(|| format!("the holder said {said:?}"))?;
                    let (got, lease) = waiting.await.map_err(|e| e.to_string())?;
                    let lease = lease.map_err(|e| e.to_string())?;
                    out.push(got.duration_since(released).unwrap_or_default());
                    lease.release().await.map_err(|e| e.to_string())?;
                }
                drop(stdin);
                let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
                Ok(out)
            }
        })
    }

    /// The handoff of any primitive: `first()` takes it, `second()` is called and waits, the
    /// first lets go with `give` after `settle`; the time measured runs from `give` returning to
    /// `second()` returning. The second's hold is given back after.
    pub fn between<T, A, AFut, B, BFut, G, GFut>(
        name: impl Into<String>,
        first: A,
        second: B,
        give: G,
        settle: Duration,
    ) -> Handoff
    where
        T: Send + 'static,
        A: Fn() -> AFut + Send + Sync + 'static,
        AFut: Future<Output = Result<T, String>> + Send + 'static,
        B: Fn() -> BFut + Send + Sync + 'static,
        BFut: Future<Output = Result<T, String>> + Send + 'static,
        G: Fn(T) -> GFut + Send + Sync + 'static,
        GFut: Future<Output = Result<(), String>> + Send + 'static,
    {
        let parts = Arc::new((first, second, give));
        Handoff::new(name, move |n| {
            let parts = Arc::clone(&parts);
            async move {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    let held = (parts.0)().await?;
                    let waiting = tokio::spawn({
                        let second = (parts.1)();
                        async move {
                            let got = second.await;
                            (Instant::now(), got)
                        }
                    });
                    tokio::time::sleep(settle).await;
                    (parts.2)(held).await?;
                    let released = Instant::now();
                    let (got, taken) = waiting.await.map_err(|e| e.to_string())?;
                    let taken = taken?;
                    out.push(got.saturating_duration_since(released));
                    (parts.2)(taken).await?;
                }
                Ok(out)
            }
        })
    }
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Each handoff variant: a warm-up of a fifth of `plan.handoffs`, then `plan.rounds`
/// interleaved rounds of `plan.handoffs`.
pub async fn handoffs(variants: &[Handoff], plan: &Plan) -> Result<Vec<Latency>, String> {
    for v in variants {
        (v.run)((plan.handoffs / 5).max(3)).await.map_err(|e| format!("{}: {e}", v.name))?;
    }
    let mut rounds: Vec<Vec<Vec<Duration>>> = vec![Vec::new(); variants.len()];
    for _ in 0..plan.rounds {
        for (v, out) in variants.iter().zip(&mut rounds) {
            out.push((v.run)(plan.handoffs).await.map_err(|e| format!("{}: {e}", v.name))?);
        }
    }
    Ok(variants.iter().zip(rounds).map(|(v, r)| Latency::of(&v.name, r)).collect())
}

/// A key prefix of its own for one run, so runs against a shared server never collide.
pub fn run_prefix(what: &str) -> String {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    format!("{what}{}", u32::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn spread_and_percentiles() {
        let s = Spread::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(vec![]).median, 0.0);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50), 50.0);
        assert_eq!(percentile(&v, 99), 99.0);
        assert_eq!(percentile(&v, 100), 100.0);
        assert_eq!(percentile(&[], 50), 0.0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn variants_take_turns_on_the_same_keys() {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let hooks = Arc::new(AtomicUsize::new(0));
        let plan = Plan { cycles: 20, rounds: 3, keys: 4, ..Plan::quick() };
        let make = |name: &'static str| {
            let order = Arc::clone(&order);
            Variant::new(name, move |slot| {
                order.lock().unwrap().push((name, slot.key));
                async { Ok(()) }
            })
        };
        let hook = {
            let hooks = Arc::clone(&hooks);
            Hook::new(move || {
                hooks.fetch_add(1, Ordering::Relaxed);
                async { Ok(()) }
            })
        };
        let out = latency(&[make("a"), make("b")], &plan, Some(&hook)).await.unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].samples_ms.len(), 60);
        // Two warm-ups and 2 × 3 turns, each after the hook.
        assert_eq!(hooks.load(Ordering::Relaxed), 8);
        let order = order.lock().unwrap();
        // Warm-ups (10 each), then a, b, a, b, a, b in blocks of 20.
        let blocks: Vec<&str> = order[20..].chunks(20).map(|c| c[0].0).collect();
        assert_eq!(blocks, ["a", "b", "a", "b", "a", "b"]);
        let keys_a: Vec<usize> = order.iter().filter(|(n, _)| *n == "a").map(|(_, k)| *k).collect();
        let keys_b: Vec<usize> = order.iter().filter(|(n, _)| *n == "b").map(|(_, k)| *k).collect();
        assert_eq!(keys_a, keys_b);
        assert!(keys_a.iter().all(|k| *k < 4));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_cycle_ends_the_measurement_with_its_name() {
        let plan = Plan { window: Duration::from_millis(40), rounds: 1, ..Plan::quick() };
        let bad = Variant::new("bad", |slot| async move { if slot.n == 3 { Err("boom".into()) } else { Ok(()) } });
        let e = throughput(&[bad], 4, &plan, None).await.unwrap_err();
        assert_eq!(e, "bad: boom");
    }
}
