//! The lab the partition scenarios stand on: hosts reach each other and the gateway, a cut host
//! reaches nobody and nobody reaches it, a healed one is back, and a host's runtime really
//! opens its sockets on the host. (Needs root, as CI has: an error otherwise, never a skip.)

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use palisade_lab::netns::Lab;

/// How long a connection may take to be called made: a working path answers in microseconds,
/// so this is only an allowance for a loaded machine (CI's), and the price of each "unreachable".
const CONNECT: Duration = Duration::from_secs(1);

fn reachable(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, CONNECT).is_ok()
}

#[test]
fn hosts_reach_each_other_until_cut() {
    let lab = Lab::new().expect("a lab (root and iproute2)");
    let a = lab.host().unwrap();
    let b = lab.host().unwrap();
    let on_a = a.runtime().unwrap();
    // Binding a's address succeeds only inside a's namespace: the runtime's threads are there.
    let listener = on_a.run(tokio::net::TcpListener::bind((a.ip(), 0))).unwrap().expect("bind on host a");
    let addr = listener.local_addr().unwrap();
    assert!(
        std::net::TcpListener::bind((a.ip(), 0)).is_err(),
        "the root namespace has host a's address: the host is not a namespace of its own"
    );
    let accepting = on_a.spawn(async move {
        loop {
            if listener.accept().await.is_err() {
                break;
            }
        }
    });
    let on_b = b.runtime().unwrap();
    let from_b = move || {
        on_b.run(async move {
            tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect(addr)).await.is_ok_and(|c| c.is_ok())
        })
        .unwrap()
    };

    assert!(reachable(addr), "the root namespace reaches host a through the bridge");
    assert!(from_b(), "host b reaches host a");

    a.cut().unwrap();
    assert!(!reachable(addr), "a cut host is reachable from the root namespace");
    assert!(!from_b(), "a cut host is reachable from another host");

    // Healed means usable at once: no retrying here (the kernel may drop a healed veth's
    // traffic for up to a second after the link change, which `heal` waits out).
    a.heal().unwrap();
    assert!(reachable(addr), "a healed host is unreachable from the root namespace");
    assert!(from_b(), "a healed host is unreachable from another host");

    // A host reaches a server of the root namespace bound to the gateway.
    let at_gateway = std::net::TcpListener::bind((lab.gateway(), 0)).unwrap();
    let gateway = at_gateway.local_addr().unwrap();
    let on_a2 = a.runtime().unwrap();
    let reached = on_a2
        .run(async move {
            tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect(gateway)).await.is_ok_and(|c| c.is_ok())
        })
        .unwrap();
    assert!(reached, "host a reaches the gateway");
    accepting.abort();

    // A program started on a host runs there, and nothing else does.
    let mut sleeper = a.command("sleep").arg("30").spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !a.runs(sleeper.id()).unwrap() {
        assert!(std::time::Instant::now() < deadline, "a program started on host a is not on it");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!b.runs(sleeper.id()).unwrap(), "a program on host a is on host b too");
    assert!(!a.runs(std::process::id()).unwrap(), "the test itself is on host a");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

#[test]
fn one_way_loss_drops_one_way_only() {
    let lab = Lab::new().expect("a lab (root and iproute2)");
    let a = lab.host().unwrap();
    let on_a = a.runtime().unwrap();
    let at_a = std::sync::Arc::new(on_a.run(tokio::net::UdpSocket::bind((a.ip(), 0))).unwrap().expect("bind on a"));
    let a_addr = at_a.local_addr().unwrap();
    let at_gateway = std::net::UdpSocket::bind((lab.gateway(), 0)).unwrap();
    at_gateway.set_read_timeout(Some(CONNECT)).unwrap();
    let gateway = at_gateway.local_addr().unwrap();
    // Datagrams, not connections: one way of a connection is lost with the other's answers.
    let to_a = || {
        at_gateway.send_to(b"to a", a_addr).unwrap();
        let socket = std::sync::Arc::clone(&at_a);
        on_a.run(async move {
            let mut buf = [0u8; 16];
            tokio::time::timeout(CONNECT, socket.recv_from(&mut buf)).await.is_ok_and(|r| r.is_ok())
        })
        .unwrap()
    };
    let from_a = || {
        let socket = std::sync::Arc::clone(&at_a);
        on_a.run(async move { socket.send_to(b"from a", gateway).await }).unwrap().unwrap();
        let mut buf = [0u8; 16];
        at_gateway.recv_from(&mut buf).is_ok()
    };
    assert!(to_a() && from_a(), "both ways before any loss");

    a.drop_sent().unwrap();
    assert!(to_a(), "what others send still reaches a host that loses what it sends");
    assert!(!from_a(), "a host that loses what it sends was heard");
    a.stop_dropping().unwrap();
    assert!(to_a() && from_a(), "both ways once the loss ends");

    a.drop_received().unwrap();
    assert!(!to_a(), "a host that loses what it receives received");
    assert!(from_a(), "what a host that loses what it receives sends still arrives");
    a.stop_dropping().unwrap();
    a.stop_dropping().unwrap();
    assert!(to_a() && from_a(), "both ways once the loss ends (ending it twice is no error)");
}
