//! Fault injection: proxies that lose replies, cut connections, partition and delay; a
//! service made slow; the loopback relay that lets a child process reach an in-process service.

pub mod latency;
pub mod proxy;
pub mod relay;
