//! libFuzzer's entry point for [`palisade_fuzz::targets::redis_replies`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::redis_replies::run(data));
