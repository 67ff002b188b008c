//! The compare-token scripts: each runs atomically on one master.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock. ARGV: token. Deletes the key only if it holds the token; returns 1 if it did.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('GET', KEYS[1]) == ARGV[1] then
            return redis.call('DEL', KEYS[1])
        end
        return 0
        ",
    )
});

/// KEYS: lock. ARGV: token, ttl ms. Resets the expiry only if the key holds the token.
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
