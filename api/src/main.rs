//! `cargo run -p palisade-public-api [-- check | bless]`: the public API of the crates users
//! depend on (`palisade`, `palisade-core`, `palisade-conformance`), every feature on, rendered
//! one item per line and compared with the baseline committed in `api/<crate>.txt`.
//!
//! `check` (the default) prints what was added and removed and fails if anything differs;
//! `bless` writes the baselines. An intended change is blessed, committed with the code that
//! made it, and noted in `CHANGELOG.md`.
//!
//! Both run `cargo doc --workspace --no-deps --all-features` (with the caller's
//! `RUSTDOCFLAGS`), so the test command's rustdoc step is this program: the same
//! documentation build, and for the three crates rustdoc's JSON beside the HTML. Rustdoc's
//! JSON output is unstable, so it is asked of the stable toolchain with `RUSTC_BOOTSTRAP=1`,
//! and of rustdoc alone: this program passes itself to cargo as `RUSTDOC` and, called that
//! way, runs the real rustdoc, then again with the variable set for JSON when the crate is
//! one of the three. (Setting it for cargo would change every dependency's fingerprint, and
//! the steps around this one would build everything again.) The rendering is
//! cargo-public-api's library (`public-api`), pinned to the JSON format this toolchain writes.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitCode};

/// The crates whose API is a promise: the facade, the traits backends implement, and the
/// certification suite backend authors build on.
const CRATES: [&str; 3] = ["palisade", "palisade-core", "palisade-conformance"];

/// The rustdoc JSON format the pinned `public-api` reads.
const FORMAT_VERSION: u64 = 57;

/// Set when this program runs as cargo's `RUSTDOC`.
const AS_RUSTDOC: &str = "PALISADE_PUBLIC_API_AS_RUSTDOC";

fn main() -> ExitCode {
    if std::env::var_os(AS_RUSTDOC).is_some() {
        return rustdoc();
    }
    let bless = match std::env::args().nth(1).as_deref() {
        None | Some("check") => false,
        Some("bless") => true,
        Some(other) => {
            eprintln!("unknown command {other:?}; usage: palisade-public-api [check | bless]");
            return ExitCode::from(2);
        }
    };
    match run(bless) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("palisade-public-api: {e}");
            ExitCode::from(2)
        }
    }
}

/// The real rustdoc with this process's arguments; then, for the library of one of
/// [`CRATES`], the same again writing JSON (unstable options allowed for that run only).
fn rustdoc() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let status = match Command::new("rustdoc").args(&args).env_remove(AS_RUSTDOC).status() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("palisade-public-api: running rustdoc: {e}");
            return ExitCode::from(2);
        }
    };
    if !status.success() {
        return failed(status);
    }
    let after = |flag: &str| args.windows(2).find(|pair| pair[0] == flag).map(|pair| pair[1].clone());
    let is_lib = after("--crate-type").is_some_and(|t| t == "lib");
    let ours = after("--crate-name").is_some_and(|name| CRATES.iter().any(|c| name == c.replace('-', "_").as_str()));
    if !(is_lib && ours) {
        return ExitCode::SUCCESS;
    }
    let json = Command::new("rustdoc")
        .args(&args)
        .args(["-Z", "unstable-options", "--output-format", "json"])
        .env_remove(AS_RUSTDOC)
        .env("RUSTC_BOOTSTRAP", "1")
        .status();
    match json {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => failed(status),
        Err(e) => {
            eprintln!("palisade-public-api: running rustdoc for JSON: {e}");
            ExitCode::from(2)
        }
    }
}

/// Rustdoc's exit code, passed on to cargo (1 when it had none: killed by a signal).
fn failed(status: std::process::ExitStatus) -> ExitCode {
    ExitCode::from(status.code().and_then(|code| u8::try_from(code).ok()).unwrap_or(1))
}

/// Documents the workspace, then checks (or blesses) every crate's API; `Ok(false)` when one
/// differs from its baseline.
fn run(bless: bool) -> Result<bool, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().ok_or("the crate has no parent directory")?;
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    };
    document(root)?;
    let mut same = true;
    for name in CRATES {
        let items = public_items(&target, name)?;
        let baseline = root.join("api").join(format!("{name}.txt"));
        if bless {
            let text: String = items.iter().map(|item| format!("{item}\n")).collect();
            std::fs::write(&baseline, text).map_err(|e| format!("writing {}: {e}", baseline.display()))?;
            println!("{name}: {} items written to {}", items.len(), baseline.display());
            continue;
        }
        let committed = std::fs::read_to_string(&baseline)
            .map_err(|e| format!("reading {} ({e}); create it with `bless`", baseline.display()))?;
        let committed: BTreeSet<String> = committed.lines().map(str::to_owned).collect();
        let removed: Vec<_> = committed.difference(&items).collect();
        let added: Vec<_> = items.difference(&committed).collect();
        if removed.is_empty() && added.is_empty() {
            println!("{name}: {} items, as in api/{name}.txt", items.len());
            continue;
        }
        same = false;
        println!(
            "{name}: the public API differs from api/{name}.txt ({} removed, {} added):",
            removed.len(),
            added.len()
        );
        for item in removed {
            println!("- {item}");
        }
        for item in added {
            println!("+ {item}");
        }
    }
    if !same {
        println!(
            "\nIf the change is intended: `cargo run -p palisade-public-api -- bless`, commit api/*.txt with it, \
             and note it in CHANGELOG.md (a removal or a changed signature breaks users)."
        );
    }
    Ok(same)
}

/// `cargo doc --workspace --no-deps --all-features` with this program as rustdoc.
fn document(root: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let this = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let mut command = Command::new(cargo);
    // What `cargo run` told this program about itself: build scripts that read those variables
    // (ring's) would see them change and run again, here and in the next plain build.
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_PRIMARY_"]
            .iter()
            .any(|prefix| key_str.starts_with(prefix))
        {
            command.env_remove(&key);
        }
    }
    let status = command
        .current_dir(root)
        .env("RUSTDOC", this)
        .env(AS_RUSTDOC, "1")
        .args(["doc", "--workspace", "--no-deps", "--all-features"])
        .status()
        .map_err(|e| format!("running cargo doc: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("cargo doc failed ({status})")) }
}

/// The public items of crate `name` from the JSON [`document`] left, one rendered line each.
fn public_items(target: &Path, name: &str) -> Result<BTreeSet<String>, String> {
    let json = target.join("doc").join(format!("{}.json", name.replace('-', "_")));
    let text = std::fs::read_to_string(&json).map_err(|e| format!("reading {}: {e}", json.display()))?;
    let format = serde_json::from_str::<serde_json::Value>(&text)
        .map_err(|e| format!("{} is not JSON: {e}", json.display()))?
        .get("format_version")
        .and_then(serde_json::Value::as_u64);
    if format != Some(FORMAT_VERSION) {
        return Err(format!(
            "{} is rustdoc JSON format {format:?}, and the pinned public-api reads format {FORMAT_VERSION}: \
             pin the public-api release for this toolchain's format (its README has the table)",
            json.display()
        ));
    }
    let api = public_api::Builder::from_rustdoc_json(&json)
        .omit_blanket_impls(true)
        .build()
        .map_err(|e| format!("reading the public API of {name}: {e}"))?;
    Ok(api.items().map(ToString::to_string).collect())
}
