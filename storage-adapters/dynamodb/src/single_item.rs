//! The single-item fenced helpers' one implementation: your own `UpdateItem`, `PutItem` or
//! `DeleteItem` gets the fence condition (ANDed with yours), the fence written on the item, one
//! attempt, and one refusal path that counts every refused fence once.
//!
//! The three operations differ only in how the fence is written on the item; everything else
//! is here once, so no operation can forget part of it (the rejection metric was once counted
//! by none of the three).

use std::collections::HashMap;

use aws_config::retry::RetryConfig;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemOutput;
use aws_sdk_dynamodb::operation::delete_item::builders::DeleteItemFluentBuilder;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemOutput;
use aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use palisade_core::spi::storable_fence;
use palisade_core::{Error, ErrorKind, GrantFence, Result};

use crate::BACKEND;
use crate::errors::map;
use crate::store::{FENCE_ASSIGNMENT, FENCE_ATTRIBUTE, FENCE_CONDITION, GRANT_ATTRIBUTE, grant_value, refusal_of};

/// One of your own single-item requests, as the fenced helpers send it.
pub(crate) trait SingleItemRequest: Sized {
    /// What the request answers.
    type Output;
    /// How it fails.
    type Error: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static;
    /// The helper's name, for errors.
    const HELPER: &'static str;

    /// The caller's own condition, if any.
    fn user_condition(&self) -> Option<&str>;

    /// Writes the fence (`:palisade_fence`) and the grant (`:palisade_grant`) on the item.
    fn writing_fence(self, fence: AttributeValue, grant: AttributeValue) -> Self;

    /// Replaces the condition with `condition`, names the fence's attributes and values, and
    /// asks for the old item when the condition fails (to tell a refused fence from the
    /// caller's own condition).
    fn conditioned(self, condition: String, fence: AttributeValue, grant: AttributeValue) -> Self;

    /// Sends the request once, whatever the client's retry settings ([`one_attempt`]).
    async fn send_once(self) -> std::result::Result<Self::Output, SdkError<Self::Error, HttpResponse>>;

    /// The old item of a `ConditionalCheckFailedException` (outer `None`: another error).
    fn condition_failure(err: &Self::Error) -> Option<Option<&HashMap<String, AttributeValue>>>;
}

macro_rules! single_item_request {
    (
        $builder:ty, $output:ty, $error:ident, $helper:literal,
        |$request:ident, $fence:ident, $grant:ident| $written:expr
    ) => {
        impl SingleItemRequest for $builder {
            type Output = $output;
            type Error = $error;
            const HELPER: &'static str = $helper;

            fn user_condition(&self) -> Option<&str> {
                self.get_condition_expression().as_deref()
            }

            fn writing_fence(self, $fence: AttributeValue, $grant: AttributeValue) -> Self {
                let $request = self;
                $written
            }

            fn conditioned(self, condition: String, fence: AttributeValue, grant: AttributeValue) -> Self {
                self.condition_expression(condition)
                    .expression_attribute_names("#palisade_fence", FENCE_ATTRIBUTE)
                    .expression_attribute_names("#palisade_grant", GRANT_ATTRIBUTE)
                    .expression_attribute_values(":palisade_fence", fence)
                    .expression_attribute_values(":palisade_grant", grant)
                    .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            }

            async fn send_once(self) -> std::result::Result<$output, SdkError<$error, HttpResponse>> {
                self.customize().config_override(one_attempt()).send().await
            }

            fn condition_failure(err: &$error) -> Option<Option<&HashMap<String, AttributeValue>>> {
                match err {
                    $error::ConditionalCheckFailedException(c) => Some(c.item()),
                    _ => None,
                }
            }
        }
    };
}

// An update joins the fence to its `SET` clause (the values are named by `conditioned`).
single_item_request!(
    UpdateItemFluentBuilder,
    UpdateItemOutput,
    UpdateItemError,
    "update_item_fenced",
    |update, _fence, _grant| {
        let expression = add_set_clause(update.get_update_expression().as_deref().unwrap_or(""), FENCE_ASSIGNMENT);
        update.update_expression(expression)
    }
);
// A put writes them as the new item's attributes.
single_item_request!(PutItemFluentBuilder, PutItemOutput, PutItemError, "put_item_fenced", |put, fence, grant| put
    .item(FENCE_ATTRIBUTE, fence)
    .item(GRANT_ATTRIBUTE, grant));
