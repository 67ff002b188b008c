//! Shared by the integration tests: the warehouse example as a real process.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test binary uses a part

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

/// The warehouse example binary, built once per test binary with every feature (as the test
/// command builds everything), so a filtered `cargo test --test X` never runs a stale binary.
pub fn warehouse() -> Command {
    example("warehouse")
}

/// An example binary by name, built once per test binary with every feature.
pub fn example(name: &str) -> Command {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("test exe path");
        let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut build = Command::new(env!("CARGO"));
        // What cargo told this test binary about its package: build scripts that read those
        // variables (ring's) would see them change, run again, and rebuild everything above
        // them, here and in the next plain build. Without them this build is the one the test
        // command runs before the tests (scripts/test), so it finds the examples fresh.
        for (key, _) in std::env::vars_os() {
            let name = key.to_string_lossy();
            if ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_PRIMARY_", "CARGO_TARGET_TMPDIR"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
            {
                build.env_remove(&key);
            }
        }
        // The examples belong to the `palisade` package at the workspace root.
        build
            .args(["build", "--quiet", "-p", "palisade", "--all-features", "--examples"])
            // The examples' own tables on PostgreSQL: a feature of their shared crate, which
            // the published package's features do not name.
            .args(["--features", "palisade-examples/postgres"])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "building the examples failed");
        profile_dir.join("examples")
    });
    Command::new(dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX)))
}

pub fn run(args: &[&str]) -> Output {
    warehouse().args(args).output().expect("spawn warehouse")
}

pub fn last_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line =
        stdout.lines().last().unwrap_or_else(|| panic!("no stdout; stderr: {}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

/// A SKU name no other test (or earlier run against the same servers) uses.
pub fn unique_sku(tag: &str) -> String {
    format!("{tag}-{}-{}", std::process::id(), std::time::Instant::now().elapsed().subsec_nanos())
}

/// `warehouse setup` of `sku` with `qty` units; the command must succeed.
pub fn setup_sku(lock: &str, store: &str, sku: &str, qty: &str) {
    let out = run(&["setup", "--lock", lock, "--store", store, "--sku", sku, "--qty", qty]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A running `warehouse allocate` whose stdout we read line by line (the chaos tests freeze
/// and kill it).
pub struct Allocator {
    pub child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Allocator {
    /// Starts `allocate --qty 1` of `sku` with a TTL and a think time.
    pub fn start(lock: &str, store: &str, sku: &str, ttl_ms: u64, think_ms: u64) -> Self {
        use std::io::BufRead;
        let mut child = warehouse()
            .args(["allocate", "--lock", lock, "--store", store, "--sku", sku, "--qty", "1"])
            .args(["--ttl-ms", &ttl_ms.to_string(), "--think-ms", &think_ms.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Allocator { child, lines }
    }

    /// The next JSON event it prints.
    pub fn next_event(&mut self) -> Value {
        let line = self.lines.next().expect("allocate said nothing").unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// Its process id, for signals.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }
}
