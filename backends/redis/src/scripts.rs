//! The Lua scripts: each runs atomically on the server. Public so that benchmarks can send the
//! very same scripts through a raw client as a baseline; applications use
//! [`RedisLockService`](crate::RedisLockService).

use std::sync::LazyLock;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Fence, Result};
use redis::{Script, Value};

use crate::service::BACKEND;

/// KEYS: lock, fence. ARGV: token, ttl ms.
/// Returns `{1, fence}` when granted, `{0, pttl}` when held (pttl: the holder's remaining ms),
/// each as a decimal string: Lua numbers are doubles, inexact above 2⁵³, so the fence is read
/// back from the key rather than passed through Lua. `INCR` runs before `SET`: a counter Redis
/// cannot increment fails the script before any lock is taken.
///
/// Idempotent per token: a lock already held by `token` is this very request sent again after
/// its reply was lost, and gets the grant back (the counter moves only on a grant, so it still
/// holds that grant's fence) instead of a second grant or "held" by its own orphan.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        local holder = redis.call('GET', KEYS[1])
        if not holder then
            redis.call('INCR', KEYS[2])
            redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
            return {1, redis.call('GET', KEYS[2])}
        end
        if holder == ARGV[1] then
            return {1, redis.call('GET', KEYS[2])}
        end
        return {0, tostring(redis.call('PTTL', KEYS[1]))}
        ",
    )
});

/// KEYS: lock. ARGV: token, ttl ms. Returns 1 if the caller held the lock and it was extended.
pub static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('GET', KEYS[1]) == ARGV[1] then
            return redis.call('PEXPIRE', KEYS[1], ARGV[2])
        end
        return 0
        ",
    )
});

/// KEYS: lock. ARGV: token, release channel. Returns 1 if the caller held the lock.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('GET', KEYS[1]) == ARGV[1] then
            redis.call('DEL', KEYS[1])
            redis.call('PUBLISH', ARGV[2], '1')
            return 1
        end
        return 0
        ",
    )
});

/// KEYS: lock, this release call's marker. ARGV: token, release channel, the marker's
/// lifetime in ms. [`RELEASE`] for a connection whose client library resends a request by
/// itself when its connection drops (a cluster client), so the service cannot tell a resend
/// from a first send: the release that deletes the lock leaves a marker named after the call
/// (a fresh nonce), and a resend of the same call that finds the lock gone finds its marker
/// and answers 1, whoever took and released the lock in between. A caller's own repeat is a
/// new call with a new marker: 0.
pub static RELEASE_MARKED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('GET', KEYS[1]) == ARGV[1] then
            redis.call('DEL', KEYS[1])
            redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
            redis.call('PUBLISH', ARGV[2], '1')
            return 1
        end
        return redis.call('EXISTS', KEYS[2])
        ",
    )
});

/// KEYS: fence. ARGV: floor. Raises the counter to the floor, never lowers it; returns it.
pub static ADVANCE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        local current = redis.call('GET', KEYS[1]) or '0'
        local floor = ARGV[1]
        if not string.match(current, '^%d+$') or not string.match(floor, '^%d+$') then
            return redis.error_reply('fence counter or floor is not a non-negative integer')
        end
        -- Decimal strings without leading zeros: shorter is smaller, else compare as text.
        -- (tonumber would compare doubles, inexact above 2^53.)
        if #current < #floor or (#current == #floor and current < floor) then
            redis.call('SET', KEYS[1], floor)
            return floor
        end
        return current
        ",
    )
});

/// What an [`ACQUIRE`] reply says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Granted, with the fence the counter holds.
    Granted(Fence),
    /// Held by another owner for about `remaining` more (at least 1 ms: a lock without expiry,
    /// PTTL -1, or one that just vanished, PTTL -2, is worth trying again soon).
    Held {
        /// The holder's remaining time to live.
        remaining: Duration,
    },
}