// A delete writes nothing: the condition is all it carries.
single_item_request!(
    DeleteItemFluentBuilder,
    DeleteItemOutput,
    DeleteItemError,
    "delete_item_fenced",
    |delete, _fence, _grant| delete
);

/// Sends `request` fenced by `fence`, once. A fence the item refuses (a higher one, or the same
/// from another grant) is [`ErrorKind::StaleFence`] or [`ErrorKind::DuplicateFence`], counted
/// once in `palisade_lock_fence_rejected_total` (these requests bypass
/// [`FencedStoreExt`](palisade_core::FencedStoreExt), which counts `apply`'s); the caller's own
/// condition failing is [`ErrorKind::Conflict`].
pub(crate) async fn send_fenced<R: SingleItemRequest>(request: R, fence: GrantFence) -> Result<R::Output> {
    let f = storable_fence(BACKEND, fence.fence())?;
    let value = || AttributeValue::N(f.to_string());
    let condition = with_fence_condition(request.user_condition());
    let sent = request
        .writing_fence(value(), grant_value(fence.grant()))
        .conditioned(condition, value(), grant_value(fence.grant()))
        .send_once()
        .await;
    sent.map_err(|e| refused::<R>(e, fence))
}

/// The one refusal path of the single-item requests.
fn refused<R: SingleItemRequest>(e: SdkError<R::Error, HttpResponse>, fence: GrantFence) -> Error {
    if let SdkError::ServiceError(s) = &e
        && let Some(old) = R::condition_failure(s.err())
    {
        return match refusal_of(old, fence) {
            Some(refusal) => {
                palisade_core::metrics::record_fence_rejected(BACKEND);
                refusal
            }
            None => Error::new(
                ErrorKind::Conflict,
                BACKEND,
                format!("{}: your condition on the item does not hold", R::HELPER),
            ),
        };
    }
    map(e, R::HELPER, true)
}

/// The SDK's retries for a single-item fenced request: none. A fenced update is not idempotent
/// (the same fence from the same grant passes again, so `SET qty = qty - :d` would apply once
/// per attempt), and these requests carry no idempotency token; an attempt that times out after
/// the request left is reported as `OutcomeUnknown` instead of being sent again.
fn one_attempt() -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::default().retry_config(RetryConfig::disabled())
}

/// `(fence condition) AND (yours)`.
fn with_fence_condition(user: Option<&str>) -> String {
    match user {
        Some(c) if !c.trim().is_empty() => format!("{FENCE_CONDITION} AND ({c})"),
        _ => FENCE_CONDITION.to_string(),
    }
}

/// Adds `assignment` to the `SET` clause of an update expression (DynamoDB allows each clause
/// once), or appends a `SET` clause if there is none. `SET` is a reserved word, so a bare
/// `SET` token can only be the clause keyword.
fn add_set_clause(expression: &str, assignment: &str) -> String {
    let bytes = expression.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'#' || b == b':';
    let mut i = 0;
    while i + 3 <= bytes.len() {
        let before_ok = i == 0 || !is_word(bytes[i - 1]);
        let after_ok = i + 3 == bytes.len() || !is_word(bytes[i + 3]);
        if before_ok && after_ok && expression[i..i + 3].eq_ignore_ascii_case("SET") {
            return format!("{} {assignment},{}", &expression[..i + 3], &expression[i + 3..]);
        }
        i += 1;
    }
    if expression.trim().is_empty() { format!("SET {assignment}") } else { format!("{expression} SET {assignment}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_joins_the_set_clause() {
        let a = "#palisade_fence = :palisade_fence";
        assert_eq!(add_set_clause("", a), format!("SET {a}"));
        assert_eq!(add_set_clause("SET qty = qty - :d", a), format!("SET {a}, qty = qty - :d"));
        assert_eq!(add_set_clause("set qty = :q REMOVE old", a), format!("set {a}, qty = :q REMOVE old"));
        assert_eq!(add_set_clause("REMOVE old", a), format!("REMOVE old SET {a}"));
        assert_eq!(add_set_clause("ADD #SET :set", a), format!("ADD #SET :set SET {a}"));
        assert_eq!(add_set_clause("REMOVE settings", a), format!("REMOVE settings SET {a}"));
    }

    #[test]
    fn user_conditions_are_anded() {
        assert_eq!(with_fence_condition(None), FENCE_CONDITION);
        assert_eq!(with_fence_condition(Some("qty >= :d")), format!("{FENCE_CONDITION} AND (qty >= :d)"));
    }
}
