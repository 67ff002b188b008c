//! The store relay: [`StoreRelay`] and its client, [`RelayStore`].

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use palisade_core::{Fence, FencedStore, GrantFence, GrantId, Record, ResourceKey, Result, WriteBatch, WriteOp};

use super::RelayRetry;
use super::wire::{self, BACKEND, Channel, Handler, fence_text, parse_fence, proto_err};
use crate::FencedStoreFactory;

/// A loopback relay that lets client processes use a fenced store living in the parent's memory
/// (the memory reference store, a broken store of a test, or yours), as `palisade torture`'s
/// clients do with `--store relay://IP:PORT`.
///
/// Each connection gets a client of its own from the relayed store's factory
/// ([`FencedStoreFactory::client`]), as each process of a real deployment has its own: a store
/// that keeps state in its client (a watermark cached in memory) shows it. Requests whose reply
/// was lost are resent with their id and answered from the reply cache, as the lock relay's are
/// (see [`Relay`](super::Relay)), so a lost reply never applies a batch twice.
///
/// Wire format (keys, values and prefixes in hex; a fence as `resource=fence=grant`, the grant id
/// in hex; a record as `value.fence|-`, or `-` when absent; an operation as `P.key.value`
/// (put), `C.key.value` (create), `D.key` (delete), `K.key.value` (check it holds `value`) or
/// `A.key` (check it is absent)):
/// `id STORE` → `STORE live=true|false` (whether fenced writes require a live lock);
/// `id APPLY fence op…`, `id APPLYALL fence,fence…|- op…`, `id UNFENCED op…` → `OK`;
/// `id WATERMARK resource` → `FENCE fence|-`; `id READ key` and `id READMANY key…` →
/// `RECS record…`; `id LIST prefix` → `LISTED key.value.fence|-…`; any request
/// → `ERR …` as the lock relay's, with a refusal's fences and resource.
///
/// Dropping it stops accepting connections.
#[derive(Debug)]
pub struct StoreRelay(wire::Listening);

impl StoreRelay {
    /// Serves the store `factory` makes clients of on an ephemeral port of 127.0.0.1: one client
    /// per connection.
    pub async fn serve<F: FencedStoreFactory + 'static>(factory: Arc<F>) -> Result<StoreRelay> {
        let listening = wire::serve(move || {
            let factory = Arc::clone(&factory);
            async move { Ok(StoreHandler(factory.client().await?)) }
        })
        .await?;
        Ok(StoreRelay(listening))
    }

    /// The address to hand to the client processes (`relay://ADDR`).
    pub fn addr(&self) -> SocketAddr {
        self.0.addr
    }
}

/// One connection's side: its own client of the relayed store.
struct StoreHandler<S>(Arc<S>);

#[async_trait]
impl<S: FencedStore> Handler for StoreHandler<S> {
    async fn handle(&self, request: &str) -> Result<String> {
        let store = &*self.0;
        let mut parts = request.split(' ');
        let verb = parts.next().unwrap_or("");
        let args: Vec<&str> = parts.collect();
        match (verb, args.as_slice()) {
            ("STORE", []) => Ok(format!("STORE live={}", store.requires_live_lock())),
            ("APPLY", [fence, ops @ ..]) => {
                let (resource, fence) = parse_grant_fence(fence)?;
                store.apply(&resource, fence, &parse_batch(ops)?).await.map(|()| "OK".to_string())
            }
            ("APPLYALL", [fences, ops @ ..]) => {
                let fences = match *fences {
                    "-" => Vec::new(),
                    fences => fences.split(',').map(parse_grant_fence).collect::<Result<Vec<_>>>()?,
                };
                store.apply_all(&fences, &parse_batch(ops)?).await.map(|()| "OK".to_string())
            }
            ("UNFENCED", ops) => store.apply_unfenced(&parse_batch(ops)?).await.map(|()| "OK".to_string()),
            ("WATERMARK", [resource]) => {
                let resource = palisade_core::spi::parse_any_resource_key(resource)?;
                Ok(format!("FENCE {}", fence_text(store.watermark(&resource).await?)))
            }
            ("READ", [key]) => Ok(format!("RECS {}", record_text(store.read(&unhex_text(key)?).await?.as_ref()))),
            ("READMANY", keys) => {
                let keys = keys.iter().map(|k| unhex_text(k)).collect::<Result<Vec<_>>>()?;
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let records = store.read_many(&keys).await?;
                Ok(records.iter().fold(String::from("RECS"), |mut reply, r| {
                    reply.push(' ');
                    reply.push_str(&record_text(r.as_ref()));
                    reply
                }))
            }
            ("LIST", [prefix]) => {
                let listed = store.list(&unhex_text(prefix)?).await?;
                Ok(listed.iter().fold(String::from("LISTED"), |mut reply, (key, r)| {
                    reply.push_str(&format!(" {}.{}", hex(key.as_bytes()), record_text(Some(r))));
                    reply
                }))
            }
            _ => Err(proto_err("unknown store request")),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Result<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return Err(proto_err("odd hex"));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .filter(|pair| pair.bytes().all(|b| b.is_ascii_hexdigit())) // `from_str_radix` takes a '+'
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| proto_err("bad hex"))
        })
        .collect()
}

