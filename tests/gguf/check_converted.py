#!/usr/bin/env python3
"""Check an mlex GGUF→MLX conversion against independent implementations.

1. Tokenizer: our tokenizer.json (loaded with `tokenizers`): decode(encode(s)) == s on a set of
   strings, chat-template markers are single tokens; with --ref-tokenizer REF.json, the same ids
   as a reference tokenizer (e.g. transformers' own GGUF import, see transformers_gguf_tokenizer.py).
2. Optionally (--generate, needs mlx-lm in the same Python): load DIR with mlx-lm and greedy-generate
   an answer to a chat prompt.

Usage: python check_converted.py FILE.gguf DIR [--ref-tokenizer REF.json] [--generate "prompt"]
"""
import os
import sys

from tokenizers import Tokenizer

SAMPLES = [
    "Hello world",
    "What is the capital of France?",
    "  leading and trailing spaces  ",
    "numbers 1234567 and 3.14159, dates 2024-05-09",
    "ünïcödé — ñ, 中文字符, 日本語, emoji 😀👍🏽",
    "code:\n\tdef f(x):\n\t\treturn x**2  # square\n",
    "don't won't I'm we'll they've she'd",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "a\n\n\nb\r\nc   d",
]


def main():
    gguf_path, out_dir = sys.argv[1], sys.argv[2]
    ours = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    ok = True
    for s in SAMPLES:
        ids = ours.encode(s, add_special_tokens=False).ids
        back = ours.decode(ids, skip_special_tokens=False)
        if back != s:
            ok = False
            print("ROUND TRIP FAIL", repr(s), repr(back))
    for marker in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        if ours.token_to_id(marker) is not None:
            ids = ours.encode(marker, add_special_tokens=False).ids
            if len(ids) != 1:
                ok = False
                print("SPECIAL SPLIT", marker, ids)
    if "--ref-tokenizer" in sys.argv:
        ref = Tokenizer.from_file(sys.argv[sys.argv.index("--ref-tokenizer") + 1])
        n_same = 0
        for s in SAMPLES:
            a = ours.encode(s, add_special_tokens=False).ids
            b = ref.encode(s, add_special_tokens=False).ids
            if a == b:
                n_same += 1
            else:
                ok = False
                print("DIFF vs transformers", repr(s), "\n  ours", a, "\n  ref ", b)
        print(f"reference tokenizer: {n_same}/{len(SAMPLES)} identical")
    if "--generate" in sys.argv:
        from mlx_lm import generate, load

        prompt = sys.argv[sys.argv.index("--generate") + 1]
        model, tok = load(out_dir)
        p = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        print("ANSWER:", repr(generate(model, tok, prompt=p, max_tokens=int(os.environ.get("MAX_TOKENS", "40")))))
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
