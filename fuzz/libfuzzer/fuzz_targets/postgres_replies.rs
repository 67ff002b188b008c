//! libFuzzer's entry point for [`palisade_fuzz::targets::postgres_replies`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::postgres_replies::run(data));
