//! Server processes of a test's own, on loopback: for the scenarios no shared server may
//! suffer (restarts that lose data, killed leaders, odd configurations).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process on a free port of 127.0.0.1 with a data directory of its own; killed (and
/// its directory removed) when dropped.
#[derive(Debug)]
pub struct LoopbackServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    program: String,
    args: Vec<String>,
}

impl LoopbackServer {
    /// Starts `program` with the arguments `args(port, data_dir)` builds, and waits up to 10 s
    /// until it accepts TCP connections on the port.
    pub fn start(program: &str, args: impl FnOnce(u16, &Path) -> Vec<String>) -> std::io::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut nonce = [0u8; 6];
        // A weak nonce only risks a directory collision, which then fails loudly.
        let _ = getrandom::fill(&mut nonce);
        let dir = std::env::temp_dir()
            .join(format!("palisade-server-{port}-{}", nonce.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        std::fs::create_dir_all(&dir)?;
        let args = args(port, &dir);
        let mut server = LoopbackServer { child: None, port, dir, program: program.to_string(), args };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!("{} did not listen on {}", self.program, self.port)));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// A `redis-server` (the binary at `program`) without persistence, plus `extra` arguments
    /// (which may turn persistence back on: later ones win).
    pub fn redis(program: &str, extra: &[&str]) -> std::io::Result<Self> {
        LoopbackServer::start(program, |port, dir| {
            let mut args: Vec<String> = vec![
                "--port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
                "--dir".into(),
                dir.display().to_string(),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        })
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills it with SIGKILL and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills it and starts it again with the same arguments on the same port (whatever it
    /// persisted to its data directory is what survives).
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
