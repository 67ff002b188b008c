//! The Lua scripts: each runs atomically on the server. Public so that benchmarks can send the
//! very same scripts through a raw client as a baseline; applications use
//! [`RedisLockService`](crate::RedisLockService).

use std::sync::LazyLock;

use redis::Script;

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
