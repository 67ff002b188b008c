//! The Lua scripts: each runs atomically on the server. Public so that benchmarks can send the
//! very same scripts through a raw client as a baseline; applications use
//! [`RedisLockService`](crate::RedisLockService).

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Fence, Result};
use redis::{Script, Value};

use crate::service::BACKEND;

/// KEYS: lock, fence. ARGV: token, ttl ms, and `wait` from a caller that will wait if the lock
/// is held.
///
/// Returns the fence when granted, `{0, pttl}` when held (pttl: the holder's remaining ms). The
/// fence is an integer reply when the counter is below 2⁵³, and a decimal string read back from
/// the key from there on: Lua numbers are doubles, exact only below 2⁵³. (A bare integer, not
/// a table: building the reply table cost Redis a tenth of the script.)
///
/// A fresh grant is `SET NX PX` then `INCR`, the least any fenced lock can do in one round
/// trip. The `INCR` runs through `pcall`: a counter Redis cannot increment fails the script
/// and deletes the lock it just took, so no lock is left held without a grant.
///
/// Idempotent per token: a lock already held by `token` is this very request sent again after
/// its reply was lost, and gets the grant back (the counter moves only on a grant, so it still
/// holds that grant's fence) instead of a second grant or "held" by its own orphan.
///
/// A caller that will wait marks the held lock in the same step that tells it "held" (the
/// holder's token gets a [`WAITED_ON`] suffix, `APPEND` keeps its expiry), so that no release
/// can fall between the two unheard: [`RELEASE`] publishes only for a marked lock. The mark
/// lives exactly as long as the grant it marks, and every later "held" answer to a waiting
/// caller marks the next grant.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
            local fence = redis.pcall('INCR', KEYS[2])
            if type(fence) == 'table' then
                redis.call('DEL', KEYS[1])
                return fence
            end
            if fence < 9007199254740992 then
                return fence
            end
            return redis.call('GET', KEYS[2])
        end
        local holder = redis.call('GET', KEYS[1])
        if holder == ARGV[1] or holder == ARGV[1] .. '+' then
            return redis.call('GET', KEYS[2])
        end
        if ARGV[3] == 'wait' and holder and string.sub(holder, -1) ~= '+' then
            redis.call('APPEND', KEYS[1], '+')
        end
        return {0, redis.call('PTTL', KEYS[1])}
        ",
    )
});

/// KEYS: lock 1‥n, then fence 1‥n. ARGV: ttl ms, then token 1‥n. [`ACQUIRE`] for a set, all
/// or nothing, in one round trip (every key in one hash slot: one server, or one slot of a
/// cluster).
///
/// Returns `{0, i}` when the lock of key `i` (counted from 0) is held by another owner, having
/// taken nothing; otherwise an array of the fences, one per key, each a decimal string read
/// back from its counter (exact at any size). Waiters are not marked: a set that finds a key
/// held waits for that key alone, through [`ACQUIRE`].
///
/// Idempotent per token as [`ACQUIRE`]: a lock already held by its key's token is this request
/// sent again after its reply was lost, and keeps its grant (and fence). A counter that is not
/// a decimal integer fails the script before anything is written, so no lock is left without a
/// grant and no fence is spent without one.
pub static ACQUIRE_ALL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        local n = #KEYS / 2
        for i = 1, n do
            local holder = redis.call('GET', KEYS[i])
            if holder and holder ~= ARGV[i + 1] and holder ~= ARGV[i + 1] .. '+' then
                return {0, i - 1}
            end
            local counter = redis.call('GET', KEYS[n + i])
            if counter and not string.match(counter, '^%d+$') then
                return redis.error_reply('fence counter ' .. KEYS[n + i] .. ' is not a non-negative integer')
            end
        end
        local fences = {}
        for i = 1, n do
            if redis.call('SET', KEYS[i], ARGV[i + 1], 'NX', 'PX', ARGV[1]) then
                redis.call('INCR', KEYS[n + i])
            end
            fences[i] = redis.call('GET', KEYS[n + i])
        end
        return fences
        ",
    )
});

/// What an [`ACQUIRE_ALL`] reply says: every key's fence, or the index of a key held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireAllReply {
    /// Granted: the fences, one per key.
    Granted(Vec<Fence>),
    /// The key at this index is held; nothing was taken.
    Held(usize),
}

