//! The store: watermark items and record items in one table, written with conditional
//! requests and transactions.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemOutput;
use aws_sdk_dynamodb::operation::delete_item::builders::DeleteItemFluentBuilder;
use aws_sdk_dynamodb::operation::put_item::PutItemOutput;
use aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConditionCheck, Delete, KeySchemaElement, KeyType, Put,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableStatus, TransactWriteItem, Update,
};
use palisade_core::spi::{Backoff, canonical_fences, conflict_error, explain_refusal, fence_refusal, storable_fence};
use palisade_core::{
    Error, ErrorKind, Fence, FencedStore, GrantFence, GrantId, InspectStore, Listing, OwnerToken, Record, ResourceKey,
    Result, WatermarkSource, WatermarkView, WriteBatch, WriteOp,
};
use tracing::{debug, warn};

use crate::errors::map;
use crate::single_item::send_fenced;
use crate::{BACKEND, DynamoConfig};

/// The partition key attribute of the store's table (a string).
pub const KEY_ATTRIBUTE: &str = "pk";
/// The attribute holding a record's value (binary).
pub const VALUE_ATTRIBUTE: &str = "value";
/// The attribute holding a fence (number): the watermark on a resource's item, the writer's
/// fence on a record, and the default fence attribute of your own items.
pub const FENCE_ATTRIBUTE: &str = "fence";

/// The attribute holding the [`GrantId`] (binary) of the grant that set an item's fence, so an
/// equal fence from another grant is refused (fencing rule 2).
pub const GRANT_ATTRIBUTE: &str = "fence_grant";

/// The most items DynamoDB takes in one `TransactWriteItems`.
pub const MAX_TRANSACTION_ITEMS: usize = 100;

pub(crate) const FENCE_PREFIX: &str = "fence#";
const RECORD_PREFIX: &str = "rec#";
/// The condition every fenced write carries: no fence yet, one below ours, or ours from the
/// same grant (or from an item written before grants were recorded).
pub(crate) const FENCE_CONDITION: &str = "(attribute_not_exists(#palisade_fence) OR #palisade_fence < :palisade_fence \
     OR (#palisade_fence = :palisade_fence \
         AND (attribute_not_exists(#palisade_grant) OR #palisade_grant = :palisade_grant)))";
/// What a fenced write sets besides the caller's own attributes.
pub(crate) const FENCE_ASSIGNMENT: &str = "#palisade_fence = :palisade_fence, #palisade_grant = :palisade_grant";

/// A fenced store in a DynamoDB table.
///
/// One table (partition key `pk`, a string) holds two kinds of items:
/// `fence#<domain:id>` with the resource's watermark in `fence`, and `rec#<record key>` with
/// `value` (binary) and the writer's `fence`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    config: DynamoConfig,
}

impl DynamoStore {
    /// Opens the store at `dynamodb://TABLE[?endpoint=URL&region=R]`.
    pub async fn connect(url: &str) -> Result<Self> {
        DynamoStore::open(DynamoConfig::from_url(url)?).await
    }

