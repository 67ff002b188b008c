//! Hosts in network namespaces, for partitions that a proxy cannot fake: a client, a server
//! or a cluster member on a "host" of its own, cut off from everything and healed.
//!
//! A [`Lab`] is a Linux bridge in the caller's (root) network namespace with an address of its
//! own ([`Lab::gateway`]); each [`Host`] is a network namespace joined to the bridge by a veth
//! pair, with one address on the lab's subnet. Every host reaches the gateway and every other
//! host. [`Host::cut`] takes the host's end of the bridge down: nothing flows to or from it,
//! packets in flight are lost, open TCP connections stay open and retransmit into the void (as
//! behind a failed switch port, not a closed socket); [`Host::heal`] brings it back.
//! [`Host::drop_sent`] and [`Host::drop_received`] lose traffic one way only (`tc`'s `blackhole`
//! queue on that way's side of the veth pair, built into every kernel with traffic control: it
//! drops each packet and tells the sender it went out, so the sender's TCP waits and backs off
//! as behind a real loss); [`Host::stop_dropping`] ends both.
//!
//! Servers run on a host through [`Host::command`] (`ip netns exec`), or in the root namespace
//! bound to the gateway so that hosts reach them. Clients run on a host through
//! [`Host::runtime`]: a tokio runtime whose threads entered the host's namespace, so every
//! socket a task on it opens is the host's.
//!
//! Needs root (`CAP_NET_ADMIN`, `CAP_SYS_ADMIN`) and `ip` (iproute2); the test command installs
//! iproute2 and CI runs as root. Creating a lab without them is an error that says so, never a
//! silent skip. Names are random, so labs of parallel tests never collide; everything is
//! deleted on drop.

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};

/// Subnets are `10.231.X.0/24`; `X` is drawn at random among those no interface uses and no other lab
/// (of any process) holds.
const FIRST_OCTETS: [u8; 2] = [10, 231];

/// The port [`Host::heal`] knocks on to learn that the host is back: the discard port, which
/// nothing in the lab listens on (a listener there would answer too, which is as good).
const HEAL_KNOCK_PORT: u16 = 9;

/// Worker threads of a [`Host::runtime`].
const WORKERS: usize = 2;

/// A bridge in the caller's network namespace that [`Host`]s join. Deleted on drop (after its
/// hosts, which hold no reference to it, are dropped or not: a host whose bridge is gone is
/// simply cut off).
#[derive(Debug)]
pub struct Lab {
    id: String,
    bridge: String,
    subnet: u8,
    /// Held for the lab's life, so that a lab of another process never picks the same subnet
    /// (`None` where claims cannot be made: see [`free_subnet`]).
    _subnet_claim: Option<crate::claims::Claim>,
    next_host: AtomicU8,
}

impl Lab {
    /// Creates the bridge, gives it the subnet's `.1` ([`gateway`](Self::gateway)) and brings it
    /// up.
    pub fn new() -> std::io::Result<Lab> {
        let id = random_hex(5);
        let bridge = format!("plb{id}");
        let (subnet, _subnet_claim) = free_subnet()?;
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        let lab = Lab { id, bridge, subnet, _subnet_claim, next_host: AtomicU8::new(2) };
        ip(&["addr", "add", &format!("{}/24", lab.address(1)), "dev", &lab.bridge])?;
        ip(&["link", "set", &lab.bridge, "up"])?;
        Ok(lab)
    }

    fn address(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(FIRST_OCTETS[0], FIRST_OCTETS[1], self.subnet, last)
    }

    /// The caller's own address on the lab's bridge: a server in the root namespace that hosts
    /// must reach binds here (clients in the root namespace reach it too).
    pub fn gateway(&self) -> IpAddr {
        IpAddr::V4(self.address(1))
    }

