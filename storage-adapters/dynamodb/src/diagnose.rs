//! `palisade doctor`'s checks of a DynamoDB table: its key schema, its state, whether it can
//! be deleted by mistake, whether DynamoDB's TTL may delete watermarks, and the fence
//! attributes of its items. Reads only.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, KeyType, ScalarAttributeType, TableStatus, TimeToLiveStatus};
use palisade_core::{Check, Diagnose, Result, Verdict};

use crate::errors::map;
use crate::store::{DynamoStore, FENCE_PREFIX};
use crate::{BACKEND, FENCE_ATTRIBUTE, GRANT_ATTRIBUTE, KEY_ATTRIBUTE, VALUE_ATTRIBUTE};

const WRITES: &str = "fenced writes are accepted or refused, never failed for the table's shape";
const KEPT: &str = "a watermark is never lost, so a fence accepted once is never accepted again";

/// How many items the fence-attribute check reads at most (one page of a `Scan`).
const SAMPLED: i32 = 200;

#[async_trait]
impl Diagnose for DynamoStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        let table = &self.config().table;
        let described = self
            .client()
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| map(e, "doctor: describe", false))?;
        let Some(description) = described.table() else {
            return Ok(vec![Check::new("table", Verdict::Fail, format!("{table:?} is not described"), WRITES)]);
        };
        let keys: Vec<(String, KeyType)> =
            description.key_schema().iter().map(|k| (k.attribute_name().to_string(), k.key_type().clone())).collect();
        let pk_type = description
            .attribute_definitions()
            .iter()
            .find(|a| a.attribute_name() == KEY_ATTRIBUTE)
            .map(|a| a.attribute_type().clone());
        let mut checks = vec![key_schema(&keys, pk_type.as_ref())];
        checks.push(match description.table_status() {
            Some(TableStatus::Active) | None => Check::new("table status", Verdict::Pass, "ACTIVE", WRITES),
            Some(status) => Check::new(
                "table status",
                Verdict::Warn,
                format!("{}: writes may fail until the table is ACTIVE again", status.as_str()),
                WRITES,
            ),
        });
        checks.push(match description.deletion_protection_enabled() {
            Some(true) => Check::new("deletion protection", Verdict::Pass, "on", KEPT),
            _ => Check::new(
                "deletion protection",
                Verdict::Warn,
                "off: a table deleted by mistake takes every watermark with it, and a table made again accepts any \
                 fence, a stale holder's too, until each resource is written once more; turn deletion protection on",
                KEPT,
            ),
        });
        let ttl = self
            .client()
            .describe_time_to_live()
            .table_name(table)
            .send()
            .await
            .map_err(|e| map(e, "doctor: describe time to live", false))?;
        let ttl = ttl.time_to_live_description();
        checks.push(item_expiry(ttl.and_then(|t| t.time_to_live_status()), ttl.and_then(|t| t.attribute_name())));
        let sample = self
            .client()
            .scan()
            .table_name(table)
            .limit(SAMPLED)
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map(e, "doctor: sample the fence items", false))?;
        let fence_items = sample.items().iter().filter(
            |item| matches!(item.get(KEY_ATTRIBUTE), Some(AttributeValue::S(k)) if k.starts_with(FENCE_PREFIX)),
        );
        let (mut seen, mut bad) = (0usize, Vec::new());
        for item in fence_items {
            seen += 1;
            let fence_ok = matches!(item.get(FENCE_ATTRIBUTE), Some(AttributeValue::N(n)) if n.parse::<u64>().is_ok());
            let grant_ok = matches!(item.get(GRANT_ATTRIBUTE), None | Some(AttributeValue::B(_)));
            if !(fence_ok && grant_ok)
                && let Some(AttributeValue::S(k)) = item.get(KEY_ATTRIBUTE)
            {
                bad.push(k.clone());
            }
        }
        checks.push(fence_attributes(seen, &bad, sample.items().len()));
        Ok(checks)
    }
}

