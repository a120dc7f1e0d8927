//! Convert a GGUF file to an MLX checkpoint directory (the same code path as `mlex convert`).
//!
//! cargo run --example convert_gguf -- FILE.gguf OUT_DIR [--q-bits B] [--q-group-size G] [--dtype f16|bf16|f32]
use std::path::PathBuf;

use mlex::convert::{convert_gguf, progress_bar_callback, ConvertOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(src), Some(out)) = (args.next(), args.next()) else {
        eprintln!("usage: convert_gguf FILE.gguf OUT_DIR [--q-bits B] [--q-group-size G] [--dtype f16|bf16|f32]");
        std::process::exit(2);
    };
    let mut opts = ConvertOptions::default();
    while let Some(a) = args.next() {
        let v = args.next().expect("missing value");
        match a.as_str() {
            "--q-bits" => opts.q_bits = Some(v.parse().expect("bits")),
            "--q-group-size" => opts.q_group_size = v.parse().expect("group size"),
            "--dtype" => opts.float_dtype = v.parse().expect("dtype"),
            _ => panic!("unknown option {a}"),
        }
    }
    let (bar, mut cb) = progress_bar_callback();
    let t = std::time::Instant::now();
    match convert_gguf(&PathBuf::from(src), &PathBuf::from(out), &opts, &mut cb) {
        Ok(s) => {
            bar.finish_and_clear();
            println!("{s:#?}");
            println!("converted in {:.1}s", t.elapsed().as_secs_f64());
        }
        Err(e) => {
            bar.abandon();
            eprintln!("error [{}]: {e}", e.code());
            std::process::exit(1);
        }
    }
}