    /// A new host on the lab: a network namespace (loopback up) with the next address of the
    /// subnet, joined to the bridge.
    pub fn host(&self) -> std::io::Result<Host> {
        let n = self.next_host.fetch_add(1, Ordering::Relaxed);
        if n >= 250 {
            return Err(std::io::Error::other("a lab holds at most 248 hosts"));
        }
        let namespace = format!("palisade-{}-{n}", self.id);
        let outside = format!("plv{}{n}", self.id);
        let inside = format!("pln{}{n}", self.id);
        ip(&["netns", "add", &namespace])?;
        // From here on, dropping `host` deletes whatever was made.
        let host = Host { namespace, outside, inside: inside.clone(), address: self.address(n) };
        ip(&["link", "add", &host.outside, "type", "veth", "peer", "name", &inside])?;
        ip(&["link", "set", &inside, "netns", &host.namespace])?;
        ip(&["link", "set", &host.outside, "master", &self.bridge])?;
        ip(&["link", "set", &host.outside, "up"])?;
        let netns = ["-n", host.namespace.as_str()];
        ip(&[&netns[..], &["addr", "add", &format!("{}/24", host.address), "dev", &inside]].concat())?;
        ip(&[&netns[..], &["link", "set", &inside, "up"]].concat())?;
        ip(&[&netns[..], &["link", "set", "lo", "up"]].concat())?;
        Ok(host)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// A network namespace on a [`Lab`]'s bridge: a machine of its own as far as the network
/// goes. Deleted (with its end of the veth pair, and so the pair) on drop; processes still
/// running in it keep it alive until they exit.
#[derive(Debug)]
pub struct Host {
    namespace: String,
    /// The veth end on the bridge, in the root namespace: what [`cut`](Self::cut) takes down,
    /// and whose queue [`drop_received`](Self::drop_received) empties.
    outside: String,
    /// The veth end in the host's namespace, whose queue [`drop_sent`](Self::drop_sent) empties.
    inside: String,
    address: Ipv4Addr,
}

impl Host {
    /// The host's address on the lab's subnet.
    pub fn ip(&self) -> IpAddr {
        IpAddr::V4(self.address)
    }

    /// The network namespace's name (`ip netns exec NAME …`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Cuts the host off from the gateway and every other host: its link goes down, packets to
    /// and from it are dropped, open connections stay open on both sides without an error.
    pub fn cut(&self) -> std::io::Result<()> {
        ip(&["link", "set", &self.outside, "down"])
    }

    /// Undoes [`cut`](Self::cut): the link comes up and retransmissions get through. Returns
    /// once the root namespace has exchanged packets with the host again (at most 5 s), so a
    /// connection opened after `heal` returns gets through at once; connections that
    /// retransmitted into the cut resume at their next retransmission, which TCP's backoff may
    /// put seconds away.
    ///
    /// The link's state alone says too little: the kernel may report the veth and its bridge
    /// port up and forwarding while the host's end still drops what it sends, for up to a
    /// second after a link change. So `heal` knocks on a closed port of the host until the
    /// host's kernel answers (with a refusal, or with a connection if something listens there).
    pub fn heal(&self) -> std::io::Result<()> {
        ip(&["link", "set", &self.outside, "up"])?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let knock = std::net::SocketAddr::new(self.ip(), HEAL_KNOCK_PORT);
        loop {
            match std::net::TcpStream::connect_timeout(&knock, std::time::Duration::from_millis(50)) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(()),
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => {
                    return Err(std::io::Error::other(format!(
                        "{} ({}) did not answer within 5 s of its link coming back up: {e}",
                        self.namespace, self.address
                    )));
                }
            }
        }
    }

    /// Loses everything the host sends, from now until [`stop_dropping`](Self::stop_dropping):
    /// its requests never arrive, while what others send still reaches it. Connections stay
    /// open; a TCP peer of the host sees silence, and the host's own TCP, told each segment went
    /// out, retransmits into the loss with its usual backoff.
    pub fn drop_sent(&self) -> std::io::Result<()> {
        tc(&["-n", &self.namespace, "qdisc", "replace", "dev", &self.inside, "root", "blackhole"])
    }

    /// Loses everything sent to the host, from now until [`stop_dropping`](Self::stop_dropping):
    /// its requests arrive and are carried out, and every answer is lost on the way back.
    pub fn drop_received(&self) -> std::io::Result<()> {
        tc(&["qdisc", "replace", "dev", &self.outside, "root", "blackhole"])
    }

    /// Ends [`drop_sent`](Self::drop_sent) and [`drop_received`](Self::drop_received) (either,
    /// both or neither in force): both ends of the pair send at once again, as a veth does.
    pub fn stop_dropping(&self) -> std::io::Result<()> {
        tc(&["-n", &self.namespace, "qdisc", "replace", "dev", &self.inside, "root", "noqueue"])?;
        tc(&["qdisc", "replace", "dev", &self.outside, "root", "noqueue"])
    }

    /// Whether process `pid` is on this host (in its network namespace): how a caller that
    /// started a program through [`command`](Self::command) learns that `ip netns exec` has
    /// become it, and that a fault on the host reaches it.
    pub fn runs(&self, pid: u32) -> std::io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let theirs = std::fs::metadata(format!("/proc/{pid}/ns/net"))?;
        let ours = std::fs::metadata(format!("/var/run/netns/{}", self.namespace))?;
        Ok(theirs.dev() == ours.dev() && theirs.ino() == ours.ino())
    }

    /// `program` to be run on this host (through `ip netns exec`, which becomes the program:
    /// the child's pid is the program's).
    pub fn command(&self, program: &str) -> Command {
        exec_in(&self.namespace, program)
    }

