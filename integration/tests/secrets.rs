//! No secret in any message: random passwords (every printable ASCII character, `/ # ? @ : %`
//! included), written into each backend's URL both as typed and percent-encoded, go through every
//! `connect_*` error path — malformed URLs and servers that refuse the connection — and the
//! password never appears in the error's `Display`, `Debug`, or any `source()` down the chain.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::error::Error as _;
use std::time::Duration;

/// A port on 127.0.0.1 where nothing listens (bound, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Every byte that is not a letter or digit as `%XX`.
fn encode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// Passwords to try: the shapes that broke the old redaction, then random printable ASCII.
fn passwords() -> Vec<String> {
    let mut all: Vec<String> = [
        "pa/ss-w0rd-1",
        "pa#ss-w0rd-2",
        "pa?ss-w0rd-3",
        "p@ss@w0rd-44",
        "u5:er:pa55-5",
        "p%40ssw0rd-6",
        "%%%zz%%%zz%7",
        "pw=x&y=z#/?@",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut bytes = [0u8; 48 * 14];
    getrandom::fill(&mut bytes).unwrap();
    for chunk in bytes.chunks(14) {
        // Printable ASCII: '!' (33) to '~' (126); a space is not valid in any URL form.
        all.push(chunk.iter().map(|b| char::from(33 + b % 94)).collect());
    }
    all
}

/// Every window of 6 characters of the password: a partial leak (a URL cut right after the
/// secret, or before a `/` inside it) shows one.
fn leaks(text: &str, password: &str) -> bool {
    let chars: Vec<char> = password.chars().collect();
    text.contains(&encode(password)) || chars.windows(6).any(|w| text.contains(&w.iter().collect::<String>()))
}

/// Display, Debug, and every source's Display and Debug.
fn everything_said(e: &palisade::Error) -> String {
    let mut text = format!("{e}\n{e:?}\n");
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    text
}

/// URL templates per connect function; `{pw}` is the password, `{port}` and `{port2}` closed ports.
const LOCKS: &[&str] = &[
    "redis://app:{pw}@127.0.0.1:{port}/0",
    "rediss://app:{pw}@127.0.0.1:{port}",
    "etcd://app:{pw}@127.0.0.1:{port}",
    "etcds://app:{pw}@127.0.0.1:{port},127.0.0.1:{port2}",
    "zk://app:{pw}@127.0.0.1:{port}/chroot?session_timeout_ms=2000",
];
const ANY_LOCKS: &[&str] = &["redlock://app:{pw}@127.0.0.1:{port},127.0.0.1:{port2}?connect_timeout_ms=200"];
const STORES: &[&str] = &[
    "postgres://app:{pw}@127.0.0.1:{port}/app",
    "postgresql://app:{pw}@127.0.0.1:{port}/app?sslmode=disable",
    "dynamodb://table?region=us-east-1&endpoint=http://app:{pw}@127.0.0.1:{port}",
];

async fn error_of(kind: usize, url: String) -> Option<palisade::Error> {
    let attempt = async {
        match kind {
            0 => palisade::connect_lock(&url).await.err(),
            1 => palisade::connect_any_lock(&url).await.err(),
            _ => palisade::connect_store(&url).await.err(),
        }
    };
    match tokio::time::timeout(Duration::from_secs(60), attempt).await {
        Ok(result) => result,
        Err(_) => panic!("connecting to a closed port did not fail within 60 s: {}", palisade::redact_url(&url)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_appears_in_any_connect_error() {
    let port = closed_port().to_string();
    let port2 = closed_port().to_string();
    let mut tasks = tokio::task::JoinSet::new();
    let mut cases = 0;
    for password in passwords() {
        for form in [password.clone(), encode(&password)] {
            for (kind, templates) in [LOCKS, ANY_LOCKS, STORES].into_iter().enumerate() {
                for template in templates {
                    let url = template.replace("{pw}", &form).replace("{port}", &port).replace("{port2}", &port2);
                    let password = password.clone();
                    cases += 1;
                    tasks.spawn(async move {
                        let error = error_of(kind, url.clone()).await;
                        (url, password, error)
                    });
                }
            }
        }
    }
    let mut failures = Vec::new();
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    while let Some(done) = tasks.join_next().await {
        let (url, password, error) = done.unwrap();
        let Some(error) = error else {
            failures.push(format!("{}: connected to a closed port?", palisade::redact_url(&url)));
            continue;
        };
        *kinds.entry(format!("{}/{:?}", error.backend(), error.kind())).or_default() += 1;
        let said = everything_said(&error);
        if leaks(&said, &password) {
            // The report itself must not leak: show the encoded password's length only.
            failures.push(format!(
                "a {}-character password leaked through {}:\n{said}",
                password.len(),
                error.backend()
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {cases} cases:\n{}", failures.len(), failures.join("\n---\n"));
    eprintln!("{cases} cases; errors by backend and kind: {kinds:?}");
}
