//! Fuzzes the GGUF reader (src/gguf/mod.rs) over arbitrary file bytes: header, metadata
//! key/values (nested arrays included), tensor infos, then every accessor and the block decoders
//! over each accepted tensor. No panic, no overflow, no allocation sized by an unchecked count
//! (libFuzzer's -malloc_limit_mb catches those); every accepted tensor lies inside the file.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlex_fuzz::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else { return };
    assert!(f.alignment.is_power_of_two());
    for (key, v) in &f.metadata {
        assert!(f.get(key).is_some());
        let _ = (f.get_str(key), f.get_u64(key), f.get_f64(key), f.get_bool(key), f.get_array(key));
        let _ = (v.value_type(), v.as_int(), v.as_f64(), v.as_str(), v.as_bool(), v.as_array());
    }
    for t in &f.tensors {
        assert!(f.tensor(&t.name).is_some());
        let end = f.data_offset + t.offset + t.n_bytes;
        assert!(end <= data.len() as u64, "{t:?}");
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        let _ = (t.shape(), t.row_len(), t.n_rows(), t.row_bytes());
        // Decoding is linear in the tensor's bytes; keep each run short.
        if t.ty.can_dequantize() && t.n_elements <= 1 << 16 {
            let _ = f.dequantize(t);
            let rows = t.n_rows().max(1);
            // (An empty tensor's row can still be long: size the buffer by the elements.)
            let mut row = vec![0f32; t.row_len().min(t.n_elements) as usize];
            let _ = f.dequantize_row(t, 0, &mut row);
            let _ = f.dequantize_row(t, rows - 1, &mut row);
            let _ = f.dequantize_row(t, rows, &mut row);
        }
    }
});