impl AcquireReply {
    /// Decodes an [`ACQUIRE`] reply: an array of an integer flag and a bulk string, `{1, fence}`
    /// with a decimal fence from 1 to 2⁶⁴−1, or `{0, pttl}` with a decimal pttl. Anything else
    /// (another shape, a flag other than 0 or 1, a fence that is not a positive integer) is a
    /// [`ErrorKind::Backend`] error naming `fence_key`: never a grant, never "held".
    pub fn decode(reply: &Value, fence_key: &str) -> Result<Self> {
        let unexpected = |why: &str| {
            Error::new(
                ErrorKind::Backend,
                BACKEND,
                format!("unexpected acquire reply ({why}) for {fence_key}: {reply:?}"),
            )
        };
        // Read off the reply's own shape, not through the client's lenient conversions: a Lua
        // integer arrives as an integer, `GET` and `tostring` as bulk strings.
        let Value::Array(items) = reply else { return Err(unexpected("not an array")) };
        let [Value::Int(flag), Value::BulkString(value)] = items.as_slice() else {
            return Err(unexpected("not an integer and a string"));
        };
        let value = std::str::from_utf8(value).map_err(|_| unexpected("not UTF-8"))?;
        match flag {
            1 => match value.parse::<u64>() {
                Ok(fence) if fence > 0 => Ok(AcquireReply::Granted(Fence::new(fence))),
                _ => Err(Error::new(ErrorKind::Backend, BACKEND, format!("fence key {fence_key} holds {value:?}"))),
            },
            0 => {
                let pttl = value.parse::<i64>().map_err(|_| unexpected("a PTTL that is not an integer"))?;
                let remaining = u64::try_from(pttl).ok().filter(|&ms| ms > 0).unwrap_or(1);
                Ok(AcquireReply::Held { remaining: Duration::from_millis(remaining) })
            }
            _ => Err(unexpected("a flag other than 0 or 1")),
        }
    }
}

/// Decodes an [`EXTEND`] or [`RELEASE`] reply: 1 (done) or 0 (not the holder); anything else is
/// an [`ErrorKind::Backend`] error, never taken for either.
pub fn decode_done(reply: &Value, what: &str) -> Result<bool> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        _ => Err(Error::new(ErrorKind::Backend, BACKEND, format!("unexpected {what} reply: {reply:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// Only the replies the scripts send decode (found by fuzz/redis_replies: the client's
    /// conversions also took a RESP3 double `0.0` as "not the holder").
    #[test]
    fn replies_decode_only_in_the_scripts_shapes() {
        let granted = Value::Array(vec![Value::Int(1), bulk("42")]);
        assert_eq!(AcquireReply::decode(&granted, "f").unwrap(), AcquireReply::Granted(Fence::new(42)));
        let held = Value::Array(vec![Value::Int(0), bulk("-2")]);
        assert_eq!(
            AcquireReply::decode(&held, "f").unwrap(),
            AcquireReply::Held { remaining: Duration::from_millis(1) }
        );
        for odd in [
            Value::Array(vec![Value::Int(2), bulk("42")]),
            Value::Array(vec![Value::Int(1), bulk("0")]),
            Value::Array(vec![Value::Int(1), bulk("4x")]),
            Value::Array(vec![Value::Double(1.0), bulk("42")]),
            Value::Array(vec![Value::Int(1), bulk("42"), bulk("7")]),
            Value::Int(1),
        ] {
            assert_eq!(AcquireReply::decode(&odd, "f").unwrap_err().kind(), ErrorKind::Backend, "{odd:?}");
        }
        assert!(decode_done(&Value::Int(1), "extend").unwrap());
        assert!(!decode_done(&Value::Int(0), "extend").unwrap());
        for odd in [Value::Double(0.0), Value::Double(1.0), bulk("1"), Value::Int(2), Value::Nil] {
            assert_eq!(decode_done(&odd, "extend").unwrap_err().kind(), ErrorKind::Backend, "{odd:?}");
        }
    }
}