fn unhex_text(text: &str) -> Result<String> {
    String::from_utf8(unhex(text)?).map_err(|_| proto_err("a key that is not UTF-8"))
}

fn grant_fence_text(resource: &ResourceKey, fence: GrantFence) -> String {
    format!("{resource}={}={}", fence.fence(), hex(fence.grant().as_bytes()))
}

fn parse_grant_fence(text: &str) -> Result<(ResourceKey, GrantFence)> {
    let mut parts = text.split('=');
    let (Some(resource), Some(fence), Some(grant), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(proto_err("bad fence"));
    };
    let resource = palisade_core::spi::parse_any_resource_key(resource)?;
    let fence = parse_fence(fence)?.ok_or_else(|| proto_err("missing fence"))?;
    let grant = GrantId::from_slice(&unhex(grant)?).ok_or_else(|| proto_err("bad grant id"))?;
    Ok((resource, GrantFence::new(fence, grant)))
}

/// `value.fence|-`, or `-` for no record.
fn record_text(record: Option<&Record>) -> String {
    record.map_or_else(|| "-".to_string(), |r| format!("{}.{}", hex(&r.value), fence_text(r.fence)))
}

fn parse_record(text: &str) -> Result<Option<Record>> {
    if text == "-" {
        return Ok(None);
    }
    let (value, fence) = text.split_once('.').ok_or_else(|| proto_err("bad record"))?;
    Ok(Some(Record { value: unhex(value)?, fence: parse_fence(fence)? }))
}

fn batch_text(batch: &WriteBatch) -> String {
    let op = |op: &WriteOp| match op {
        WriteOp::Put { key, value } => format!("P.{}.{}", hex(key.as_bytes()), hex(value)),
        WriteOp::Create { key, value } => format!("C.{}.{}", hex(key.as_bytes()), hex(value)),
        WriteOp::Delete { key } => format!("D.{}", hex(key.as_bytes())),
        WriteOp::Check { key, expected: Some(value) } => format!("K.{}.{}", hex(key.as_bytes()), hex(value)),
        WriteOp::Check { key, expected: None } => format!("A.{}", hex(key.as_bytes())),
    };
    batch.ops().iter().map(op).collect::<Vec<_>>().join(" ")
}

/// The batch as sent: not validated here, so that the relayed store judges it as it would
/// any other caller's.
fn parse_batch(ops: &[&str]) -> Result<WriteBatch> {
    ops.iter().filter(|op| !op.is_empty()).try_fold(WriteBatch::new(), |batch, op| {
        let parts: Vec<&str> = op.split('.').collect();
        Ok(match parts.as_slice() {
            ["P", key, value] => batch.put(unhex_text(key)?, unhex(value)?),
            ["C", key, value] => batch.create(unhex_text(key)?, unhex(value)?),
            ["D", key] => batch.delete(unhex_text(key)?),
            ["K", key, value] => batch.check(unhex_text(key)?, Some(unhex(value)?)),
            ["A", key] => batch.check(unhex_text(key)?, None),
            _ => return Err(proto_err("bad operation")),
        })
    })
}

/// A client process's side: a [`FencedStore`] whose calls go to a [`StoreRelay`], each
/// answered as the relayed store answered it (a refusal with its kind, fences and resource).
/// Its [`backend`](FencedStore::backend) is `relay`.
#[derive(Debug)]
pub struct RelayStore {
    channel: Channel,
    live: bool,
}

impl RelayStore {
    /// Connects to the store relay at `addr` and asks what the relayed store declares.
    pub async fn connect(addr: SocketAddr) -> Result<RelayStore> {
        let channel = Channel::open(addr, RelayRetry::SameRequest).await?;
        let reply = channel.call("STORE".to_string()).await?;
        let live = match reply.as_str() {
            "STORE live=true" => true,
            "STORE live=false" => false,
            _ => return Err(proto_err("bad STORE reply (is this a lock relay?)")),
        };
        Ok(RelayStore { channel, live })
    }

    async fn ok(&self, request: String) -> Result<()> {
        match self.channel.call(request).await?.as_str() {
            "OK" => Ok(()),
            _ => Err(proto_err("bad reply to a write")),
        }
    }

