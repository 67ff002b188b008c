//! `palisade doctor`: whether the servers a deployment uses are configured for the guarantees
//! Palisade claims, as far as a client can read their configuration. One line per check, with
//! its verdict and the guarantee it protects; the exit status gates a deploy.

use std::process::ExitCode;

use clap::Args;
use palisade::{Check, Verdict, redact_url};
use serde_json::json;

/// `palisade doctor` flags.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// The lock service's URL, as the deployment gives it.
    #[arg(long)]
    pub lock: String,
    /// A fenced store's URL (repeatable).
    #[arg(long = "store")]
    pub stores: Vec<String>,
    /// One JSON document on stdout instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// One server's checks, or why there are none.
struct Target {
    what: &'static str,
    url: String,
    backend: Option<&'static str>,
    checks: Vec<Check>,
}

/// Exit 0: every check passed; 1: a warning, none failed; 2: a check failed, a server could not
/// be read, or (as for every command) the command line was refused.
pub async fn run(args: DoctorArgs) -> ExitCode {
    let mut targets = vec![target("lock service", &args.lock, palisade::diagnose_lock(&args.lock).await).await];
    for url in &args.stores {
        targets.push(target("store", url, palisade::diagnose_store(url).await).await);
    }
    let worst = targets.iter().flat_map(|t| t.checks.iter().map(|c| c.verdict)).max().unwrap_or(Verdict::Pass);
    if args.json {
        let targets: Vec<_> = targets
            .iter()
            .map(|t| {
                json!({
                    "role": t.what,
                    "url": t.url,
                    "backend": t.backend,
                    "checks": t.checks.iter().map(|c| json!({
                        "name": c.name,
                        "verdict": c.verdict.to_string(),
                        "found": c.found,
                        "protects": c.protects,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", json!({ "verdict": worst.to_string(), "targets": targets }));
    } else {
        for t in &targets {
            println!("{}{} ({})", t.what, t.backend.map_or_else(String::new, |b| format!(" {b}")), t.url);
            for c in &t.checks {
                println!("  {:<4}  {}: {}", c.verdict.to_string().to_uppercase(), c.name, c.found);
                println!("        protects: {}", c.protects);
            }
        }
        println!("verdict: {worst}");
    }
    ExitCode::from(match worst {
        Verdict::Pass => 0,
        Verdict::Warn => 1,
        _ => 2,
    })
}

/// Runs the checks of one server, turning what stops them into a check of its own: a server
/// that cannot be reached fails; a backend without checks warns.
async fn target(
    what: &'static str,
    url: &str,
    connected: palisade::Result<std::sync::Arc<palisade::DynDiagnose>>,
) -> Target {
    let url_shown = redact_url(url);
    let connected = match connected {
        Ok(c) => c,
        Err(e) => {
            let verdict = if e.kind() == palisade::ErrorKind::Unsupported { Verdict::Warn } else { Verdict::Fail };
            let check = Check::new("connect", verdict, e.report().to_string(), "the deployment's servers answer");
            return Target { what, url: url_shown, backend: None, checks: vec![check] };
        }
    };
    let backend = Some(connected.backend());
    let checks = match connected.diagnose().await {
        Ok(checks) => checks,
        Err(e) => vec![Check::new(
            "read the configuration",
            Verdict::Fail,
            e.report().to_string(),
            "the deployment's servers answer",
        )],
    };
    Target { what, url: url_shown, backend, checks }
}