    /// Opens the store, creating the table if configured to, and checks that it is usable.
    pub async fn open(config: DynamoConfig) -> Result<Self> {
        config.validate()?;
        let mut trust = aws_smithy_http_client::tls::TrustStore::default();
        if let Some(pem) = &config.tls_root_cert {
            trust = aws_smithy_http_client::tls::TrustStore::empty().with_pem_certificate(pem.clone());
        }
        let tls = aws_smithy_http_client::tls::TlsContext::builder().with_trust_store(trust).build().map_err(|e| {
            Error::new(ErrorKind::InvalidConfig, BACKEND, format!("the TLS settings: {e}")).with_retryable(false)
        })?;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .tls_context(tls)
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::standard().with_max_attempts(config.max_attempts))
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_attempt_timeout(config.attempt_timeout)
                    .operation_timeout(config.operation_timeout)
                    .build(),
            );
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint.clone());
        }
        let sdk = loader.load().await;
        if sdk.region().is_none() {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                "no AWS region: set AWS_REGION, a profile region, or ?region= in the URL",
            ));
        }
        DynamoStore::from_client(Client::new(&sdk), config).await
    }

    /// A store over a client you configured yourself (credentials, interceptors, retries);
    /// `config.endpoint`, `region` and the timeouts are then yours to set on the client. The
    /// table is checked (and created if `create_table`) as in [`open`](Self::open).
    pub async fn from_client(client: Client, config: DynamoConfig) -> Result<Self> {
        config.validate()?;
        let store = DynamoStore { client, config };
        store.ensure_table().await?;
        debug!(table = %store.config.table, endpoint = ?store.config.endpoint.as_deref().map(palisade_core::redact_url), "dynamodb fenced store open");
        Ok(store)
    }

    /// The SDK client, for your own requests (and the `*_fenced` helpers).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The settings the store was opened with.
    pub fn config(&self) -> &DynamoConfig {
        &self.config
    }

    /// Creates the table (partition key `pk`, string; on-demand billing) if it does not exist
    /// and waits until it is active. [`open`](Self::open) runs it unless `create_table` is off.
    pub async fn create_table(&self) -> Result<()> {
        let table = &self.config.table;
        let attribute = AttributeDefinition::builder()
            .attribute_name(KEY_ATTRIBUTE)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(build_error)?;
        let key = KeySchemaElement::builder()
            .attribute_name(KEY_ATTRIBUTE)
            .key_type(KeyType::Hash)
            .build()
            .map_err(build_error)?;
        let created = self
            .client
            .create_table()
            .table_name(table)
            .attribute_definitions(attribute)
            .key_schema(key)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => debug!(%table, "dynamodb table created"),
            // Another process created it first: fine.
            Err(SdkError::ServiceError(e)) if e.err().code() == Some("ResourceInUseException") => {}
            Err(e) => return Err(map(e, "creating the table", false)),
        }
        self.wait_active().await
    }

    async fn ensure_table(&self) -> Result<()> {
        match self.client.describe_table().table_name(&self.config.table).send().await {
            Ok(_) => self.wait_active().await,
            Err(SdkError::ServiceError(e)) if e.err().code() == Some("ResourceNotFoundException") => {
                if self.config.create_table {
                    self.create_table().await
                } else {
                    Err(Error::new(
                        ErrorKind::InvalidConfig,
                        BACKEND,
                        format!("table {:?} does not exist (and create_table is off)", self.config.table),
                    ))
                }
            }
            Err(e) => Err(map(e, "describing the table", false)),
        }
    }

    async fn wait_active(&self) -> Result<()> {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut backoff = Backoff::with_bounds(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            let described = self
                .client
                .describe_table()
                .table_name(&self.config.table)
                .send()
                .await
                .map_err(|e| map(e, "describing the table", false))?;
            let status = described.table().and_then(|t| t.table_status()).cloned();
            if status.as_ref().is_none_or(|s| *s == TableStatus::Active) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    BACKEND,
                    format!("table {:?} is still {status:?}", self.config.table),
                )
                .with_retryable(true));
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// Your own `UpdateItem`, fenced: the fence condition (no fence on the item, a lower one,
    /// or the same fence from the same grant) is ANDed with your condition, if any, and
    /// `fence = :f, fence_grant = :g` join your `SET` clause, all in the **same request**. Build
    /// the request with `store.client().update_item()…` but do not send it; pass the lease
    /// (`&lease`) or a [`GrantFence`] handed over from its holder.
    ///
    /// **Your table design.** Nothing of Palisade's needs to be in your table: keep your
    /// partition (and sort) key and attributes, and each item you write this way gains two
    /// attributes, `fence` (a number) and `fence_grant` (binary), which these helpers own. One
    /// item is one fenced resource, so lock one key per item (`inventory`/`WH-01#SKU-7` for an
    /// `inventory` item with key `sku = "WH-01#SKU-7"`), and keep items that must change
    /// together under one lock in one `TransactWriteItems` through
    /// [`FencedStore::apply`](palisade_core::FencedStore::apply) instead.
    ///
    /// ```no_run
    /// # async fn f(store: &palisade_dynamodb::DynamoStore,
    /// #            lease: &palisade_core::Lease<palisade_core::DynLockService>) -> palisade_core::Result<()> {
    /// use aws_sdk_dynamodb::types::AttributeValue;
    ///
    /// let update = store
    ///     .client()
    ///     .update_item()
    ///     .table_name("inventory")
    ///     .key("sku", AttributeValue::S("WH-01#SKU-7".into()))
    ///     .update_expression("SET qty = qty - :one")
    ///     .condition_expression("qty >= :one")
    ///     .expression_attribute_values(":one", AttributeValue::N("1".into()));
    /// store.update_item_fenced(update, lease).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: a higher fence on the item → [`ErrorKind::StaleFence`] with the item's fence
    /// (read from the old item DynamoDB returns with the failure); the same fence from another
    /// grant → [`ErrorKind::DuplicateFence`]; your own condition failing →
    /// [`ErrorKind::Conflict`]. Every refused fence (stale or duplicate) counts once in
    /// `palisade_lock_fence_rejected_total{store="dynamodb"}`, as a refused
    /// [`FencedStoreExt::write`](palisade_core::FencedStoreExt::write) does.
    ///
    /// These helpers never raise the store's watermark for a resource: check a fresh grant
    /// against the item itself with [`item_watermark`](Self::item_watermark).
    ///
    /// Sent **once**, whatever the client's retry settings: the request is not idempotent (your
    /// `SET qty = qty - :d` passes the fence condition again on a resend), so a timeout or a
    /// lost answer after it left is [`ErrorKind::OutcomeUnknown`], not retried. Read the item
    /// to reconcile before deciding to send it again. A throttled or refused request (nothing
    /// applied) is a retryable [`ErrorKind::Unavailable`].
    pub async fn update_item_fenced(
        &self,
        update: UpdateItemFluentBuilder,
        fence: impl Into<GrantFence> + Send,
    ) -> Result<UpdateItemOutput> {
        send_fenced(update, fence.into()).await
    }

    /// Your own `PutItem`, fenced: the item gets `fence = :f` and `fence_grant = :g`, and the
    /// request the fence condition (ANDed with yours). Errors as for
    /// [`update_item_fenced`](Self::update_item_fenced).
    pub async fn put_item_fenced(
        &self,
        put: PutItemFluentBuilder,
        fence: impl Into<GrantFence> + Send,
    ) -> Result<PutItemOutput> {
        send_fenced(put, fence.into()).await
    }

    /// Your own `DeleteItem`, fenced: deleted only if the fence condition holds. Errors as for
    /// [`update_item_fenced`](Self::update_item_fenced).
    pub async fn delete_item_fenced(
        &self,
        delete: DeleteItemFluentBuilder,
        fence: impl Into<GrantFence> + Send,
    ) -> Result<DeleteItemOutput> {
        send_fenced(delete, fence.into()).await
    }

    /// Every item whose key starts with `prefix`, by a consistent `Scan` filtered on it:
    /// it reads the whole table, a page (at most 1 MB of items read, matched or not) per
    /// request, each answered or failed within `operation_timeout`.
    async fn scan_prefix(&self, prefix: &str, what: &str) -> Result<Vec<HashMap<String, AttributeValue>>> {
        let mut out = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.config.table)
                .filter_expression("begins_with(#palisade_pk, :palisade_prefix)")
                .expression_attribute_names("#palisade_pk", KEY_ATTRIBUTE)
                .expression_attribute_values(":palisade_prefix", AttributeValue::S(prefix.to_string()))
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| map(e, what, false))?;
            out.extend(page.items().iter().cloned());
            match page.last_evaluated_key() {
                Some(next) if !next.is_empty() => start = Some(next.clone()),
                _ => return Ok(out),
            }
        }
    }

    fn fence_item_key(resource: &ResourceKey) -> AttributeValue {
        AttributeValue::S(format!("{FENCE_PREFIX}{resource}"))
    }

    fn record_item_key(key: &str) -> AttributeValue {
        AttributeValue::S(format!("{RECORD_PREFIX}{key}"))
    }

    /// The transaction items for a batch's operations, in order, and for each the operation
    /// whose condition it carries (for the conflict error). A `Check` on a key the batch also
    /// writes becomes that write's condition: DynamoDB allows one operation per item.
    fn record_items(&self, batch: &WriteBatch, fence: Option<i64>) -> Result<Vec<(TransactWriteItem, WriteOp)>> {
        let table = &self.config.table;
        let checks: HashMap<&str, &WriteOp> =
            batch.ops().iter().filter(|op| matches!(op, WriteOp::Check { .. })).map(|op| (op.key(), op)).collect();
        let written: std::collections::HashSet<&str> =
            batch.ops().iter().filter(|op| !matches!(op, WriteOp::Check { .. })).map(WriteOp::key).collect();
        let mut items = Vec::with_capacity(batch.ops().len());
        for op in batch.ops() {
            let mut condition = Condition::default();
            let mut blame = op.clone();
            if let Some(check) = checks.get(op.key()).filter(|_| !matches!(op, WriteOp::Check { .. })) {
                condition.add_check(check);
                blame = (*check).clone();
            }
            let key = DynamoStore::record_item_key(op.key());
            let item = match op {
                WriteOp::Put { value, .. } | WriteOp::Create { value, .. } => {
                    if matches!(op, WriteOp::Create { .. }) {
                        condition.push(
                            "attribute_not_exists(#palisade_pk)",
                            &[("#palisade_pk", KEY_ATTRIBUTE)],
                            vec![],
                        );
                        blame = op.clone();
                    }
                    let mut put = Put::builder()
                        .table_name(table)
                        .item(KEY_ATTRIBUTE, key)
                        .item(VALUE_ATTRIBUTE, AttributeValue::B(Blob::new(value.clone())));
                    if let Some(f) = fence {
                        put = put.item(FENCE_ATTRIBUTE, AttributeValue::N(f.to_string()));
                    }
                    let put = condition.apply_put(put);
                    TransactWriteItem::builder().put(put.build().map_err(build_error)?).build()
                }
                WriteOp::Delete { .. } => {
                    let delete = condition.apply_delete(Delete::builder().table_name(table).key(KEY_ATTRIBUTE, key));
                    TransactWriteItem::builder().delete(delete.build().map_err(build_error)?).build()
                }
                WriteOp::Check { .. } => {
                    if written.contains(op.key()) {
                        continue; // folded into the write of the same key
                    }
                    condition.add_check(op);
                    let check =
                        condition.apply_check(ConditionCheck::builder().table_name(table).key(KEY_ATTRIBUTE, key));
                    TransactWriteItem::builder().condition_check(check.build().map_err(build_error)?).build()
                }
            };
            items.push((item, blame));
        }
        Ok(items)
    }

    /// The fenced write under `fences` (canonical order): one watermark update per resource,
    /// then the records, in one transaction within DynamoDB's item limit.
    async fn apply_fenced(&self, fences: Vec<(ResourceKey, GrantFence)>, batch: &WriteBatch) -> Result<()> {
        batch.validate()?;
        let mut items = Vec::with_capacity(fences.len() + batch.len());
        let mut record_fence = None;
        for (resource, fence) in &fences {
            let f = storable_fence(BACKEND, fence.fence())?;
            record_fence = Some(f);
            let update = Update::builder()
                .table_name(&self.config.table)
                .key(KEY_ATTRIBUTE, DynamoStore::fence_item_key(resource))
                .update_expression(format!("SET {FENCE_ASSIGNMENT}"))
                .condition_expression(FENCE_CONDITION)
                .expression_attribute_names("#palisade_fence", FENCE_ATTRIBUTE)
                .expression_attribute_names("#palisade_grant", GRANT_ATTRIBUTE)
                .expression_attribute_values(":palisade_fence", AttributeValue::N(f.to_string()))
                .expression_attribute_values(":palisade_grant", grant_value(fence.grant()))
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                .build()
                .map_err(build_error)?;
            items.push((TransactWriteItem::builder().update(update).build(), WriteOp::Delete { key: String::new() }));
        }
        // Records remember the last resource's fence (see `FencedStore::apply_all`).
        let records = self.record_items(batch, record_fence)?;
        if fences.len() + records.len() > MAX_TRANSACTION_ITEMS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                BACKEND,
                format!(
                    "this write needs {} items in one TransactWriteItems ({} watermarks and {} records); DynamoDB \
                     takes at most {MAX_TRANSACTION_ITEMS}: split the job, or fence fewer resources per write",
                    fences.len() + records.len(),
                    fences.len(),
                    records.len()
                ),
            ));
        }
        items.extend(records);
        self.transact(items, &fences).await
    }

    /// Sends one transaction. A cancellation is a definite "nothing applied": because of the
    /// fence item it is `StaleFence`; because of a record's condition, `Conflict`; because of
    /// a concurrent transaction on the same items, it is retried with a fresh request token.
    async fn transact(
        &self,
        items: Vec<(TransactWriteItem, WriteOp)>,
        fenced: &[(ResourceKey, GrantFence)],
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let (items, blames): (Vec<TransactWriteItem>, Vec<WriteOp>) = items.into_iter().unzip();
        let mut backoff = Backoff::with_bounds(Duration::from_millis(10), Duration::from_millis(200));
        let mut conflicts = 0;
        loop {
            // One token per logical attempt: the SDK's own retries of this request reuse it,
            // so DynamoDB applies the transaction at most once however often it is resent.
            let token = OwnerToken::generate()?.to_string();
            let sent = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .client_request_token(token)
                .send()
                .await;
            let err = match sent {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            let cancelled = match &err {
                SdkError::ServiceError(s) => match s.err() {
                    TransactWriteItemsError::TransactionCanceledException(c) => Some(c.cancellation_reasons().to_vec()),
                    _ => None,
                },
                _ => None,
            };
            let Some(reasons) = cancelled else { return Err(map(err, "write", true)) };
            let codes: Vec<&str> = reasons.iter().map(|r| r.code().unwrap_or("None")).collect();
            let conditional: Vec<bool> =
                blames.iter().map(|b| matches!(b, WriteOp::Check { .. } | WriteOp::Create { .. })).collect();
            let transient = match read_cancellation(&codes, fenced.len(), &conditional) {
                Cancellation::Stale(i) => {
                    let Some((resource, fence)) = fenced.get(i) else { return Err(map(err, "write", true)) };
                    let fence = *fence;
                    let old = match reasons.get(i).and_then(|r| r.item()) {
                        Some(item) => Some(item.clone()),
                        // A server that does not return the old item: read the watermark's item.
                        None => self.get(DynamoStore::fence_item_key(resource), "reading a watermark").await?,
                    };
                    let old = old.as_ref();
                    return Err(explain_refusal(
                        BACKEND,
                        resource,
                        fence,
                        old.and_then(fence_of).unwrap_or_default(),
                        old.and_then(grant_of),
                    ));
                }
                Cancellation::Conflict(i) => return Err(conflict_error(BACKEND, &blames[i])),
                Cancellation::Transient if conflicts < 8 => {
                    conflicts += 1;
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
                Cancellation::Transient => true,
                Cancellation::Other => false,
            };
            warn!(?codes, "dynamodb transaction cancelled");
            let kind = if transient { ErrorKind::Unavailable } else { ErrorKind::Backend };
            return Err(
                Error::new(kind, BACKEND, format!("transaction cancelled: {codes:?}")).with_retryable(transient)
            );
        }
    }

    /// The fence on one of your own items, as a
    /// [`WatermarkSource`](palisade_core::WatermarkSource) for
    /// [`lock_checked`](palisade_core::LockServiceExt::lock_checked): what to check a fresh
    /// grant against when that item is written only with the single-item helpers, which never
    /// raise the store's watermark. One strongly consistent `GetItem` per check; a missing item
    /// or one without a fence reads as "never written under a fence".
    pub fn item_watermark(&self, table: impl Into<String>, key: HashMap<String, AttributeValue>) -> ItemWatermark<'_> {
        ItemWatermark { store: self, table: table.into(), key }
    }

    async fn get(&self, key: AttributeValue, what: &str) -> Result<Option<HashMap<String, AttributeValue>>> {
        let got = self
            .client
            .get_item()
            .table_name(&self.config.table)
            .key(KEY_ATTRIBUTE, key)
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map(e, what, false))?;
        Ok(got.item().cloned())
    }
}

