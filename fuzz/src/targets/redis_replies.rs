//! Replies from Redis as the backend decodes them: the input is raw RESP, parsed by the redis
//! client's own parser and handed to the decoders of the acquire, extend and release scripts.
//! A grant comes only from a positive fence (an integer, or a decimal string from 2⁵³ on), read
//! back exactly; "held" only from `{0, pttl}`; any other reply is a `Backend` error that is not
//! retryable, never a panic.

use palisade_core::{ErrorKind, Fence};
use palisade_redis::scripts::{AcquireReply, decode_done};
use redis::Value;

/// The decimal text of an integer or bulk string reply; `None` for any other value.
fn shown(value: &Value) -> Option<String> {
    match value {
        Value::Int(n) => Some(n.to_string()),
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    }
}

fn check_acquire(reply: &Value) {
    match AcquireReply::decode(reply, "fence-key") {
        Ok(AcquireReply::Granted(fence)) => {
            assert!(fence.get() >= 1, "fence 0 from {reply:?}");
            assert!(matches!(reply, Value::Int(_) | Value::BulkString(_)), "granted from {reply:?}");
            assert_eq!(shown(reply).and_then(|s| s.parse::<u64>().ok()), Some(fence.get()), "{reply:?}");
        }
        Ok(AcquireReply::Held { remaining }) => {
            let Value::Array(items) = reply else { panic!("held from a non-array {reply:?}") };
            let [Value::Int(0), Value::Int(_)] = items.as_slice() else { panic!("held from {reply:?}") };
            assert!(remaining.as_millis() >= 1, "{reply:?}");
        }
        Err(e) => assert!(e.kind() == ErrorKind::Backend && !e.is_retryable(), "{e:?}"),
    }
}

/// One fuzz input: the bytes as they come.
pub fn run(data: &[u8]) {
    // Whatever bytes arrive, as the client parses them.
    if let Ok(reply) = redis::parse_redis_value(data) {
        check_acquire(&reply);
        match decode_done(&reply, "release") {
            Ok(done) => assert_eq!(reply, Value::Int(i64::from(done)), "{reply:?}"),
            Err(e) => assert!(e.kind() == ErrorKind::Backend && !e.is_retryable(), "{e:?}"),
        }
    }
    // The replies the script does send decode to exactly what they say.
    let mut word = [0u8; 8];
    for (w, b) in word.iter_mut().zip(data) {
        *w = *b;
    }
    let n = u64::from_le_bytes(word);
    let fence = n.max(1);
    let granted = Value::BulkString(fence.to_string().into_bytes());
    assert_eq!(AcquireReply::decode(&granted, "k").ok(), Some(AcquireReply::Granted(Fence::new(fence))));
    if let Ok(small) = i64::try_from(fence) {
        assert_eq!(AcquireReply::decode(&Value::Int(small), "k").ok(), Some(AcquireReply::Granted(Fence::new(fence))));
    }
    let pttl = i64::from_le_bytes(word);
    let remaining = std::time::Duration::from_millis(u64::try_from(pttl).unwrap_or(0).max(1));
    let held = Value::Array(vec![Value::Int(0), Value::Int(pttl)]);
    assert_eq!(AcquireReply::decode(&held, "k").ok(), Some(AcquireReply::Held { remaining }));
}