    /// A tokio runtime (2 workers) whose threads, blocking pool included, entered this host's
    /// network namespace before running anything: clients built and used by tasks spawned on
    /// it connect from this host.
    pub fn runtime(&self) -> std::io::Result<HostRuntime> {
        let path = format!("/var/run/netns/{}", self.namespace);
        // Opened once, so a thread that cannot enter the namespace is a hard error below
        // rather than a client silently left in the root namespace.
        let file = std::sync::Arc::new(std::fs::File::open(&path)?);
        let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (enter, count, flag) =
            (std::sync::Arc::clone(&file), std::sync::Arc::clone(&started), std::sync::Arc::clone(&failed));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .enable_all()
            .on_thread_start(move || {
                if nix::sched::setns(&*enter, nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
                    flag.store(true, Ordering::SeqCst);
                }
                count.fetch_add(1, Ordering::SeqCst);
            })
            .build()?;
        // The workers start with the runtime: wait until they have entered (or failed to).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while started.load(Ordering::SeqCst) < WORKERS && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if failed.load(Ordering::SeqCst) || started.load(Ordering::SeqCst) < WORKERS {
            runtime.shutdown_background();
            return Err(std::io::Error::other(format!(
                "the runtime's threads could not enter the network namespace {path}"
            )));
        }
        Ok(HostRuntime { handle: runtime.handle().clone(), runtime: Some(runtime) })
    }
}

/// A tokio runtime on a [`Host`] ([`Host::runtime`]). Only tasks *spawned* on it run on the
/// host: `tokio::runtime::Runtime::block_on` would poll its future on the calling thread, in the
/// caller's namespace, which is why this type does not offer it ([`run`](Self::run) spawns).
/// Dropping it shuts it down without waiting, which is allowed inside another runtime.
#[derive(Debug)]
pub struct HostRuntime {
    handle: tokio::runtime::Handle,
    /// Taken on drop only.
    runtime: Option<tokio::runtime::Runtime>,
}

impl HostRuntime {
    /// Spawns `future` on the host.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle().spawn(future)
    }

    /// A handle to spawn on the host from anywhere.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.handle.clone()
    }

    /// Runs `future` on the host and waits for it, from a thread outside any runtime; `Err`
    /// if it panicked.
    pub fn run<F>(&self, future: F) -> Result<F::Output, tokio::task::JoinError>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.block_on(self.spawn(future))
    }
}

impl Drop for HostRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.outside]);
        let _ = ip(&["netns", "del", &self.namespace]);
    }
}

/// `program` in the network namespace `namespace`, through `ip netns exec`.
pub(crate) fn exec_in(namespace: &str, program: &str) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", namespace, program]);
    command
}

/// Runs `ip ARGS`; an error carries what it printed (and a hint when `ip` is missing or we
/// are not root).
fn ip(args: &[&str]) -> std::io::Result<()> {
    iproute2("ip", args)
}

/// Runs `tc ARGS` (iproute2's traffic control), as [`ip`] does.
fn tc(args: &[&str]) -> std::io::Result<()> {
    iproute2("tc", args)
}

fn iproute2(program: &str, args: &[&str]) -> std::io::Result<()> {
    let output = Command::new(program).args(args).stdin(Stdio::null()).output().map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "running `{program} {}`: {e} (network namespaces need iproute2, which the test command installs)",
                args.join(" ")
            ),
        )
    })?;
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let hint = if said.contains("Operation not permitted") { " (network namespaces need root)" } else { "" };
    Err(std::io::Error::other(format!("`{program} {}` failed: {}{hint}", args.join(" "), said.trim())))
}

/// A third octet for `10.231.X.0/24` that no interface of the root namespace uses yet, claimed
/// for this process ([`crate::claims`]): labs that processes running side by side create at the
/// same moment, before either bridge has its address, get different subnets. Where claims
/// cannot be made, only the interfaces are looked at.
fn free_subnet() -> std::io::Result<(u8, Option<crate::claims::Claim>)> {
    let output = Command::new("ip").args(["-4", "-o", "addr", "show"]).output()?;
    let used = String::from_utf8_lossy(&output.stdout).into_owned();
    for _ in 0..100 {
        let mut byte = [0u8; 1];
        let _ = getrandom::fill(&mut byte);
        let x = byte[0].clamp(1, 254);
        if used.contains(&format!("{}.{}.{x}.", FIRST_OCTETS[0], FIRST_OCTETS[1])) {
            continue;
        }
        match crate::claims::try_claim(&format!("subnet-{x}")) {
            Ok(Some(claim)) => return Ok((x, Some(claim))),
            Ok(None) => continue,
            Err(_) => return Ok((x, None)),
        }
    }
    Err(std::io::Error::other("no free 10.231.X.0/24 subnet"))
}

fn random_hex(chars: usize) -> String {
    let mut bytes = vec![0u8; chars.div_ceil(2)];
    let _ = getrandom::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()[..chars].to_string()
}
