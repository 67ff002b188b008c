//! libFuzzer's entry point for [`palisade_fuzz::targets::zookeeper_nodes`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::zookeeper_nodes::run(data));
