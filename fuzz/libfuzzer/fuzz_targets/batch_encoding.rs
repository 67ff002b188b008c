//! libFuzzer's entry point for [`palisade_fuzz::targets::batch_encoding`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::batch_encoding::run(data));
