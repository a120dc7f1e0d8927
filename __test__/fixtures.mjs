// Writes a tiny random llama checkpoint (config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json with a ChatML template) so the Node tests need no downloads and no Python.
// Weights are deterministic: the same options always give the same files (and the same replies).
import { mkdirSync, writeFileSync, existsSync, mkdtempSync } from 'node:fs'
import { join } from 'node:path'
import { tmpdir } from 'node:os'

/** GPT-2's byte → printable-unicode table (byte-level BPE vocabulary). */
export function byteToUnicode() {
  const printable = []
  for (let b = 33; b <= 126; b++) printable.push(b)
  for (let b = 161; b <= 172; b++) printable.push(b)
  for (let b = 174; b <= 255; b++) printable.push(b)
  const table = new Array(256)
  let extra = 0
  for (let b = 0; b < 256; b++) {
    table[b] = printable.includes(b) ? String.fromCodePoint(b) : String.fromCodePoint(256 + extra++)
  }
  return table
}

/** mulberry32: a small deterministic PRNG (seed → a function giving floats in [0, 1)). */
export function rng(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

export const SPECIAL_TOKENS = ['<|im_start|>', '<|im_end|>', '<|endoftext|>']

function tokenizerJson() {
  const vocab = {}
  byteToUnicode().forEach((ch, i) => { vocab[ch] = i })
  const added = SPECIAL_TOKENS.map((content, i) => ({
    id: 256 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }))
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [],
    },
  }
}

const CHATML =
  "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

/** Serialises named f32 tensors as safetensors. */
function safetensors(tensors) {
  const header = {}
  let offset = 0
  for (const [name, { shape, data }] of tensors) {
    header[name] = { dtype: 'F32', shape, data_offsets: [offset, offset + data.byteLength] }
    offset += data.byteLength
  }
  let json = JSON.stringify(header)
  json += ' '.repeat((8 - (json.length % 8)) % 8) // keep the data 8-byte aligned
  const head = Buffer.alloc(8)
  head.writeBigUInt64LE(BigInt(json.length))
  return Buffer.concat([head, Buffer.from(json), ...tensors.map(([, t]) => Buffer.from(t.data.buffer))])
}

/**
 * Writes the checkpoint into `dir` (created when missing) and returns `dir`.
 * @param {string} dir
 * @param {{ hidden?: number, layers?: number, seed?: number }} [opts]
 */
export function writeTinyLlama(dir, opts = {}) {
  const H = opts.hidden ?? 64
  const L = opts.layers ?? 2
  const heads = 4
  const kvHeads = 2
  const headDim = H / heads
  const I = H * 2
  const V = 256 + SPECIAL_TOKENS.length
  const rand = rng(opts.seed ?? 1234)
  const tensors = []
  const mat = (name, shape, scale) => {
    const n = shape.reduce((a, b) => a * b, 1)
    const data = new Float32Array(n)
    for (let i = 0; i < n; i++) data[i] = (rand() * 2 - 1) * scale
    tensors.push([name, { shape, data }])
  }
  const ones = (name, n) => tensors.push([name, { shape: [n], data: new Float32Array(n).fill(1) }])
  mat('model.embed_tokens.weight', [V, H], 1.0)
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}`
    ones(`${p}.input_layernorm.weight`, H)
    ones(`${p}.post_attention_layernorm.weight`, H)
    const s = 1 / Math.sqrt(H)
    mat(`${p}.self_attn.q_proj.weight`, [heads * headDim, H], s)
    mat(`${p}.self_attn.k_proj.weight`, [kvHeads * headDim, H], s)
    mat(`${p}.self_attn.v_proj.weight`, [kvHeads * headDim, H], s)
    mat(`${p}.self_attn.o_proj.weight`, [H, heads * headDim], s)
    mat(`${p}.mlp.gate_proj.weight`, [I, H], s)
    mat(`${p}.mlp.up_proj.weight`, [I, H], s)
    mat(`${p}.mlp.down_proj.weight`, [H, I], 1 / Math.sqrt(I))
  }
  ones('model.norm.weight', H)
  mat('lm_head.weight', [V, H], 0.5)

  mkdirSync(dir, { recursive: true })
  const config = {
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    hidden_size: H,
    num_hidden_layers: L,
    intermediate_size: I,
    num_attention_heads: heads,
    num_key_value_heads: kvHeads,
    head_dim: headDim,
    rms_norm_eps: 1e-5,
    vocab_size: V,
    rope_theta: 10000,
    max_position_embeddings: 8192,
    tie_word_embeddings: false,
    eos_token_id: 257,
    torch_dtype: 'float32',
  }
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2))
  writeFileSync(join(dir, 'model.safetensors'), safetensors(tensors))
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson()))
  writeFileSync(
    join(dir, 'tokenizer_config.json'),
    JSON.stringify({ eos_token: '<|im_end|>', bos_token: null, pad_token: '<|endoftext|>', chat_template: CHATML }, null, 2),
  )
  return dir
}

/** A fresh temporary directory holding the tiny checkpoint. */
export function tinyModelDir(opts) {
  const dir = mkdtempSync(join(tmpdir(), 'mlex-tiny-'))
  return writeTinyLlama(join(dir, 'tiny-llama'), opts)
}

// `node __test__/fixtures.mjs DIR` writes the checkpoint into DIR (used by scripts and by hand).
if (import.meta.url === `file://${process.argv[1]}`) {
  const dir = process.argv[2]
  if (!dir) {
    console.error('usage: node __test__/fixtures.mjs DIR')
    process.exit(2)
  }
  writeTinyLlama(dir)
  console.log(dir)
}
