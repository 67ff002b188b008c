//! libFuzzer's entry point for [`palisade_fuzz::targets::keys_and_records`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::keys_and_records::run(data));
