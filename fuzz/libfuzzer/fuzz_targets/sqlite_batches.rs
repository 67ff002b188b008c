//! libFuzzer's entry point for [`palisade_fuzz::targets::sqlite_batches`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::sqlite_batches::run(data));
