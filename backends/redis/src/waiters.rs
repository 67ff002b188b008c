//! Waking waiters when a lock is released: one pattern subscription per client, kept on the
//! server that publishes.
//!
//! The release script publishes on `palisade:released:<lock key>` (when a waiter marked the
//! lock: `scripts::WAITED_ON`). Each client keeps one
//! pub/sub connection subscribed to `palisade:released:*` and wakes the local waiters of that
//! key. Notifications are an optimisation: a waiter also wakes when the holder's TTL runs out
//! and at least every 250 ms, so a lost message or a broken subscription only costs latency.
//!
//! The subscription follows its [`Source`]: behind Sentinel it is made on the master the
//! Sentinels name at each (re)subscription, on a cluster on the seeds in turn. A subscription
//! that ends, or whose server stops answering `PING` (a black-holed address), is made again,
//! at once when the service has followed a failover, otherwise after a pause that doubles up
//! to [`RETRY_MAX`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::sentinel::SentinelTarget;

const PATTERN: &str = "palisade:released:*";
/// How often a live subscription's server is asked `PING`: a server that no longer answers
/// (a black-holed address) is left within this plus the ping's timeout.
const PING_EVERY: Duration = Duration::from_secs(1);
/// The first pause before subscribing again after a failure; it doubles up to `RETRY_MAX`.
const RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest pause between two subscription attempts.
const RETRY_MAX: Duration = Duration::from_secs(2);
/// How long one Sentinel may take to name the master (the whole attempt is bounded by the
/// connect timeout).
const SENTINEL_ASK: Duration = Duration::from_millis(500);

type Registry = Arc<Mutex<HashMap<String, Weak<Notify>>>>;

/// Where release notifications are heard.
pub(crate) enum Source {
    /// One server (`redis://`, `rediss://`).
    Server(redis::Client),
    /// The master the Sentinels name, asked again at every (re)subscription.
    Sentinel(SentinelTarget),
    /// A cluster's nodes, tried in turn: a cluster's `PUBLISH` reaches every node.
    Cluster(Vec<redis::Client>),
}

/// Where the subscription stands, for [`Waiters::ready`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The first attempt on a server: the first of the service, or the first on the master it
    /// just followed. Waiters wait for it (briefly): it is expected to succeed.
    Starting,
    /// Subscribed: releases are heard.
    Live,
    /// The last attempt failed or the subscription ended; attempts go on in the background
    /// and waiters poll meanwhile instead of waiting for them.
    Down,
}

/// How long the listener may take, from the service's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    /// For one subscription attempt: asking the Sentinels, connecting and subscribing.
    pub(crate) connect: Duration,
    /// For a `PING` on the live subscription.
    pub(crate) ping: Duration,
}

pub(crate) struct Waiters {
    source: Arc<Source>,
    patience: Patience,
    registry: Registry,
    state: watch::Sender<State>,
    /// Signalled when the service followed a failover: subscribe again now, on the new master.
    moved: Arc<Notify>,
    /// The listener task, started on first use.
    listener: Mutex<Option<JoinHandle<()>>>,
}

impl Waiters {
    pub(crate) fn new(source: Source, patience: Patience) -> Self {
        Waiters {
            source: Arc::new(source),
            patience,
            registry: Arc::default(),
            state: watch::Sender::new(State::Starting),
            moved: Arc::default(),
            listener: Mutex::new(None),
        }
    }

    pub(crate) fn channel(lock_key: &str) -> String {
        const PREFIX: &str = "palisade:released:";
        let mut channel = String::with_capacity(PREFIX.len() + lock_key.len());
        channel.push_str(PREFIX);
        channel.push_str(lock_key);
        channel
    }

    /// Waits (up to `limit`) while the subscription is being made on a server expected to
    /// answer (the service's first, or a master it just followed), starting the listener if
    /// it is not running. Returns at once when the subscription is live, and when it is down
    /// (its server does not answer): a waiter then polls instead of waiting for it.
    ///
    /// A waiter that relies on a subscription still being set up (a TLS handshake, then
    /// `PSUBSCRIBE`) misses a release published meanwhile and only finds out at its next poll.
    pub(crate) async fn ready(&self, limit: Duration) {
        self.ensure_listener();
        let mut state = self.state.subscribe();
        let _ = tokio::time::timeout(limit, state.wait_for(|s| *s != State::Starting)).await;
    }

