//! The fuzz targets ([`targets`]: one `run(&[u8])` each) and what they share: the property
//! checks (stated once, with the property tests), write batches drawn from fuzz input, and a
//! DynamoDB endpoint that answers whatever the fuzz input says, so that the adapter's requests
//! and its reading of replies go through the real SDK.
//!
//! Two drivers feed them: `cargo test` replays every file of the committed corpus
//! (`corpus/TARGET/`, `tests/corpus.rs`) on the stable toolchain, as part of every test run;
//! libFuzzer explores from that corpus (`libfuzzer/`, `scripts/fuzz SECONDS`).

#![forbid(unsafe_code)]

pub mod targets;

/// `data` as libFuzzer's typed targets decode their input: nothing for input shorter than the
/// type's least size, else [`Arbitrary::arbitrary_take_rest`]. A corpus file therefore means
/// the same input to both drivers.
pub fn decode<'a, T: Arbitrary<'a>>(data: &'a [u8]) -> Option<T> {
    if data.len() < T::size_hint(0).0 {
        return None;
    }
    T::arbitrary_take_rest(arbitrary::Unstructured::new(data)).ok()
}

use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use arbitrary::Arbitrary;
use palisade_core::{Fence, GrantFence, GrantId, WriteBatch};

#[path = "../../core/tests/checks/mod.rs"]
pub mod checks;

/// A record key: mostly one of a few short names, so that operations meet on the same key.
#[derive(Arbitrary, Debug, Clone)]
pub enum KeySpec {
    /// `k0` … `k3`.
    Few(u8),
    /// Any text.
    Any(String),
}

impl KeySpec {
    /// The key's text.
    pub fn text(&self) -> String {
        match self {
            KeySpec::Few(n) => format!("k{}", n % 4),
            KeySpec::Any(s) => s.clone(),
        }
    }
}

/// One operation of a write batch.
#[derive(Arbitrary, Debug, Clone)]
pub enum OpSpec {
    /// `put`.
    Put(KeySpec, Vec<u8>),
    /// `create`.
    Create(KeySpec, Vec<u8>),
    /// `delete`.
    Delete(KeySpec),
    /// `check` (absent with `None`).
    Check(KeySpec, Option<Vec<u8>>),
}

/// The batch of `ops`, in order.
pub fn batch(ops: &[OpSpec]) -> WriteBatch {
    ops.iter().fold(WriteBatch::new(), |b, op| match op {
        OpSpec::Put(k, v) => b.put(k.text(), v.clone()),
        OpSpec::Create(k, v) => b.create(k.text(), v.clone()),
        OpSpec::Delete(k) => b.delete(k.text()),
        OpSpec::Check(k, v) => b.check(k.text(), v.clone()),
    })
}

/// `None`, or a fence from 1 to 7 of one of three grants: few enough that equal fences, from
/// the same grant or another, come up often (the watermark rule's rule-2 case).
pub fn grant_fence(fenced: Option<(u8, u8)>) -> Option<GrantFence> {
    fenced.map(|(f, g)| GrantFence::new(Fence::new(u64::from(f % 7) + 1), GrantId::from_bytes([g % 3; 16])))
}

/// A current-thread runtime whose clock is paused: a backoff's sleep passes at once. Not for
/// anything that waits on threads (sqlx): the clock jumps to its next timeout meanwhile.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    runtime(true)
}

/// A current-thread runtime, its clock paused or not.
pub fn runtime(paused: bool) -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread().enable_all().start_paused(paused).build() {
        Ok(rt) => rt,
        Err(e) => panic!("no tokio runtime: {e}"),
    }
}

pub mod dynamo {
    //! A DynamoDB endpoint inside the process: `DescribeTable` says the table is active,
    //! `GetItem` finds nothing, and every other request gets the status and body set by
    //! [`FakeDynamo::answer`]; the requests are kept for [`FakeDynamo::requests`].