impl AcquireAllReply {
    /// Decodes an [`ACQUIRE_ALL`] reply for a set of `keys` keys: `{0, i}` with `i` below
    /// `keys`, or exactly `keys` decimal strings from 1 to 2⁶⁴−1. Anything else is
    /// [`ErrorKind::Backend`].
    pub fn decode(reply: &Value, keys: usize) -> Result<Self> {
        let unexpected = || {
            Error::new(
                ErrorKind::Backend,
                BACKEND,
                format!("unexpected reply to the acquire of a set of {keys}: {reply:?}"),
            )
        };
        let Value::Array(items) = reply else { return Err(unexpected()) };
        if let [Value::Int(0), Value::Int(i)] = items.as_slice() {
            return usize::try_from(*i).ok().filter(|&i| i < keys).map(AcquireAllReply::Held).ok_or_else(unexpected);
        }
        if items.len() != keys {
            return Err(unexpected());
        }
        items
            .iter()
            .map(|item| match item {
                Value::BulkString(bytes) => std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|text| text.parse::<u64>().ok())
                    .filter(|&fence| fence > 0)
                    .map(Fence::new)
                    .ok_or_else(unexpected),
                _ => Err(unexpected()),
            })
            .collect::<Result<Vec<_>>>()
            .map(AcquireAllReply::Granted)
    }
}

/// The suffix a waiting caller's [`ACQUIRE`] appends to a held lock's value (the holder's
/// token, in hex, so never ending in it otherwise): someone waits, and the release publishes.
pub const WAITED_ON: &str = "+";

/// KEYS: lock. ARGV: token, ttl ms. Returns 1 if the caller held the lock (waited on or not)
/// and it was extended.
pub static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        local holder = redis.call('GET', KEYS[1])
        if holder == ARGV[1] or holder == ARGV[1] .. '+' then
            return redis.call('PEXPIRE', KEYS[1], ARGV[2])
        end
        return 0
        ",
    )
});

/// KEYS: lock. ARGV: token, release channel. Returns 1 if the caller held the lock. Publishes
/// on the channel only when a waiter marked the lock ([`WAITED_ON`]): an uncontended release is
/// a compare-and-delete and nothing more (a `PUBLISH` is matched against every client's pattern
/// subscription, and on a cluster sent to every node).
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        local holder = redis.call('GET', KEYS[1])
        if holder == ARGV[1] then
            redis.call('DEL', KEYS[1])
            return 1
        end
        if holder == ARGV[1] .. '+' then
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
        local holder = redis.call('GET', KEYS[1])
        if holder == ARGV[1] or holder == ARGV[1] .. '+' then
            redis.call('DEL', KEYS[1])
            redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
            if holder ~= ARGV[1] then
                redis.call('PUBLISH', ARGV[2], '1')
            end
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

