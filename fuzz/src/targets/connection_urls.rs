//! Every URL parser, and the redaction of every scheme: a URL built around a password (in its
//! user-info, raw or percent-encoded, or in its query) is parsed by each backend's parser; the
//! redacted URL, the parsed configuration's `Debug` and any error never show the password. The
//! core parser gives back the user and password it was given. Raw text goes through every
//! parser too, which must refuse it with a typed error rather than panic.

use crate::checks::{hides_password, redaction_hides_password};
use arbitrary::Arbitrary;
use palisade_core::spi::{ConnectionUrl, encode_userinfo};
use palisade_core::{ErrorKind, redact_url};

const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+sentinel",
    "redis+cluster",
    "redlock",
    "etcd",
    "etcds",
    "zk",
    "postgres",
    "postgresql",
    "dynamodb",
    "sqlite",
    "memory",
    "x-custom",
];

/// The password's alphabet: upper case and the characters that need encoding, so that no
/// other part of the URL (all lower case) can spell it. It starts with `QZ`, which no message
/// of ours does (`SQLite`, `URL` and `TLS` do hold single capitals).
const SECRET: &[u8] = b"QWERTYUIOPASDFGHJKLZXCVBNM!#$%&*+=~@/?:;, []'\"\\^`{}|";

#[derive(Arbitrary, Debug)]
struct Parts {
    scheme: u8,
    user: String,
    password: Vec<u8>,
    hosts: Vec<(String, Option<u16>)>,
    path: String,
    query: Vec<(String, String)>,
    encoded: bool,
    in_query: bool,
    raw: String,
}

fn lower(s: &str, allowed: impl Fn(char) -> bool, max: usize) -> String {
    s.chars().map(|c| c.to_ascii_lowercase()).filter(|&c| allowed(c)).take(max).collect()
}

/// Each backend's parser of `url`: what it shows of a parsed URL, or its error.
fn parsed_views(url: &str) -> Vec<(&'static str, Result<String, palisade_core::Error>)> {
    let redis = palisade_redis::RedisConfig::new(url);
    vec![
        ("redis config", Ok(format!("{} {redis:?}", redis.redacted_url()))),
        ("sentinel", palisade_redis::fuzzing::SentinelTarget::parse(url).map(|t| format!("{t:?}"))),
        ("cluster", palisade_redis::fuzzing::ClusterTarget::parse(url).map(|t| format!("{t:?}"))),
        ("redlock", palisade_redlock::RedlockConfig::parse(url).map(|c| format!("{c:?}"))),
        ("etcd", palisade_etcd::EtcdConfig::from_url(url).map(|c| format!("{} {c:?}", c.redacted_url()))),
        ("zookeeper", palisade_zookeeper::ZkConfig::from_url(url).map(|c| format!("{} {c:?}", c.redacted_url()))),
        ("postgres", palisade_postgres::PostgresConfig::from_url(url).map(|c| format!("{} {c:?}", c.redacted_url()))),
        ("dynamodb", palisade_dynamodb::DynamoConfig::from_url(url).map(|c| format!("{c:?}"))),
        ("sqlite", palisade_sqlite::SqliteConfig::from_url(url).map(|c| format!("{c:?}"))),
    ]
}

/// One fuzz input, decoded as libFuzzer's typed targets decode theirs ([`crate::decode`]).
pub fn run(data: &[u8]) {
    let Some(parts) = crate::decode::<Parts>(data) else { return };
    let scheme = SCHEMES[usize::from(parts.scheme) % SCHEMES.len()];
    let user = lower(&parts.user, |c| c.is_ascii_lowercase() || c.is_ascii_digit(), 8);
    let password: String = "QZ"
        .chars()
        .chain(parts.password.iter().take(24).map(|b| char::from(SECRET[usize::from(*b) % SECRET.len()])))
        .collect();
    let mut hosts: Vec<String> = parts
        .hosts
        .iter()
        .take(4)
        .map(|(h, port)| {
            let h = lower(h, |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-', 16);
            let h = if h.is_empty() { "h".to_string() } else { h };
            port.map_or(h.clone(), |p| format!("{h}:{p}"))
        })
        .collect();
    if hosts.is_empty() {
        hosts.push("127.0.0.1:1".into());
    }
    let path = lower(&parts.path, |c| c.is_ascii_lowercase() || c.is_ascii_digit() || "/_.:".contains(c), 16);
    let path = if path.is_empty() || path.starts_with('/') { path } else { format!("/{path}") };
    let mut query: Vec<String> = parts
        .query
        .iter()
        .take(4)
        .map(|(k, v)| {
            let text = |s: &str| lower(s, |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_', 12);
            format!("{}={}", text(k), text(v))
        })
        .collect();
    let userinfo = match (parts.in_query, parts.encoded) {
        (true, _) => {
            query.push(format!(
                "user={user}&password={}",
                encode_userinfo(None, Some(&password)).trim_matches([':', '@'])
            ));
            String::new()
        }
        (false, true) => encode_userinfo(Some(&user), Some(&password)),
        (false, false) => format!("{user}:{password}@"),
    };
    let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
    let url = format!("{scheme}://{userinfo}{}{path}{query}", hosts.join(","));

    if let Err(why) = redaction_hides_password(&url, &password) {
        panic!("{why}");
    }
    match ConnectionUrl::parse(&url) {
        Ok(parsed) => {
            if let Err(why) = hides_password("ConnectionUrl::redacted", &parsed.redacted(), &password) {
                panic!("{url}: {why}");
            }
            // Credentials in the user-info, encoded, come back exactly as given.
            if !parts.in_query && parts.encoded {
                assert_eq!(parsed.user.as_deref(), Some(user.as_str()), "{url}");
                assert_eq!(parsed.password.as_deref(), Some(password.as_str()), "{url}");
                let again =
                    ConnectionUrl::parse(&format!("{scheme}://{}{}", parsed.encoded_userinfo(), parsed.host_list()));
                assert_eq!(again.map(|u| u.password), Ok(Some(password.clone())), "{url}");
            }
        }
        Err(why) => {
            if let Err(leak) = hides_password("ConnectionUrl::parse's error", &why, &password) {
                panic!("{url}: {leak}");
            }
        }
    }
    for (parser, view) in parsed_views(&url) {
        let shown = match view {
            Ok(shown) => shown,
            Err(e) => {
                assert!(
                    matches!(e.kind(), ErrorKind::InvalidConfig | ErrorKind::Unsupported),
                    "{parser}: {url} refused as {:?}: {e}",
                    e.kind()
                );
                format!("{e} {e:?}")
            }
        };
        if let Err(why) = hides_password(parser, &shown, &password) {
            panic!("{url}: {why}");
        }
    }

    // Raw text: typed refusals, no panic, and redaction never grows a URL's user-info back.
    let _ = redact_url(&parts.raw);
    let _ = ConnectionUrl::parse(&parts.raw);
    for (parser, view) in parsed_views(&parts.raw) {
        if let Err(e) = view {
            assert!(
                matches!(e.kind(), ErrorKind::InvalidConfig | ErrorKind::Unsupported),
                "{parser}: {:?} refused as {:?}: {e}",
                parts.raw,
                e.kind()
            );
        }
    }
}
