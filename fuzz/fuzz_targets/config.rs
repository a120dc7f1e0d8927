//! Fuzzes config.json parsing (src/loader/config.rs, quant_config.rs): the shared fields, the
//! `text_config` merge, rotary settings and the quantization block. No panic; what is accepted is
//! in range (sizes positive and plausible, every quantization spec one MLX implements, sizes read
//! as given: no integer that wraps into a valid one).
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlex_fuzz::loader::config::{ModelConfig, RopeFields};
use mlex_fuzz::loader::quant_config::{QuantConfig, QuantSpec};
use serde_json::Value;
use std::path::Path;

fn check_spec(spec: &QuantSpec, json: Option<&Value>) {
    spec.mode.validate(spec.bits, spec.group_size).expect("an accepted spec is valid");
    if let Some(obj) = json.and_then(|v| v.as_object()) {
        if let Some(g) = obj.get("group_size") {
            assert_eq!(g.as_u64(), Some(spec.group_size as u64), "group_size read as given");
        }
        if let Some(b) = obj.get("bits") {
            assert_eq!(b.as_u64(), Some(spec.bits as u64), "bits read as given");
        }
    }
}

fn check_quant(q: &QuantConfig, json: &Value) {
    if let Some(d) = &q.default {
        check_spec(d, Some(json));
    }
    for (module, spec) in &q.overrides {
        if let Some(s) = spec {
            let entry = json.get(module).filter(|e| e.is_object());
            check_spec(s, entry);
        }
        assert_eq!(q.for_module(module), *spec);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cfg) = ModelConfig::from_json(text, Path::new("config.json")) {
        assert!(cfg.num_hidden_layers > 0 && cfg.num_hidden_layers <= 1 << 24);
        assert!(cfg.vocab_size > 0 && cfg.vocab_size <= 1 << 24);
        assert!(cfg.raw.get("text_config").is_none_or(|t| !t.is_object()), "text_config merged");
        let _ = (cfg.context_length(), cfg.declared_half_dtype());
        if let Ok(rope) = cfg.parse::<RopeFields>() {
            let _ = rope.parse(10_000.0);
        }
        if let Some(q) = &cfg.quantization {
            let top: Value = serde_json::from_str(text).unwrap();
            let json = top.get("quantization").or_else(|| top.get("quantization_config")).unwrap();
            check_quant(q, json);
            let _ = q.for_module("model.layers.0.self_attn.q_proj");
        }
    }
    // The quantization block alone, whatever the JSON value.
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        if let Ok(q) = QuantConfig::from_json(&v) {
            check_quant(&q, &v);
        }
    }
});
