#!/usr/bin/env python3
"""Independent reference: transformers' own GGUF tokenizer import, saved as tokenizer.json.

Usage: python transformers_gguf_tokenizer.py FILE.gguf OUT.json   (needs: pip install gguf transformers tokenizers)
transformers only refuses this path without torch; the tokenizer conversion itself does not use it.
"""
import sys
import transformers.modeling_gguf_pytorch_utils as m
m.is_torch_available = lambda: True
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
d = m.load_gguf_checkpoint(sys.argv[1], return_tensors=False)
arch = d["config"]["model_type"]
fast, extra = convert_gguf_tokenizer(arch, d["tokenizer"])
fast.save(sys.argv[2])
print("saved", arch, extra)
