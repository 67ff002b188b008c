//! What the use-case examples share: their flags, connecting, a per-run namespace, and the
//! one JSON line they end with (tests read it).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use palisade::{DynFencedStore, DynLockService, OwnerToken, Result};

/// The flags every example takes. Without them it runs on the embedded default: the
/// in-process lock service and an in-memory SQLite store.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Lock service URL (`memory://`, `redis://…`, `etcd://…`, `zk://…` with their features).
    #[arg(long, default_value = "memory://")]
    pub lock: String,
    /// Fenced store URL (`sqlite::memory:`, `sqlite://PATH`, `postgres://…`, `dynamodb://…`).
    #[arg(long, default_value = "sqlite::memory:")]
    pub store: String,
    /// Lease TTL in milliseconds; the injected pauses are 2 × TTL + 50 ms.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(50..=600_000))]
    pub ttl_ms: u64,
}

impl Common {
    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// A pause long enough to outlive a lease: a GC pause, a VM freeze, a SIGSTOP.
    pub fn pause(&self) -> Duration {
        self.ttl() * 2 + Duration::from_millis(50)
    }

    /// One lock client per actor, as separate processes would each have (for `memory://`
    /// they share the process's instance).
    pub async fn lock_client(&self) -> Result<Arc<DynLockService>> {
        palisade::connect_lock(&self.lock).await
    }

    /// The store, shared by the actors (an in-memory SQLite database exists once per client).
    pub async fn store(&self) -> Result<Arc<DynFencedStore>> {
        palisade::connect_store(&self.store).await
    }
}

/// A short random name, so runs against a shared server never see each other's data.
pub fn run_id() -> Result<String> {
    Ok(OwnerToken::generate()?.to_string()[..8].to_string())
}

/// Prints the summary as the last line of stdout; exit 0 if the example's guarantee held.
pub fn finish(summary: serde_json::Value, held: bool) -> ExitCode {
    println!("{summary}");
    if held {
        ExitCode::SUCCESS
    } else {
        eprintln!("the guarantee this example demonstrates did NOT hold: please report it");
        ExitCode::from(4)
    }
}

/// Runs the example's async main; an error prints one line and exits 1.
pub fn main_with<F>(run: impl FnOnce() -> F) -> ExitCode
where
    F: Future<Output = Result<ExitCode>>,
{
    crate::logging::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", e.report());
            ExitCode::from(if e.kind() == palisade::ErrorKind::InvalidConfig { 2 } else { 1 })
        }
    }
}
