//! Waking waiters when a lock is released: one pattern subscription per client.
//!
//! The release script publishes on `palisade:released:<lock key>`. Each client keeps one
//! pub/sub connection subscribed to `palisade:released:*` and wakes the local waiters of that
//! key. Notifications are an optimisation: a waiter also wakes when the holder's TTL runs out
//! and at least every 250 ms, so a lost message or a broken subscription only costs latency.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::debug;

const PATTERN: &str = "palisade:released:*";

type Registry = Arc<Mutex<HashMap<String, Weak<Notify>>>>;

pub(crate) struct Waiters {
    client: redis::Client,
    registry: Registry,
    /// The listener task, and whether its subscription is live.
    listener: Mutex<Option<(JoinHandle<()>, watch::Receiver<bool>)>>,
}

impl Waiters {
    pub(crate) fn new(client: redis::Client) -> Self {
        Waiters { client, registry: Arc::default(), listener: Mutex::new(None) }
    }

    pub(crate) fn channel(lock_key: &str) -> String {
        const PREFIX: &str = "palisade:released:";
        let mut channel = String::with_capacity(PREFIX.len() + lock_key.len());
        channel.push_str(PREFIX);
        channel.push_str(lock_key);
        channel
    }

    /// Waits (up to `limit`) until the subscription is live, starting it if it is not running.
    ///
    /// A waiter that relies on a subscription still being set up (a TLS handshake, then
    /// `PSUBSCRIBE`) misses a release published meanwhile and only finds out at its next poll.
    pub(crate) async fn ready(&self, limit: Duration) {
        let mut live = self.ensure_listener();
        let _ = tokio::time::timeout(limit, live.wait_for(|live| *live)).await;
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

    /// Starts the listener if it is not running; returns whether its subscription is live.
    fn ensure_listener(&self) -> watch::Receiver<bool> {
        let mut listener = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((task, live)) = listener.as_ref()
            && !task.is_finished()
        {
            return live.clone();
        }
        let (client, registry) = (self.client.clone(), Arc::clone(&self.registry));
        let (live_tx, live) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut pubsub = match client.get_async_pubsub().await {
                Ok(p) => p,
                Err(e) => return debug!(error = %e, "release notifications unavailable; waiters poll"),
            };
            if let Err(e) = pubsub.psubscribe(PATTERN).await {
                return debug!(error = %e, "release subscription failed; waiters poll");
            }
            live_tx.send_replace(true);
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let waiters = registry
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(msg.get_channel_name())
                    .and_then(Weak::upgrade);
                if let Some(notify) = waiters {
                    notify.notify_waiters();
                }
            }
            live_tx.send_replace(false);
            debug!("release subscription closed; it restarts with the next waiter");
        });
        *listener = Some((task, live.clone()));
        live
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        if let Some((task, _)) = self.listener.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}
