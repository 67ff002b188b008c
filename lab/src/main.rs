//! `palisade-lab up [STATE_DIR [SERVER…]]` starts the test command's shared servers (all, or
//! those named: redis, redis-tls, redis-sentinel, redis-cluster, redlock, postgres, postgres-tls, etcd, etcd-tls,
//! dynamodb, dynamodb-tls, zookeeper, zookeeper-tls) on loopback and leaves them running, printing the variables to export (also
//! written to `STATE_DIR/env`); `palisade-lab down [STATE_DIR]` stops them. `STATE_DIR` defaults
//! to `.services`. `palisade-lab tls-terminate PORT UPSTREAM CERTS_DIR [SIGNERS_FILE]` is the TLS
//! terminator `up` starts in front of a plaintext server (`dynamodb-tls`). Installing the servers is the test command's (`scripts/lib/prerequisites.sh`).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    if command == "tls-terminate" {
        return terminate(args.collect());
    }
    let state = PathBuf::from(args.next().unwrap_or_else(|| ".services".into()));
    // Servers are told their files by path and some change directory first (Redis to its data).
    let state = std::path::absolute(&state).unwrap_or(state);
    let only: Vec<String> = args.collect();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let result = match command.as_str() {
        "up" => palisade_lab::services::up(&state, &repo, &only).map(|started| print!("{}", started.exports())),
        "down" => palisade_lab::services::down(&state),
        _ => {
            eprintln!("usage: palisade-lab up [STATE_DIR [SERVER…]] | palisade-lab down [STATE_DIR]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("palisade-lab {command}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `tls-terminate PORT UPSTREAM CERTS_DIR [SIGNERS_FILE]`: runs until killed.
fn terminate(args: Vec<String>) -> ExitCode {
    let [port, upstream, certs, rest @ ..] = args.as_slice() else {
        eprintln!("usage: palisade-lab tls-terminate PORT UPSTREAM CERTS_DIR [SIGNERS_FILE]");
        return ExitCode::from(2);
    };
    let result = (|| {
        let upstream: std::net::SocketAddr = upstream.parse().map_err(std::io::Error::other)?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().map_err(std::io::Error::other)?))?;
        palisade_lab::tls::terminate(listener, upstream, std::path::Path::new(certs), rest.first().map(PathBuf::from))
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("palisade-lab tls-terminate: {e}");
            ExitCode::FAILURE
        }
    }
}
