//! libFuzzer's entry point for [`palisade_fuzz::targets::connection_urls`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::connection_urls::run(data));
