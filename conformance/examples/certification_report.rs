//! Writes the certification reports from the records a certification run left behind.
//!
//! ```text
//! cargo run -p palisade-conformance --example certification_report -- [--check] [RECORDS_DIR] [OUT_DIR]
//! ```
//!
//! `RECORDS_DIR` defaults to `target/tmp/palisade-certification` (where each test stamped by
//! `certify!` writes its record), `OUT_DIR` to `docs/conformance`. One Markdown and one JSON
//! file per backend (`memory.md`, `redis.md`, …): a lock service's certifications go to its
//! backend's file, a store's and a pairing's to the store's. Only the backends with records
//! are rewritten. With `--check` nothing is written: the run's verdicts (not its timings) must
//! be those of the committed reports, scenario by scenario, or the command fails naming the
//! differences (what the test command runs after the tests).

use std::path::PathBuf;
use std::process::ExitCode;

use palisade_conformance::report;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.first().is_some_and(|a| a == "--check");
    if check {
        args.remove(0);
    }
    let mut args = args.into_iter();
    let records = PathBuf::from(args.next().unwrap_or_else(|| "target/tmp/palisade-certification".into()));
    let out = PathBuf::from(args.next().unwrap_or_else(|| "docs/conformance".into()));
    if check {
        return match report::check(&records, &out) {
            Ok(n) => {
                println!("certification_report: {n} reports agree with this run's verdicts");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("certification_report: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match report::write(&records, &out) {
        Ok(written) => {
            for w in written {
                println!("{w}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("certification_report: {e}");
            ExitCode::FAILURE
        }
    }
}
