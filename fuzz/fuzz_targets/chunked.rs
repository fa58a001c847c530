#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| freeboard_proto::fuzzing::chunked(data));
