//! A real browser for the tests of `palisade inspect --serve`: headless Chromium driven through
//! chromedriver (W3C WebDriver, JSON over HTTP on loopback), both installed by the test
//! command's prerequisites and started here on a port of the test's own.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use palisade_lab::servers::LoopbackServer;
use serde_json::{Value, json};

/// One HTTP/1.1 exchange with a server on 127.0.0.1, on a connection of its own. Its status
/// and body.
pub fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("127.0.0.1:{port}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    // The answer ends at its Content-Length (chromedriver keeps the connection open), at its
    // last chunk, or when the server closes the connection.
    let mut reader = std::io::BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let mut body = Vec::new();
    if let Some(length) = header("content-length").and_then(|l| l.parse::<usize>().ok()) {
        body.resize(length, 0);
        reader.read_exact(&mut body).unwrap();
    } else if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        reader.read_to_end(&mut body).unwrap();
    }
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A headless Chromium session; the session and chromedriver end when it is dropped.
pub struct Browser {
    driver: LoopbackServer,
    session: String,
}

impl Browser {
    /// Starts chromedriver and opens a headless Chromium session in it.
    pub fn open() -> Browser {
        let driver =
            LoopbackServer::start("chromedriver", |port, _| vec![format!("--port={port}")]).unwrap_or_else(|e| {
                panic!("chromedriver did not start ({e}): the test command's prerequisites install it")
            });
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                // No sandbox: CI runs as root, where Chromium's sandbox refuses to start.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            },
        }}});
        let (status, body) = http(driver.port(), "POST", "/session", Some(&capabilities));
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let Some(session) = answer["value"]["sessionId"].as_str() else {
            panic!("no browser session ({status}): {body}\nchromedriver said: {}", driver.log_tail(20));
        };
        Browser { session: session.to_string(), driver }
    }

    fn command(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, answer) = http(self.driver.port(), method, &format!("/session/{}{path}", self.session), body);
        let answer: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
        assert_eq!(status, 200, "WebDriver {method} {path}: {answer}");
        answer["value"].clone()
    }

    /// Loads `url` and waits for the page to finish loading.
    pub fn go(&self, url: &str) {
        self.command("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` in the page (a function body: `arguments` holds `args`) and returns what
    /// it returns.
    pub fn run(&self, script: &str, args: &[Value]) -> Value {
        self.command("POST", "/execute/sync", Some(&json!({ "script": script, "args": args })))
    }

    /// Waits up to `within` until `seen(what the script returns)` holds, and returns that value.
    /// Panics with the last value seen when it never does.
    pub fn wait_until(&self, within: Duration, script: &str, args: &[Value], seen: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let value = self.run(script, args);
            if seen(&value) {
                return value;
            }
            assert!(Instant::now() < deadline, "the page did not show it within {within:?}; it showed: {value}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends Chromium; chromedriver is killed with its LoopbackServer.
        let _ = http(self.driver.port(), "DELETE", &format!("/session/{}", self.session), None);
    }
}