    /// The notifier for `channel`, starting the subscription if it is not running.
    pub(crate) fn watch(&self, channel: &str) -> Arc<Notify> {
        self.ensure_listener();
        let mut map = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = map.get(channel).and_then(Weak::upgrade) {
            return existing;
        }
        if map.len() > 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let notify = Arc::new(Notify::new());
        map.insert(channel.to_string(), Arc::downgrade(&notify));
        notify
    }

    /// The service followed a failover to a new master: subscribe there now, and let
    /// waiters wait briefly for it as for the first subscription.
    pub(crate) fn moved(&self) {
        self.state.send_replace(State::Starting);
        self.moved.notify_one();
    }

    /// Starts the listener if it is not running.
    fn ensure_listener(&self) {
        let mut listener = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        if listener.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let (source, registry, moved) = (Arc::clone(&self.source), Arc::clone(&self.registry), Arc::clone(&self.moved));
        let (state, patience) = (self.state.clone(), self.patience);
        *listener = Some(tokio::spawn(listen(source, registry, state, moved, patience)));
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        if let Some(task) = self.listener.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

/// Subscribes, wakes waiters for as long as the subscription lives, and subscribes again,
/// for as long as the service lives.
async fn listen(
    source: Arc<Source>,
    registry: Registry,
    state: watch::Sender<State>,
    moved: Arc<Notify>,
    patience: Patience,
) {
    let mut next_node = 0;
    let mut pause = RETRY_MIN;
    loop {
        let subscribed = tokio::time::timeout(patience.connect, subscribe(&source, next_node)).await;
        let failure = match subscribed {
            Ok(Ok(pubsub)) => {
                state.send_replace(State::Live);
                pause = RETRY_MIN;
                if hear(pubsub, &registry, &moved, patience.ping).await == Ended::Moved {
                    // `moved` set `Starting`: waiters wait for the new master's subscription.
                    continue;
                }
                None
            }
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("no subscription within {:?}", patience.connect)),
        };
        if let Some(e) = failure {
            debug!(error = %e, "release notifications unavailable; waiters poll");
        }
        // On a cluster, the next node is tried next: the last one failed or its subscription ended.
        next_node = next_node.wrapping_add(1);
        state.send_if_modified(|s| std::mem::replace(s, State::Down) != State::Down);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = moved.notified() => {}
        }
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// Why [`hear`] returned.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The subscription closed or its server stopped answering.
    Lost,
    /// The service followed a failover.
    Moved,
}

/// One subscription to `palisade:released:*` on the server `source` names now (on a
/// cluster, node `node`, modulo their number).
async fn subscribe(source: &Source, node: usize) -> Result<redis::aio::PubSub, String> {
    let client = match source {
        Source::Server(client) => client.clone(),
        Source::Sentinel(target) => {
            let (url, _) = target.master_url(SENTINEL_ASK).await.map_err(|e| e.to_string())?;
            redis::Client::open(url.as_str()).map_err(|e| e.to_string())?
        }
        Source::Cluster(nodes) => nodes.get(node % nodes.len().max(1)).ok_or("no cluster node listed")?.clone(),
    };
    let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
    pubsub.psubscribe(PATTERN).await.map_err(|e| e.to_string())?;
    Ok(pubsub)
}

/// Wakes the waiters of each released key until the subscription ends, its server stops
/// answering `PING` within `ping_limit`, or the service follows a failover.
async fn hear(pubsub: redis::aio::PubSub, registry: &Registry, moved: &Notify, ping_limit: Duration) -> Ended {
    let (mut sink, mut messages) = pubsub.split();
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = messages.next() => {
                let Some(msg) = message else {
                    debug!("release subscription closed; subscribing again");
                    return Ended::Lost;
                };
                let waiters = registry
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(msg.get_channel_name())
                    .and_then(Weak::upgrade);
                if let Some(notify) = waiters {
                    notify.notify_waiters();
                }
            }
            _ = ping.tick() => {
                let answered = tokio::time::timeout(ping_limit, sink.ping::<redis::Value>()).await;
                if !matches!(answered, Ok(Ok(_))) {
                    debug!("the release subscription's server does not answer PING; subscribing again");
                    return Ended::Lost;
                }
            }
            () = moved.notified() => {
                debug!("followed a failover; subscribing on the new master");
                return Ended::Moved;
            }
        }
    }
}
