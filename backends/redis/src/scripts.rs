//! The Lua scripts: each runs atomically on the server.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence. ARGV: token, ttl ms.
/// Returns `{1, fence}` when granted, `{0, pttl}` when held (pttl: the holder's remaining ms).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
            return {1, redis.call('INCR', KEYS[2])}
        end
        return {0, redis.call('PTTL', KEYS[1])}
        ",
    )
});

/// KEYS: lock. ARGV: token, ttl ms. Returns 1 if the caller held the lock and it was extended.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
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
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
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

/// KEYS: fence. ARGV: floor. Raises the counter to the floor, never lowers it; returns it.
pub(crate) static ADVANCE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        local current = tonumber(redis.call('GET', KEYS[1]) or '0')
        local floor = tonumber(ARGV[1])
        if current < floor then
            redis.call('SET', KEYS[1], ARGV[1])
            return floor
        end
        return current
        ",
    )
});
