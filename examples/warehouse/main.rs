//! # warehouse: the incident, replayed
//!
//! A warehouse allocation worker holds a lock while it decrements stock. A stop-the-world pause
//! outlives the lock's TTL; another worker takes the lock and ships; the first wakes up and
//! decrements again. With Palisade the store refuses the stale write (exit code 3 from
//! `allocate`, `fence_rejected` in `simulate`) and the inventory stays right.
//!
//! ```text
//! cargo run --release --example warehouse -- simulate [--workers N] [--jobs N] [--ttl-ms MS]
//!           [--pause-every K] [--pause-ms MS] [--skus N] [--transfer-every K] [--unfenced] [--json]
//! cargo run --release --example warehouse -- setup --sku S --qty N
//! cargo run --release --example warehouse -- show --sku S
//! cargo run --release --example warehouse -- allocate --sku S --qty N [--ttl-ms MS] [--think-ms MS] [--job ID]
//! cargo run --release --example warehouse -- transfer --from S --to T --qty N [--ttl-ms MS] [--think-ms MS] [--job ID]
//! ```
//!
//! Every subcommand takes `--lock URL` (default: the store's URL when it is a SQLite file, so
//! locks and data share it; else `memory://`) and `--store URL` (default
//! `sqlite://warehouse.db`). The flags, the JSON output and the exit codes are a contract that
//! tests outside this repository rely on; `examples/warehouse/README.md` documents them.
//!
//! Exit codes: 0 success; 1 runtime error (backend unavailable, unknown SKU, short stock);
//! 2 bad input (flags, URLs, keys), one line on stderr; 3 `allocate`'s write was refused for a
//! stale fence; 4 a fenced `simulate` found duplicates, a half-applied transfer or stock not
//! conserved (a safety violation: report it); 5 `allocate` found its `--job` already applied
//! by another worker. `transfer` answers as `allocate` does.

use std::process::ExitCode;

use clap::Parser;
use palisade_examples::logging;
use palisade_examples::warehouse::{cli, commands};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli::usage_error(e),
    };
    logging::init();
    match commands::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("warehouse: {e}");
            ExitCode::from(commands::exit_code_for(&e))
        }
    }
}
