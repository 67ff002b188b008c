//! Shared by the integration tests: the warehouse example as a real process.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test binary uses a part

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

/// The warehouse example binary, built once per test binary with every feature (as the test
/// command builds everything), so a filtered `cargo test --test X` never runs a stale binary.
pub fn warehouse() -> Command {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test exe path");
        let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--quiet", "--all-features", "--example", "warehouse"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "building the warehouse example failed");
        profile_dir.join("examples").join(format!("warehouse{}", std::env::consts::EXE_SUFFIX))
    });
    Command::new(bin)
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
