//! libFuzzer's entry point for [`palisade_fuzz::targets::warehouse_cli`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::warehouse_cli::run(data));