/// KEYS: lock, fence. Reads, never writes: `palisade inspect`'s view of one lock in one
/// consistent step. Returns `{holder, pttl, counter}`: the lock's value (the holder's token,
/// with the waiters' mark `+` when a caller has waited since the grant) or `false`, its
/// milliseconds left (negative when there is no lock), and the counter's value or `false`.
pub static VIEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
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
    /// Decodes an [`ACQUIRE`] reply: a fence from 1 to 2⁶⁴−1 (an integer, or a decimal string)
    /// is a grant, `{0, pttl}` with an integer pttl is "held". Anything else (another shape, a
    /// fence that is not a positive integer, a flag other than 0) is a [`ErrorKind::Backend`]
    /// error naming `fence_key`: never a grant, never "held".
    pub fn decode(reply: &Value, fence_key: &str) -> Result<Self> {
        let unexpected = |why: &str| {
            Error::new(
                ErrorKind::Backend,
                BACKEND,
                format!("unexpected acquire reply ({why}) for {fence_key}: {reply:?}"),
            )
        };
        let not_a_fence = |shown: &dyn fmt::Debug| {
            Error::new(ErrorKind::Backend, BACKEND, format!("fence key {fence_key} holds {shown:?}"))
        };
        // Read off the reply's own shape, not through the client's lenient conversions: a Lua
        // number arrives as an integer, `GET` as a bulk string of decimal digits.
        match reply {
            Value::Int(fence) => match u64::try_from(*fence) {
                Ok(fence) if fence > 0 => Ok(AcquireReply::Granted(Fence::new(fence))),
                _ => Err(not_a_fence(fence)),
            },
            Value::BulkString(bytes) => {
                let text = std::str::from_utf8(bytes).map_err(|_| unexpected("not UTF-8"))?;
                match text.parse::<u64>() {
                    Ok(fence) if fence > 0 => Ok(AcquireReply::Granted(Fence::new(fence))),
                    _ => Err(not_a_fence(&text)),
                }
            }
            Value::Array(items) => {
                let [Value::Int(0), Value::Int(pttl)] = items.as_slice() else {
                    return Err(unexpected("not `{0, pttl}`"));
                };
                let remaining = u64::try_from(*pttl).ok().filter(|&ms| ms > 0).unwrap_or(1);
                Ok(AcquireReply::Held { remaining: Duration::from_millis(remaining) })
            }
            _ => Err(unexpected("neither a fence nor `{0, pttl}`")),
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
        let granted = Value::Int(42);
        assert_eq!(AcquireReply::decode(&granted, "f").unwrap(), AcquireReply::Granted(Fence::new(42)));
        let granted = bulk("42");
        assert_eq!(AcquireReply::decode(&granted, "f").unwrap(), AcquireReply::Granted(Fence::new(42)));
        let big = bulk("18446744073709551615");
        assert_eq!(AcquireReply::decode(&big, "f").unwrap(), AcquireReply::Granted(Fence::new(u64::MAX)));
        let held = Value::Array(vec![Value::Int(0), Value::Int(-2)]);
        assert_eq!(
            AcquireReply::decode(&held, "f").unwrap(),
            AcquireReply::Held { remaining: Duration::from_millis(1) }
        );
        let held = Value::Array(vec![Value::Int(0), Value::Int(1500)]);
        assert_eq!(
            AcquireReply::decode(&held, "f").unwrap(),
            AcquireReply::Held { remaining: Duration::from_millis(1500) }
        );
        for odd in [
            Value::Int(0),
            Value::Int(-3),
            bulk("0"),
            bulk("4x"),
            bulk("18446744073709551616"),
            Value::Double(42.0),
            Value::Nil,
            Value::Array(vec![Value::Int(1), bulk("42")]),
            Value::Array(vec![Value::Int(0), bulk("-2")]),
            Value::Array(vec![Value::Int(2), Value::Int(5)]),
            Value::Array(vec![Value::Int(0), Value::Int(5), Value::Int(7)]),
            Value::Array(vec![Value::Double(0.0), Value::Int(5)]),
        ] {
            assert_eq!(AcquireReply::decode(&odd, "f").unwrap_err().kind(), ErrorKind::Backend, "{odd:?}");
        }
        let set = Value::Array(vec![bulk("3"), bulk("18446744073709551615")]);
        assert_eq!(
            AcquireAllReply::decode(&set, 2).unwrap(),
            AcquireAllReply::Granted(vec![Fence::new(3), Fence::new(u64::MAX)])
        );
        let held = Value::Array(vec![Value::Int(0), Value::Int(1)]);
        assert_eq!(AcquireAllReply::decode(&held, 2).unwrap(), AcquireAllReply::Held(1));
        for odd in [
            Value::Array(vec![Value::Int(0), Value::Int(2)]),
            Value::Array(vec![Value::Int(0), Value::Int(-1)]),
            Value::Array(vec![bulk("3")]),
            Value::Array(vec![bulk("3"), bulk("0")]),
            Value::Array(vec![bulk("3"), Value::Int(4)]),
            Value::Array(vec![bulk("3"), bulk("x")]),
            Value::Array(vec![bulk("3"), Value::Nil]),
            bulk("3"),
            Value::Nil,
        ] {
            assert_eq!(AcquireAllReply::decode(&odd, 2).unwrap_err().kind(), ErrorKind::Backend, "{odd:?}");
        }
        assert!(decode_done(&Value::Int(1), "extend").unwrap());
        assert!(!decode_done(&Value::Int(0), "extend").unwrap());
        for odd in [Value::Double(0.0), Value::Double(1.0), bulk("1"), Value::Int(2), Value::Nil] {
            assert_eq!(decode_done(&odd, "extend").unwrap_err().kind(), ErrorKind::Backend, "{odd:?}");
        }
    }
}
