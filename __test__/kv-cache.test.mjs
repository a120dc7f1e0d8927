// KV cache options (maxKvSize, kvBits, kvGroupSize, quantizedKvStart) and the contextLength load
// option through the Node API (their agreement with mlx-lm is the Rust conformance suite's).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Session } from 'mlex'
import { tinyModelDir } from './fixtures.mjs'
import { user, rejectsWithCode } from './helpers.mjs'

// head_dim 32, so that a quantization group of 32 divides it.
const dir = tinyModelDir({ hidden: 128 })
let session
before(async () => {
  session = await Session.load(dir, { device: 'cpu' })
})
after(async () => {
  await session?.close()
})

test('maxKvSize and kvBits generate, alone and outside the batch', async () => {
  const plain = await session.generate(user('hello there'), { maxTokens: 24, ignoreEos: true })
  assert.equal(plain.usage.batched, true)
  for (const opts of [{ maxKvSize: 8 }, { kvBits: 8, kvGroupSize: 32, quantizedKvStart: 0 }, { kvBits: 4, kvGroupSize: 32 }]) {
    const r = await session.generate(user('hello there'), { maxTokens: 24, ignoreEos: true, ...opts })
    assert.equal(r.tokens.length, 24, JSON.stringify(opts))
    assert.equal(r.finishReason, 'length')
    assert.equal(r.usage.batched, false, JSON.stringify(opts))
    assert.equal(r.usage.cachedTokens, 0)
  }
  // A start beyond the reply never quantizes: the plain reply.
  const late = await session.generate(user('hello there'), { maxTokens: 24, ignoreEos: true, kvBits: 4, kvGroupSize: 32 })
  assert.deepEqual(late.tokens, plain.tokens)
})

test('bad KV cache options reject naming the option', async () => {
  await rejectsWithCode(assert, () => session.generate(user('x'), { maxKvSize: 4 }), 'INVALID_ARGUMENT', /maxKvSize must be greater than 4/)
  await rejectsWithCode(assert, () => session.generate(user('x'), { kvBits: 7 }), 'INVALID_ARGUMENT', /kvBits must be 2, 3, 4, 5, 6 or 8/)
  await rejectsWithCode(assert, () => session.generate(user('x'), { kvBits: 4, kvGroupSize: 48 }), 'INVALID_ARGUMENT', /kvGroupSize/)
  await rejectsWithCode(assert, () => session.generate(user('x'), { maxKvSize: 16, kvBits: 4 }), 'INVALID_ARGUMENT', /cannot be combined/)
  await rejectsWithCode(assert, () => session.generate(user('x'), { kvBits: 4, kvGroupSize: 64, quantizedKvStart: 0 }), 'INVALID_ARGUMENT', /kv_group_size 64 does not divide/)
})

test('int8Activations loads and generates (float weights: the same reply)', async () => {
  const s = await Session.load(dir, { device: 'cpu', int8Activations: true })
  try {
    // In effect exactly where the CPU has AVX-512 VNNI (Linux: its flags in /proc/cpuinfo).
    const { readFileSync, existsSync } = await import('node:fs')
    if (existsSync('/proc/cpuinfo') && process.arch === 'x64') {
      const vnni = / avx512_vnni( |$)/m.test(readFileSync('/proc/cpuinfo', 'utf8')) && !process.env.MLEX_CPU_NO_AVX512
      assert.equal(s.info.int8Activations, vnni)
    }
    const r = await s.generate(user('hello there'), { maxTokens: 12, ignoreEos: true })
    const plain = await session.generate(user('hello there'), { maxTokens: 12, ignoreEos: true })
    assert.deepEqual(r.tokens, plain.tokens)
  } finally {
    await s.close()
  }
})

test('contextLength ends a reply with length and refuses a prompt that fills it', async () => {
  const s = await Session.load(dir, { device: 'cpu', contextLength: 40 })
  try {
    assert.equal(s.info.contextLength, 40)
    const r = await s.generate(user('hi'), { maxTokens: 1000, ignoreEos: true })
    assert.equal(r.finishReason, 'length')
    assert.equal(r.usage.promptTokens + r.usage.completionTokens, 40)
    await rejectsWithCode(assert, () => s.generate(user('x'.repeat(60)), { maxTokens: 4 }), 'INVALID_ARGUMENT', /context length is 40/)
    // A window within the context lifts the limit.
    const w = await s.generate(user('x'.repeat(60)), { maxTokens: 8, ignoreEos: true, maxKvSize: 16 })
    assert.equal(w.tokens.length, 8)
  } finally {
    await s.close()
  }
  await rejectsWithCode(assert, () => Session.load(dir, { contextLength: 0 }), 'INVALID_ARGUMENT', /contextLength must be at least 1/)
})
