//! libFuzzer's entry point for [`palisade_fuzz::targets::etcd_replies`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::targets::etcd_replies::run(data));