    async fn records(&self, request: String, expected: usize) -> Result<Vec<Option<Record>>> {
        let reply = self.channel.call(request).await?;
        let mut parts = reply.split(' ');
        if parts.next() != Some("RECS") {
            return Err(proto_err("bad RECS reply"));
        }
        let records = parts.map(parse_record).collect::<Result<Vec<_>>>()?;
        if records.len() != expected {
            return Err(proto_err("a RECS reply with another count of records than asked"));
        }
        Ok(records)
    }
}

/// The `op…` of a write request: nothing for an empty batch.
fn with_ops(request: String, batch: &WriteBatch) -> String {
    if batch.is_empty() { request } else { format!("{request} {}", batch_text(batch)) }
}

#[async_trait]
impl FencedStore for RelayStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn requires_live_lock(&self) -> bool {
        self.live
    }

    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.ok(with_ops(format!("APPLY {}", grant_fence_text(resource, fence)), batch)).await
    }

    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        // An empty set goes as `-`: the relayed store judges it as it would any caller's.
        let fences = if fences.is_empty() {
            "-".to_string()
        } else {
            fences.iter().map(|(r, f)| grant_fence_text(r, *f)).collect::<Vec<_>>().join(",")
        };
        self.ok(with_ops(format!("APPLYALL {fences}"), batch)).await
    }

    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        self.ok(with_ops("UNFENCED".to_string(), batch)).await
    }

    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        let reply = self.channel.call(format!("WATERMARK {resource}")).await?;
        parse_fence(reply.strip_prefix("FENCE ").ok_or_else(|| proto_err("bad FENCE reply"))?)
    }

    async fn read(&self, key: &str) -> Result<Option<Record>> {
        let mut records = self.records(format!("READ {}", hex(key.as_bytes())), 1).await?;
        Ok(records.pop().flatten())
    }

    async fn read_many(&self, keys: &[&str]) -> Result<Vec<Option<Record>>> {
        let request = keys.iter().fold(String::from("READMANY"), |mut request, key| {
            request.push(' ');
            request.push_str(&hex(key.as_bytes()));
            request
        });
        self.records(request, keys.len()).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        let reply = self.channel.call(format!("LIST {}", hex(prefix.as_bytes()))).await?;
        let mut parts = reply.split(' ');
        if parts.next() != Some("LISTED") {
            return Err(proto_err("bad LISTED reply"));
        }
        parts
            .map(|item| {
                let (key, record) = item.split_once('.').ok_or_else(|| proto_err("bad listed record"))?;
                let record = parse_record(record)?.ok_or_else(|| proto_err("a listed key without a record"))?;
                Ok((unhex_text(key)?, record))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is the failure report

    use super::*;
    use crate::memory::MemoryStoreFactory;

    #[test]
    fn batches_cross_the_wire_whole() {
        let batch = WriteBatch::new()
            .put("a key/with spaces", b"v 1\n".to_vec())
            .create("b", Vec::new())
            .delete("c")
            .check("d", Some(b"x".to_vec()))
            .check("e", None);
        let text = batch_text(&batch);
        let back = parse_batch(&text.split(' ').collect::<Vec<_>>()).unwrap();
        assert_eq!(back.ops(), batch.ops());
        assert!(parse_batch(&["P.6b"]).is_err(), "a put without a value is a protocol error");
        assert!(parse_batch(&["P.6.00"]).is_err(), "odd hex is a protocol error");
        assert!(parse_batch(&["P.+f.00"]).is_err(), "a sign is not hex");
        let record = Record { value: b"\x00\xff".to_vec(), fence: Some(Fence::new(12)) };
        assert_eq!(parse_record(&record_text(Some(&record))).unwrap(), Some(record));
        assert_eq!(parse_record(&record_text(None)).unwrap(), None);
    }

    /// The memory store served by the relay passes every store scenario: the relay neither
    /// hides a refusal nor changes what the store answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_memory_store_through_the_relay_passes_every_store_scenario() {
        let relay = StoreRelay::serve(Arc::new(MemoryStoreFactory::new())).await.unwrap();
        let addr = relay.addr();
        let relayed = crate::store_factory(move || async move { Ok(Arc::new(RelayStore::connect(addr).await?)) });
        let reports = crate::run_store_scenarios(&relayed).await.unwrap();
        assert_eq!(reports.len(), 10);
    }

    #[tokio::test]
    async fn a_lock_relay_is_not_taken_for_a_store() {
        let relay = super::super::Relay::serve(Arc::new(palisade_core::MemoryLockService::default())).await.unwrap();
        let error = RelayStore::connect(relay.addr()).await.unwrap_err();
        assert!(error.message().contains("lock relay") || error.message().contains("unknown"), "{error}");
    }
}