fn key_schema(keys: &[(String, KeyType)], pk_type: Option<&ScalarAttributeType>) -> Check {
    let shown: Vec<String> = keys.iter().map(|(name, kind)| format!("{name} {}", kind.as_str())).collect();
    let right =
        matches!(keys, [(name, KeyType::Hash)] if name == KEY_ATTRIBUTE) && pk_type == Some(&ScalarAttributeType::S);
    if right {
        Check::new("key schema", Verdict::Pass, format!("{KEY_ATTRIBUTE} HASH, a string"), WRITES)
    } else {
        Check::new(
            "key schema",
            Verdict::Fail,
            format!(
                "{} ({KEY_ATTRIBUTE} is {}): the store needs a partition key {KEY_ATTRIBUTE}, a string, and no sort key; \
                 every write to this table fails; give the store a table of its own",
                shown.join(", "),
                pk_type.map_or("not defined", ScalarAttributeType::as_str)
            ),
            WRITES,
        )
    }
}

fn item_expiry(status: Option<&TimeToLiveStatus>, attribute: Option<&str>) -> Check {
    let on = matches!(status, Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling));
    match attribute {
        Some(name) if on && [FENCE_ATTRIBUTE, GRANT_ATTRIBUTE, VALUE_ATTRIBUTE, KEY_ATTRIBUTE].contains(&name) => {
            Check::new(
                "item expiry (TTL)",
                Verdict::Fail,
                format!(
                    "on, by the attribute {name:?}, which the store writes: DynamoDB reads it as an expiry time and \
                     deletes the watermarks (a fence of 7 is 7 s after 1970), so a stale holder's fence is accepted \
                     again; turn TTL off or point it at an attribute of your own"
                ),
                KEPT,
            )
        }
        Some(name) if on => Check::new(
            "item expiry (TTL)",
            Verdict::Pass,
            format!("on, by {name:?}, which the store never writes: its items never expire"),
            KEPT,
        ),
        _ => Check::new("item expiry (TTL)", Verdict::Pass, "off: no item expires", KEPT),
    }
}

fn fence_attributes(seen: usize, bad: &[String], read: usize) -> Check {
    if seen == 0 {
        return Check::new(
            "fence attributes",
            Verdict::Pass,
            format!("no watermark among the first {read} items read (nothing written under a fence yet)"),
            WRITES,
        );
    }
    if bad.is_empty() {
        return Check::new(
            "fence attributes",
            Verdict::Pass,
            format!(
                "{seen} watermarks read: each a number in {FENCE_ATTRIBUTE:?}, its grant bytes in {GRANT_ATTRIBUTE:?}"
            ),
            WRITES,
        );
    }
    Check::new(
        "fence attributes",
        Verdict::Fail,
        format!(
            "{} of {seen} watermarks read hold {FENCE_ATTRIBUTE:?} as something other than a number, or \
             {GRANT_ATTRIBUTE:?} as something other than bytes ({}): the fence condition never holds for them, so \
             every write of those resources is refused; another program writes this table",
            bad.len(),
            bad.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        ),
        WRITES,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_schema_is_pk_alone_a_string() {
        let pk = || (KEY_ATTRIBUTE.to_string(), KeyType::Hash);
        assert_eq!(key_schema(&[pk()], Some(&ScalarAttributeType::S)).verdict, Verdict::Pass);
        assert_eq!(key_schema(&[pk()], Some(&ScalarAttributeType::N)).verdict, Verdict::Fail);
        assert_eq!(
            key_schema(&[pk(), ("sk".to_string(), KeyType::Range)], Some(&ScalarAttributeType::S)).verdict,
            Verdict::Fail
        );
        assert_eq!(key_schema(&[("id".to_string(), KeyType::Hash)], None).verdict, Verdict::Fail);
    }

    #[test]
    fn an_expiry_on_a_store_attribute_fails() {
        assert_eq!(item_expiry(Some(&TimeToLiveStatus::Enabled), Some("fence")).verdict, Verdict::Fail);
        assert_eq!(item_expiry(Some(&TimeToLiveStatus::Enabled), Some("expires_at")).verdict, Verdict::Pass);
        assert_eq!(item_expiry(Some(&TimeToLiveStatus::Disabled), Some("fence")).verdict, Verdict::Pass);
        assert_eq!(item_expiry(None, None).verdict, Verdict::Pass);
    }
}
