//! The warehouse example's command line (a contract: examples/warehouse/README.md): any
//! arguments are either refused as a usage error or parsed into values within the documented
//! ranges; help and version come only when asked for; the lock URL follows from the store URL.

use arbitrary::Arbitrary;
use clap::Parser;
use clap::error::ErrorKind;
use palisade_examples::warehouse::cli::{Cli, Command, MAX_ALLOCATE_MS, MAX_QTY, MAX_SIMULATE_MS, MAX_THINK_MS};

const WORDS: &[&str] = &[
    "simulate",
    "setup",
    "show",
    "allocate",
    "transfer",
    "help",
    "--lock",
    "--store",
    "--sku",
    "--from",
    "--to",
    "--transfer-every",
    "--qty",
    "--ttl-ms",
    "--think-ms",
    "--job",
    "--wait-ms",
    "--workers",
    "--jobs",
    "--skus",
    "--pause-every",
    "--pause-ms",
    "--unfenced",
    "--json",
    "--help",
    "-h",
    "--version",
    "-V",
    "--",
    "sqlite::memory:",
    "sqlite://w.db",
    "postgres://u:p@h/db",
    "memory://",
];

#[derive(Arbitrary, Debug)]
enum Arg {
    Word(u8),
    Number(i64),
    Text(String),
    Joined(u8, i64),
}

/// One fuzz input, decoded as libFuzzer's typed targets decode theirs ([`crate::decode`]).
pub fn run(data: &[u8]) {
    let Some(args) = crate::decode::<Vec<Arg>>(data) else { return };
    let args: Vec<String> = args
        .iter()
        .take(16)
        .map(|a| match a {
            Arg::Word(w) => WORDS[usize::from(*w) % WORDS.len()].to_string(),
            Arg::Number(n) => n.to_string(),
            Arg::Text(t) => t.clone(),
            Arg::Joined(w, n) => format!("{}={n}", WORDS[usize::from(*w) % WORDS.len()]),
        })
        .collect();
    let argv = std::iter::once("warehouse".to_string()).chain(args.iter().cloned());
    match Cli::try_parse_from(argv) {
        Ok(cli) => {
            let within = |v: i64, lo: i64, hi: i64| (lo..=hi).contains(&v);
            match &cli.command {
                Command::Simulate(s) => {
                    assert!((1..=1024).contains(&s.workers) && (1..=10_000).contains(&s.skus), "{s:?}");
                    assert!((1..=100_000_000).contains(&s.jobs), "{s:?}");
                    assert!(within(s.ttl_ms, 1, MAX_SIMULATE_MS), "{s:?}");
                    assert!(s.pause_ms.is_none_or(|p| within(p, 0, MAX_SIMULATE_MS)), "{s:?}");
                }
                Command::Setup { qty, .. } => assert!(within(*qty, 0, MAX_QTY)),
                Command::Show { .. } => {}
                Command::Allocate { work, .. } | Command::Transfer { work, .. } => {
                    assert!(within(work.qty, 1, MAX_QTY) && within(work.ttl_ms, 1, MAX_ALLOCATE_MS));
                    assert!(within(work.think_ms, 0, MAX_THINK_MS) && within(work.wait_ms, 0, MAX_ALLOCATE_MS));
                }
            }
            let lock = cli.lock_url();
            match &cli.lock {
                Some(given) => assert_eq!(&lock, given),
                None => assert!(lock == cli.store || lock == "memory://", "{} -> {lock}", cli.store),
            }
        }
        Err(e) => {
            // Asked for: the long flag (`--help`, `--help=…`), the short one alone or among
            // other short flags (`-h`, `-xh`, `-h=…`), or the `help` subcommand.
            let asked = |long: &str, short: char, word: Option<&str>| {
                args.iter().any(|a| {
                    a == long
                        || a.starts_with(&format!("{long}="))
                        || (a.starts_with('-') && !a.starts_with("--") && a.contains(short))
                        || word.is_some_and(|w| a == w)
                })
            };
            match e.kind() {
                ErrorKind::DisplayHelp => assert!(asked("--help", 'h', Some("help")), "help for {args:?}"),
                ErrorKind::DisplayVersion => assert!(asked("--version", 'V', None), "version for {args:?}"),
                _ => {}
            }
            let _ = e.render().to_string();
        }
    }
}
