//! The properties that both the property tests (`core/tests/properties.rs`) and the fuzz
//! targets (`fuzz/`) assert: each stated once, as a function that says what went wrong.
//! proptest draws the inputs from strategies, libFuzzer from coverage; the verdict is the same.

#![allow(dead_code)] // each user takes the checks it needs

use palisade_core::spi::{encode_userinfo, validate_record_key};
use palisade_core::{
    ErrorKind, MAX_DOMAIN_LEN, MAX_ID_LEN, MAX_RECORD_KEY_LEN, ResourceKey, WriteBatch, WriteOp, redact_url,
};

/// Text shown to a user or a log (a redacted URL, an error, a `Debug` rendering) never holds
/// `password`, neither as written nor percent-encoded.
pub fn hides_password(what: &str, shown: &str, password: &str) -> Result<(), String> {
    let encoded = encode_userinfo(None, Some(password));
    let encoded = encoded.trim_start_matches(':').trim_end_matches('@');
    if shown.contains(password) || shown.contains(encoded) {
        return Err(format!("{what} shows the password {password:?}: {shown}"));
    }
    Ok(())
}

/// [`redact_url`] of a URL that holds `password` (anywhere) hides it.
pub fn redaction_hides_password(url: &str, password: &str) -> Result<(), String> {
    hides_password(&format!("redact_url({url:?})"), &redact_url(url), password)
}

/// A key built from `domain` and `id` is valid exactly when both parts are (1 to their maximum
/// bytes of ASCII letters, digits, `-`, `_` and `.`); a valid one keeps its parts and
/// round-trips through its text, an invalid one is `InvalidKey`.
pub fn resource_key_round_trips(domain: &str, id: &str) -> Result<(), String> {
    let part_ok = |p: &str, max: usize| {
        !p.is_empty() && p.len() <= max && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let valid = part_ok(domain, MAX_DOMAIN_LEN) && part_ok(id, MAX_ID_LEN);
    match ResourceKey::new(domain, id) {
        Ok(key) if valid => {
            if key.domain() != domain || key.id() != id {
                return Err(format!("{key:?} lost its parts {domain:?}, {id:?}"));
            }
            let again = ResourceKey::parse(&key.to_string()).map_err(|e| format!("{key} does not parse back: {e}"))?;
            if again != key {
                return Err(format!("{key} parses back as {again:?}"));
            }
            if key.lock_key() == key.fence_key() {
                return Err(format!("{key}: its lock and fence keys are one key"));
            }
            Ok(())
        }
        Ok(key) => Err(format!("{domain:?}, {id:?} accepted as {key:?}")),
        Err(e) if !valid && e.kind() == ErrorKind::InvalidKey => Ok(()),
        Err(e) => Err(format!("{domain:?}, {id:?} refused as {:?}: {e}", e.kind())),
    }
}

/// Any text parses as a key exactly when it is `domain:id` of a valid domain and id (split at
/// the first `:`), and then prints back as that text; otherwise it is `InvalidKey`.
pub fn resource_key_text(text: &str) -> Result<(), String> {
    match (ResourceKey::parse(text), text.split_once(':')) {
        (Ok(key), _) if key.to_string() == text => resource_key_round_trips(key.domain(), key.id()),
        (Ok(key), _) => Err(format!("{text:?} parses as {key}, which prints differently")),
        (Err(e), Some((domain, id))) if e.kind() == ErrorKind::InvalidKey => match ResourceKey::new(domain, id) {
            Ok(key) => Err(format!("{text:?} refused, but its parts make {key}")),
            Err(_) => Ok(()),
        },
        (Err(e), None) if e.kind() == ErrorKind::InvalidKey => Ok(()),
        (Err(e), _) => Err(format!("{text:?} refused as {:?}: {e}", e.kind())),
    }
}

/// A record key is valid exactly when it is non-empty, at most [`MAX_RECORD_KEY_LEN`] bytes and
/// free of control characters; an invalid one is `InvalidKey`.
pub fn record_key_validation(key: &str) -> Result<(), String> {
    let valid = !key.is_empty() && key.len() <= MAX_RECORD_KEY_LEN && !key.chars().any(char::is_control);
    match (validate_record_key(key), valid) {
        (Ok(()), true) => Ok(()),
        (Err(e), false) if e.kind() == ErrorKind::InvalidKey => Ok(()),
        (Ok(()), false) => Err(format!("record key {key:?} accepted")),
        (Err(e), _) => Err(format!("record key {key:?} refused as {:?}: {e}", e.kind())),
    }
}

/// A batch is valid exactly when it has at most [`WriteBatch::MAX_OPS`] operations, each key
/// valid, no key written twice nor checked twice, and no value over the limit; a bad key is
/// `InvalidKey`, anything else `InvalidArgument`.
pub fn batch_validation(batch: &WriteBatch, max_value_len: usize) -> Result<(), String> {
    let ops = batch.ops();
    let mut written = std::collections::HashSet::new();
    let mut checked = std::collections::HashSet::new();
    let mut bad_key = false;
    let mut other = ops.len() > WriteBatch::MAX_OPS;
    for op in ops {
        bad_key |= validate_record_key(op.key()).is_err();
        let seen = if matches!(op, WriteOp::Check { .. }) { &mut checked } else { &mut written };
        other |= !seen.insert(op.key());
        if let WriteOp::Put { value, .. } | WriteOp::Create { value, .. } = op {
            other |= value.len() > max_value_len;
        }
    }
    match batch.validate() {
        Ok(()) if !bad_key && !other => Ok(()),
        Ok(()) => Err(format!("an invalid batch of {} operations was accepted", ops.len())),
        Err(e) if bad_key && e.kind() == ErrorKind::InvalidKey => Ok(()),
        Err(e) if other && e.kind() == ErrorKind::InvalidArgument => Ok(()),
        Err(e) => Err(format!("batch refused as {:?} (bad key: {bad_key}, otherwise invalid: {other}): {e}", e.kind())),
    }
}
