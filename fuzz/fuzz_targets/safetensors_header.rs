//! Fuzzes the safetensors header reader (src/loader/safetensors_header.rs) over arbitrary file
//! bytes, and the shard list of `model.safetensors.index.json` over the same bytes read as text.
//! No panic; every accepted tensor lies inside the file, after the header, and holds exactly
//! dtype × shape bytes; the shard list is sorted and without repeats.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlex_fuzz::loader::safetensors_header::{index_shards, parse_header};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = parse_header(data, Path::new("fuzz.safetensors")) {
        let header_end = 8 + u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
        for (name, t) in &h.tensors {
            assert_eq!(name, &t.name);
            assert!(header_end <= t.start && t.start <= t.end && t.end <= data.len(), "{t:?}");
            let elems: usize = t.shape.iter().product();
            assert_eq!(t.end - t.start, elems * t.dtype.size(), "{t:?}");
            assert!(t.shape.iter().all(|&d| d <= i32::MAX as usize));
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(files) = index_shards(text, Path::new("model.safetensors.index.json")) {
            assert!(files.windows(2).all(|w| w[0] < w[1]), "{files:?}");
        }
    }
});
