//! Every use-case example on Redis + PostgreSQL, on PostgreSQL alone (its lock service in the
//! same database) and on etcd + PostgreSQL (the servers the test command starts). etcd runs with a 1 s TTL inside a 3 s session.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

#[path = "common/use_cases.rs"]
mod use_cases;

use palisade_conformance::require_env;

fn redis() -> (String, String) {
    (require_env("PALISADE_REDIS_URL"), require_env("PALISADE_POSTGRES_URL"))
}

fn etcd() -> (String, String) {
    (format!("{}?session_ttl_s=3", require_env("PALISADE_ETCD_URL")), require_env("PALISADE_POSTGRES_URL"))
}

macro_rules! on_servers {
    ($($name:ident),*) => {
        mod redis_postgres {
            $(
                #[test]
                fn $name() {
                    let (lock, store) = super::redis();
                    super::use_cases::$name(Some((&lock, &store)), &[]);
                }
            )*
        }
        mod postgres_alone {
            $(
                #[test]
                fn $name() {
                    let db = palisade_conformance::require_env("PALISADE_POSTGRES_URL");
                    super::use_cases::$name(Some((&db, &db)), &[]);
                }
            )*
        }
        mod etcd_postgres {
            $(
                #[test]
                fn $name() {
                    let (lock, store) = super::etcd();
                    super::use_cases::$name(Some((&lock, &store)), &["--ttl-ms", "1000"]);
                }
            )*
        }
    };
}

on_servers!(
    nightly_aggregation,
    cache_refresh,
    invoice_numbering,
    invoice_numbering_without_a_takeover,
    outbox_relay,
    rate_limit,
    price_catalogue,
    metrics
);