/// The fence attribute of one of your items, read as a watermark: see
/// [`DynamoStore::item_watermark`].
#[derive(Debug, Clone)]
pub struct ItemWatermark<'a> {
    store: &'a DynamoStore,
    table: String,
    key: HashMap<String, AttributeValue>,
}

#[async_trait]
impl WatermarkSource for ItemWatermark<'_> {
    fn source_name(&self) -> &'static str {
        BACKEND
    }

    /// The item's fence; the resource is the item, whatever `resource` the lock is taken on.
    async fn highest_fence(&self, _resource: &ResourceKey) -> Result<Option<Fence>> {
        let got = self
            .store
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.key.clone()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map(e, "reading an item's fence", false))?;
        Ok(got.item().and_then(fence_of))
    }
}

/// Conditions, names and values to attach to one transaction item.
#[derive(Default)]
struct Condition {
    parts: Vec<String>,
    names: Vec<(String, String)>,
    values: Vec<(String, AttributeValue)>,
}

impl Condition {
    fn push(&mut self, part: &str, names: &[(&str, &str)], values: Vec<(String, AttributeValue)>) {
        self.parts.push(part.to_string());
        self.names.extend(names.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self.values.extend(values);
    }

    fn add_check(&mut self, check: &WriteOp) {
        if let WriteOp::Check { expected, .. } = check {
            match expected {
                None => self.push("attribute_not_exists(#palisade_pk)", &[("#palisade_pk", KEY_ATTRIBUTE)], vec![]),
                Some(v) => self.push(
                    "#palisade_value = :palisade_expected",
                    &[("#palisade_value", VALUE_ATTRIBUTE)],
                    vec![(":palisade_expected".to_string(), AttributeValue::B(Blob::new(v.clone())))],
                ),
            }
        }
    }

    fn expression(&self) -> Option<String> {
        (!self.parts.is_empty()).then(|| self.parts.join(" AND "))
    }
}

macro_rules! apply_condition {
    ($name:ident, $builder:ty) => {
        impl Condition {
            fn $name(&self, mut b: $builder) -> $builder {
                if let Some(expression) = self.expression() {
                    b = b.condition_expression(expression);
                    for (k, v) in &self.names {
                        b = b.expression_attribute_names(k, v);
                    }
                    for (k, v) in &self.values {
                        b = b.expression_attribute_values(k, v.clone());
                    }
                }
                b
            }
        }
    };
}
apply_condition!(apply_put, aws_sdk_dynamodb::types::builders::PutBuilder);
apply_condition!(apply_delete, aws_sdk_dynamodb::types::builders::DeleteBuilder);
apply_condition!(apply_check, aws_sdk_dynamodb::types::builders::ConditionCheckBuilder);

/// What a cancelled transaction's reasons say, one code per item in request order.
#[derive(Debug, PartialEq, Eq)]
enum Cancellation {
    /// The condition of fence item `i` failed: that resource's watermark is at or above its
    /// fence.
    Stale(usize),
    /// The condition of item `i` (a record's) failed.
    Conflict(usize),
    /// Another transaction or throttling got in the way: nothing applied, worth retrying.
    Transient,
    /// Anything else.
    Other,
}

/// Reads the reasons of a transaction whose items carry a condition where `conditional` says
/// (the first `fenced` are fence items).
fn read_cancellation(codes: &[&str], fenced: usize, conditional: &[bool]) -> Cancellation {
    let items = conditional.len();
    if let Some(i) = (0..fenced.min(codes.len())).find(|&i| codes[i] == "ConditionalCheckFailed") {
        return Cancellation::Stale(i);
    }
    let offset = fenced;
    // Blaming an item without a condition, or past the request's items, names nothing of ours:
    // a malformed reply.
    if let Some(i) = (offset..codes.len().min(items)).find(|&i| codes[i] == "ConditionalCheckFailed" && conditional[i])
    {
        return Cancellation::Conflict(i);
    }
    let transient = |c: &&str| {
        matches!(
            *c,
            "TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded" | "RequestLimitExceeded"
        )
    };
    if codes.iter().any(transient) { Cancellation::Transient } else { Cancellation::Other }
}

fn build_error(e: aws_sdk_dynamodb::error::BuildError) -> Error {
    Error::new(ErrorKind::InvalidArgument, BACKEND, format!("request could not be built: {e}"))
}

fn fence_of(item: &HashMap<String, AttributeValue>) -> Option<Fence> {
    match item.get(FENCE_ATTRIBUTE) {
        Some(AttributeValue::N(n)) => n.parse::<u64>().ok().map(Fence::new),
        _ => None,
    }
}

pub(crate) fn grant_value(grant: GrantId) -> AttributeValue {
    AttributeValue::B(Blob::new(grant.as_bytes().to_vec()))
}

fn grant_of(item: &HashMap<String, AttributeValue>) -> Option<GrantId> {
    match item.get(GRANT_ATTRIBUTE) {
        Some(AttributeValue::B(b)) => GrantId::from_slice(b.as_ref()),
        _ => None,
    }
}

/// Why the fence condition refused `presented` on the item `old` (as it was when refused), or
/// `None` if the fence condition holds there (then it was another condition that failed).
pub(crate) fn refusal_of(old: Option<&HashMap<String, AttributeValue>>, presented: GrantFence) -> Option<Error> {
    let old = old?;
    fence_refusal(BACKEND, presented, fence_of(old)?, grant_of(old))
}

#[async_trait]
impl FencedStore for DynamoStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// One `TransactWriteItems`: the watermark item's conditional update first, then the
    /// records. All or nothing.
    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.apply_fenced(vec![(resource.clone(), fence)], batch).await
    }

    /// One `TransactWriteItems`: a conditional update of each resource's watermark item, in
    /// canonical order, then the records. All or nothing. DynamoDB takes at most 100 items in
    /// one transaction: a write past that (resources plus records) is
    /// [`ErrorKind::InvalidArgument`], before anything is sent.
    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        self.apply_fenced(canonical_fences(BACKEND, fences)?, batch).await
    }

    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        batch.validate()?;
        let items = self.record_items(batch, None)?;
        self.transact(items, &[]).await
    }

    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        let item = self.get(DynamoStore::fence_item_key(resource), "reading a watermark").await?;
        Ok(item.as_ref().and_then(fence_of))
    }

    async fn read(&self, key: &str) -> Result<Option<Record>> {
        palisade_core::spi::validate_record_key(key)?;
        let item = self.get(DynamoStore::record_item_key(key), "reading a record").await?;
        item.map(|item| to_record(&item)).transpose()
    }

    /// A consistent `Scan` filtered on the key prefix, sorted: it reads the whole table, so
    /// use it for tooling and tests, not on a hot path. Its bound grows with the table: each
    /// page (at most 1 MB of items read, matched or not) is one request, answered or failed
    /// within `operation_timeout`.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        let mut out = Vec::new();
        for item in self.scan_prefix(&format!("{RECORD_PREFIX}{prefix}"), "listing records").await? {
            if let Some(AttributeValue::S(pk)) = item.get(KEY_ATTRIBUTE)
                && let Some(key) = pk.strip_prefix(RECORD_PREFIX)
            {
                out.push((key.to_string(), to_record(&item)?));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

fn to_record(item: &HashMap<String, AttributeValue>) -> Result<Record> {
    let value = match item.get(VALUE_ATTRIBUTE) {
        Some(AttributeValue::B(b)) => b.as_ref().to_vec(),
        _ => return Err(Error::new(ErrorKind::Backend, BACKEND, "record item without a binary value")),
    };
    Ok(Record { value, fence: fence_of(item) })
}

/// `palisade inspect`'s view of the watermark items (`fence#<domain:id>`): reads only. The
/// listing is a `Scan` of the whole table (see [`FencedStore::list`]).
#[async_trait]
impl InspectStore for DynamoStore {
    async fn watermarks(&self, prefix: &str) -> Result<Listing<(ResourceKey, WatermarkView)>> {
        let mut marks = Vec::new();
        for item in self.scan_prefix(&format!("{FENCE_PREFIX}{prefix}"), "listing watermarks").await? {
            if let Some(AttributeValue::S(pk)) = item.get(KEY_ATTRIBUTE)
                && let Some(resource) = pk.strip_prefix(FENCE_PREFIX)
                && let Ok(key) = palisade_core::spi::parse_any_resource_key(resource)
                && let Some(fence) = fence_of(&item)
            {
                marks.push((key, WatermarkView::new(fence, grant_of(&item))));
            }
        }
        marks.sort_by_cached_key(|(k, _)| k.to_string());
        Ok(Listing::of(marks))
    }

    async fn watermark_view(&self, resource: &ResourceKey) -> Result<Option<WatermarkView>> {
        let item = self.get(DynamoStore::fence_item_key(resource), "reading a watermark").await?;
        Ok(item.as_ref().and_then(|item| Some(WatermarkView::new(fence_of(item)?, grant_of(item)))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reasons name the item whose condition failed, and only an item that had one; a reply
    /// with more reasons than the request had items, or that blames an item without a condition,
    /// names nothing (found by fuzz/dynamodb_replies: the first indexed past the items and
    /// panicked, the second reported a `Conflict` for a plain put).
    #[test]
    fn cancellation_reasons_are_read_within_the_request() {
        let ccf = "ConditionalCheckFailed";
        assert_eq!(read_cancellation(&[ccf, "None"], 1, &[true, true]), Cancellation::Stale(0));
        assert_eq!(read_cancellation(&["None", ccf, "None"], 2, &[false, false, true]), Cancellation::Stale(1));
        assert_eq!(read_cancellation(&["None", ccf], 1, &[true, true]), Cancellation::Conflict(1));
        assert_eq!(read_cancellation(&[ccf], 0, &[true]), Cancellation::Conflict(0));
        assert_eq!(read_cancellation(&["TransactionConflict", "None"], 0, &[true, false]), Cancellation::Transient);
        assert_eq!(read_cancellation(&["None", "None"], 0, &[true, true]), Cancellation::Other);
        assert_eq!(read_cancellation(&["None", ccf], 0, &[true]), Cancellation::Other);
        assert_eq!(read_cancellation(&["None", "None", ccf], 1, &[true, true]), Cancellation::Other);
        assert_eq!(read_cancellation(&["None", ccf], 1, &[true, false]), Cancellation::Other);
    }
}
