//! Waking waiters when a lock is released: one pattern subscription per client.
//!
//! The release script publishes on `palisade:released:<lock key>`. Each client keeps one
//! pub/sub connection subscribed to `palisade:released:*` and wakes the local waiters of that
//! key. Notifications are an optimisation: a waiter also wakes when the holder's TTL runs out
//! and at least every 250 ms, so a lost message or a broken subscription only costs latency.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::debug;

const PATTERN: &str = "palisade:released:*";

type Registry = Arc<Mutex<HashMap<String, Weak<Notify>>>>;

pub(crate) struct Waiters {
    client: redis::Client,
    registry: Registry,
    listener: Mutex<Option<JoinHandle<()>>>,
}

impl Waiters {
    pub(crate) fn new(client: redis::Client) -> Self {
        Waiters { client, registry: Arc::default(), listener: Mutex::new(None) }
    }

    pub(crate) fn channel(lock_key: &str) -> String {
        format!("palisade:released:{lock_key}")
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

    fn ensure_listener(&self) {
        let mut listener = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        if listener.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (client, registry) = (self.client.clone(), Arc::clone(&self.registry));
        *listener = Some(tokio::spawn(async move {
            let mut pubsub = match client.get_async_pubsub().await {
                Ok(p) => p,
                Err(e) => return debug!(error = %e, "release notifications unavailable; waiters poll"),
            };
            if let Err(e) = pubsub.psubscribe(PATTERN).await {
                return debug!(error = %e, "release subscription failed; waiters poll");
            }
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
            debug!("release subscription closed; it restarts with the next waiter");
        }));
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        if let Some(task) = self.listener.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}
