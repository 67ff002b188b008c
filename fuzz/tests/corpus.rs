//! Every file of the committed corpus (`fuzz/corpus/TARGET/`) through its target, on the stable
//! toolchain with overflow checks and debug assertions: what libFuzzer once found interesting,
//! and every crash it found (minimised into the corpus), replayed on every test run.

#![allow(clippy::unwrap_used)] // a test's helpers: an unreadable corpus fails the test

use std::path::{Path, PathBuf};

use palisade_fuzz::targets;

/// One target at a time: the targets that talk to the in-process DynamoDB endpoint share it
/// (what it answers is set per input), as they do in libFuzzer's one process. `cargo test`
/// runs the tests of a binary on threads of one process.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs each file of `corpus/NAME` through `run`, and fails naming the file that panics.
/// A target whose corpus is missing or empty fails too: the replay would prove nothing.
fn replay(name: &str, run: fn(&[u8])) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{}: only {} inputs", dir.display(), files.len());
    for file in &files {
        let data = std::fs::read(file).unwrap();
        if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{name}: {} panicked: {message}", file.display());
        }
    }
    println!("{name}: {} inputs replayed", files.len());
}

macro_rules! replay {
    ($($target:ident),* $(,)?) => {$(
        #[test]
        fn $target() {
            replay(stringify!($target), targets::$target::run);
        }
    )*};
}

replay!(
    batch_encoding,
    connection_urls,
    dynamodb_replies,
    etcd_replies,
    keys_and_records,
    postgres_replies,
    redis_replies,
    sqlite_batches,
    warehouse_cli,
    zookeeper_nodes,
);

/// Every target has its test above and a libFuzzer entry point, and nothing else is in
/// `corpus/`: a target added in one place only fails here.
#[test]
fn every_target_is_replayed_and_fuzzed() {
    let names = |dir: &str, strip: &str| -> Vec<String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().trim_end_matches(strip).to_string())
            .filter(|n| n != "mod")
            .collect();
        names.sort();
        names
    };
    let corpus = names("corpus", "");
    assert_eq!(names("src/targets", ".rs"), corpus);
    assert_eq!(names("libfuzzer/fuzz_targets", ".rs"), corpus);
    let replayed = [
        "batch_encoding",
        "connection_urls",
        "dynamodb_replies",
        "etcd_replies",
        "keys_and_records",
        "postgres_replies",
        "redis_replies",
        "sqlite_batches",
        "warehouse_cli",
        "zookeeper_nodes",
    ];
    assert_eq!(corpus, replayed, "a target without its replay test above");
}
