//! Logs for every example: a fence regression or a refused write is visible without
//! configuration.

/// Installs a `tracing` subscriber on stderr: `RUST_LOG` when set (for example
/// `RUST_LOG=palisade=debug`), otherwise warnings and errors only. Standard output stays free for
/// the JSON the examples print.
pub fn init() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    // A second call (a test harness that installed its own) is harmless: keep the first.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