    use super::*;
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region, retry::RetryConfig};
    use aws_smithy_runtime_api::client::http::{
        HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
    };
    use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
    use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;
    use palisade_dynamodb::{DynamoConfig, DynamoStore};

    #[derive(Debug, Default)]
    struct State {
        status: u16,
        body: Vec<u8>,
        requests: Vec<(String, Vec<u8>)>,
    }

    /// The endpoint; clones share it.
    #[derive(Debug, Clone, Default)]
    pub struct FakeDynamo {
        state: Arc<Mutex<State>>,
    }

    impl FakeDynamo {
        /// Answer the next requests (but `DescribeTable` and `GetItem`) with `status` and `body`,
        /// and forget the requests kept so far.
        pub fn answer(&self, status: u16, body: Vec<u8>) {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            *state = State { status, body, requests: Vec::new() };
        }

        /// The requests since the last [`answer`](Self::answer): operation (`TransactWriteItems`)
        /// and body.
        pub fn requests(&self) -> Vec<(String, Vec<u8>)> {
            self.state.lock().unwrap_or_else(PoisonError::into_inner).requests.clone()
        }

        /// A store of table `fuzz` over this endpoint (no retries in the SDK: the adapter's own
        /// are what is checked).
        pub async fn store(&self) -> DynamoStore {
            let conf = aws_sdk_dynamodb::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .region(Region::new("us-east-1"))
                .credentials_provider(Credentials::new("fuzz", "fuzz", None, None, "fuzz"))
                .endpoint_url("http://127.0.0.1:9")
                .retry_config(RetryConfig::disabled())
                .http_client(self.clone())
                .build();
            match DynamoStore::from_client(aws_sdk_dynamodb::Client::from_conf(conf), DynamoConfig::new("fuzz")).await {
                Ok(store) => store,
                Err(e) => panic!("the fake endpoint's table: {e}"),
            }
        }
    }

    impl HttpConnector for FakeDynamo {
        fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
            let operation = request
                .headers()
                .get("x-amz-target")
                .and_then(|t| t.rsplit('.').next())
                .unwrap_or_default()
                .to_string();
            let body = request.body().bytes().unwrap_or_default().to_vec();
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let (status, reply) = match operation.as_str() {
                "DescribeTable" => (200, br#"{"Table":{"TableName":"fuzz","TableStatus":"ACTIVE"}}"#.to_vec()),
                "GetItem" => (200, b"{}".to_vec()),
                _ => (state.status, state.body.clone()),
            };
            state.requests.push((operation, body));
            let status = StatusCode::try_from(status).unwrap_or_else(|_| panic!("status {status}"));
            HttpConnectorFuture::ready(Ok(HttpResponse::new(status, SdkBody::from(reply))))
        }
    }

    impl HttpClient for FakeDynamo {
        fn http_connector(&self, _: &HttpConnectorSettings, _: &RuntimeComponents) -> SharedHttpConnector {
            SharedHttpConnector::new(self.clone())
        }
    }

    /// A store over one [`FakeDynamo`], the paused runtime that drives it (the adapter's
    /// backoff passes at once) and the resource its fenced writes are for: one per run.
    pub struct Harness {
        rt: tokio::runtime::Runtime,
        /// The endpoint.
        pub endpoint: FakeDynamo,
        store: DynamoStore,
        /// `fuzz:r`.
        pub resource: palisade_core::ResourceKey,
    }

    static HARNESS: LazyLock<Harness> = LazyLock::new(|| {
        let rt = paused_runtime();
        let endpoint = FakeDynamo::default();
        let store = rt.block_on(endpoint.store());
        let resource = palisade_core::ResourceKey::new("fuzz", "r").unwrap_or_else(|e| panic!("{e}"));
        Harness { rt, endpoint, store, resource }
    });

    impl Harness {
        /// The run's harness.
        pub fn get() -> &'static Harness {
            &HARNESS
        }

        /// Applies `batch` (under `fence`, or unfenced) with the endpoint answering `status`
        /// and `body`; [`FakeDynamo::requests`] then holds what the adapter sent.
        pub fn apply(
            &self,
            status: u16,
            body: Vec<u8>,
            batch: &WriteBatch,
            fence: Option<GrantFence>,
        ) -> palisade_core::Result<()> {
            use palisade_core::FencedStore;
            self.endpoint.answer(status, body);
            self.rt.block_on(async {
                match fence {
                    Some(f) => self.store.apply(&self.resource, f, batch).await,
                    None => self.store.apply_unfenced(batch).await,
                }
            })
        }
    }
}
