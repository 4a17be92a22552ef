//! The header blob decoder on arbitrary bytes: it must never panic, and whatever it
//! accepts must re-encode to the same bytes.
#![no_main]

use dynamo_outbox::headers::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(headers) = decode(data) {
        if let Some(again) = encode(&headers).expect("decoded headers re-encode") {
            assert_eq!(again, data);
        }
    }
});
