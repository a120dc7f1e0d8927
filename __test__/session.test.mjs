// The Session API against a tiny random checkpoint written by the test itself.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { tmpdir } from 'node:os'
import { Session, ERROR_CODES } from 'mlex'
import { modelDir, user, rejectsWithCode } from './helpers.mjs'

let session
before(async () => {
  session = await Session.load(modelDir(), { device: 'cpu' })
})
after(async () => {
  await session?.close()
})

test('load reports what the model is', () => {
  const info = session.info
  assert.equal(info.modelType, 'llama')
  assert.equal(info.numLayers, 2)
  assert.equal(info.vocabSize, 259)
  assert.equal(info.contextLength, 8192)
  assert.equal(info.quantization ?? null, null)
  assert.equal(info.dtype, 'float32')
  assert.equal(info.device, 'cpu')
  assert.equal(info.supportsImages, false)
  assert.equal(info.supportsAudio, false)
  assert.equal(info.supportsVideo, false)
  assert.equal(info.int8Activations, false)
  assert.ok(info.weightsBytes > 0)
  assert.equal(session.closed, false)
  assert.deepEqual([...ERROR_CODES].sort(), ['ABORTED', 'INVALID_ARGUMENT', 'INVALID_CHECKPOINT', 'MLX_ERROR', 'MODEL_NOT_FOUND', 'OUT_OF_MEMORY', 'SESSION_CLOSED'])
})

test('load reports progress', async () => {
  const seen = []
  const s = await Session.load(modelDir(), { onProgress: (p) => seen.push(p) })
  await s.close()
  assert.deepEqual(seen.map((p) => p.stage), ['load', 'ready'])
  assert.deepEqual(seen.at(-1), { stage: 'ready', done: 1, total: 1 })
})

test('generate returns a reply with usage', async () => {
  const reply = await session.generate(user('hello'), { maxTokens: 8, ignoreEos: true })
  assert.equal(typeof reply.text, 'string')
  assert.equal(reply.tokens.length, 8)
  assert.equal(reply.logprobs.length, 8)
  assert.equal(reply.finishReason, 'length')
  assert.deepEqual(reply.toolCalls, [])
  assert.equal(reply.usage.completionTokens, 8)
  assert.ok(reply.usage.promptTokens > 5)
  assert.equal(reply.usage.cachedTokens, 0)
  assert.ok(reply.usage.ttftMs >= 0)
  assert.ok(reply.usage.decodeTokensPerSecond > 0)
  assert.ok(reply.usage.scheduleMsPerStep > 0 && reply.usage.submitMsPerStep <= reply.usage.scheduleMsPerStep)
  assert.ok(reply.usage.waitMsPerStep >= 0)
  assert.ok(reply.logprobs.every((l) => l <= 0))
})

test('greedy generation is deterministic; seeded sampling too', async () => {
  const a = await session.generate(user('same'), { maxTokens: 12, ignoreEos: true })
  const b = await session.generate(user('same'), { maxTokens: 12, ignoreEos: true })
  assert.deepEqual(a.tokens, b.tokens)
  const opts = { maxTokens: 12, ignoreEos: true, temperature: 0.9, topP: 0.95, topK: 50, seed: 7 }
  const c = await session.generate(user('same'), opts)
  const d = await session.generate(user('same'), opts)
  assert.deepEqual(c.tokens, d.tokens)
})

test('stream yields the same tokens as generate, and the reply at the end', async () => {
  const expected = await session.generate(user('stream me'), { maxTokens: 10, ignoreEos: true })
  const tokens = []
  for await (const t of session.stream(user('stream me'), { maxTokens: 10, ignoreEos: true })) {
    assert.equal(typeof t.id, 'number')
    assert.equal(typeof t.text, 'string')
    assert.equal(t.kind, 'text')
    assert.ok(t.logprob <= 0)
    tokens.push(t)
  }
  assert.deepEqual(tokens.map((t) => t.id), expected.tokens)
  assert.equal(tokens.map((t) => t.text).join(''), expected.text)

  const it = session.stream(user('stream me'), { maxTokens: 3, ignoreEos: true })
  assert.equal(typeof it[Symbol.asyncIterator], 'function')
  let r
  while (!(r = await it.next()).done) {}
  assert.equal(r.value.finishReason, 'length')
  assert.equal(r.value.tokens.length, 3)
})

test('topLogprobs: the most likely tokens of each step, whole and streamed', async () => {
  const opts = { maxTokens: 8, ignoreEos: true, topLogprobs: 4 }
  const reply = await session.generate(user('top'), opts)
  assert.equal(reply.topLogprobs.length, reply.tokens.length)
  reply.topLogprobs.forEach((top, i) => {
    assert.equal(top.length, 4)
    // Greedy: the first is the token itself, with its own logprob; the rest in order.
    assert.equal(top[0].id, reply.tokens[i])
    assert.ok(Math.abs(top[0].logprob - reply.logprobs[i]) < 1e-6)
    for (let j = 1; j < top.length; j++) assert.ok(top[j].logprob <= top[j - 1].logprob)
    assert.ok(top.every((t) => typeof t.text === 'string' && t.logprob <= 0))
    assert.ok(top.reduce((p, t) => p + Math.exp(t.logprob), 0) <= 1 + 1e-5)
  })
  const streamed = []
  for await (const t of session.stream(user('top'), opts)) streamed.push(t.topLogprobs)
  assert.deepEqual(streamed, reply.topLogprobs)

  const plain = await session.generate(user('top'), { maxTokens: 8, ignoreEos: true })
  assert.deepEqual(plain.tokens, reply.tokens)
  assert.deepEqual(plain.topLogprobs, [])
  for await (const t of session.stream(user('top'), { maxTokens: 2 })) assert.deepEqual(t.topLogprobs, [])
  await rejectsWithCode(assert, () => session.generate(user('x'), { topLogprobs: 21 }), 'INVALID_ARGUMENT', /topLogprobs must be in \[0, 20\], got 21/)
})

test('onToken sees every token of generate', async () => {
  const seen = []
  const reply = await session.generate(user('callback'), { maxTokens: 6, ignoreEos: true, onToken: (t) => { seen.push(t.id) } })
  assert.deepEqual(seen, reply.tokens)
})

test('onToken returning false stops the generation', async () => {
  let calls = 0
  const reply = await session.generate(user('stop early'), {
    maxTokens: 100000,
    ignoreEos: true,
    onToken: () => ++calls < 3 ? undefined : false,
  })
  assert.equal(calls, 3)
  assert.equal(reply.finishReason, 'abort')
  assert.ok(reply.tokens.length >= 3 && reply.tokens.length < 1000, `${reply.tokens.length} tokens`)
})

test('a throwing onToken rejects with its error; the session keeps working', async () => {
  const boom = new Error('boom')
  await assert.rejects(
    session.generate(user('throw'), { maxTokens: 100000, ignoreEos: true, onToken: () => { throw boom } }),
    (e) => e === boom,
  )
  await assert.rejects(
    (async () => { for await (const _ of session.stream(user('throw'), { maxTokens: 100000, ignoreEos: true, onToken: () => { throw boom } })) {} })(),
    (e) => e === boom,
  )
  const after = await session.generate(user('after'), { maxTokens: 4, ignoreEos: true })
  assert.equal(after.tokens.length, 4)
})

test('a signal aborted before the start rejects with ABORTED', async () => {
  const signal = AbortSignal.abort()
  await rejectsWithCode(assert, () => session.generate(user('x'), { signal }), 'ABORTED')
  await rejectsWithCode(assert, async () => { for await (const _ of session.stream(user('x'), { signal })) {} }, 'ABORTED')
  await rejectsWithCode(assert, () => Session.load(modelDir(), { signal }), 'ABORTED')
})

test('aborting mid-generation resolves with the partial reply', async () => {
  const ac = new AbortController()
  let n = 0
  const reply = await session.generate(user('abort me'), {
    maxTokens: 100000,
    ignoreEos: true,
    signal: ac.signal,
    onToken: () => { if (++n === 5) ac.abort() },
  })
  assert.equal(reply.finishReason, 'abort')
  assert.ok(reply.tokens.length >= 5 && reply.tokens.length < 1000, `${reply.tokens.length} tokens`)

  const ac2 = new AbortController()
  const got = []
  for await (const t of session.stream(user('abort me'), { maxTokens: 100000, ignoreEos: true, signal: ac2.signal })) {
    got.push(t)
    if (got.length === 4) ac2.abort()
  }
  assert.ok(got.length >= 4 && got.length < 1000)
})

test('breaking out of for-await stops the generation and frees the queue', async () => {
  let n = 0
  const t0 = performance.now()
  for await (const _ of session.stream(user('endless'), { maxTokens: 1_000_000, ignoreEos: true })) {
    if (++n === 3) break
  }
  // Jobs are FIFO: this one would wait for a million tokens had the loop not stopped the first.
  const reply = await session.generate(user('next'), { maxTokens: 4, ignoreEos: true })
  assert.equal(reply.tokens.length, 4)
  assert.ok(performance.now() - t0 < 30_000)

  // throw out of the loop, too
  await assert.rejects(
    (async () => { for await (const _ of session.stream(user('endless'), { maxTokens: 1_000_000, ignoreEos: true })) throw new Error('out') })(),
    /out/,
  )
  const again = await session.generate(user('next'), { maxTokens: 2, ignoreEos: true })
  assert.equal(again.tokens.length, 2)
})

test('bad arguments reject with INVALID_ARGUMENT', async () => {
  const g = (m, o) => () => session.generate(m, o)
  const cases = [
    [g('hello'), /messages must be an array/],
    [g([]), /empty/],
    [g([null]), /must be an object/],
    [g([{ content: 'no role' }]), /role/],
    [g([{ role: 'wizard', content: 'x' }]), /unknown message role "wizard"/],
    [g([{ role: 'user', content: 42 }])],
    [g(user('x'), 'not an object'), /options must be an object/],
    [g(user('x'), { maxTokens: NaN }), /maxTokens must be a finite number/],
    [g(user('x'), { maxTokens: -1 }), /maxTokens must be a non-negative integer/],
    [g(user('x'), { maxTokens: 1.5 }), /maxTokens/],
    [g(user('x'), { maxTokens: '10' }), /maxTokens|expected/],
    [g(user('x'), { temperature: -1 }), /temperature/],
    [g(user('x'), { temperature: Infinity }), /temperature/],
    [g(user('x'), { topP: 0 }), /topP/],
    [g(user('x'), { seed: -3 }), /seed/],
    [g(user('x'), { stop: 'x' }), /options/],
    [g(user('x'), { signal: {} }), /signal must be an AbortSignal/],
    [g(user('x'), { onToken: 3 }), /onToken must be a function/],
    [g(user('x'), { maxTokens: 10n }), /bigint/],
    [() => Session.load(42), /model must be a non-empty string/],
    [() => Session.load(modelDir(), { device: 'tpu' }), /device/],
    [() => Session.load(modelDir(), { promptCache: { maxEntries: -1 } }), /promptCache.maxEntries/],
  ]
  for (const [fn, re] of cases) await rejectsWithCode(assert, fn, 'INVALID_ARGUMENT', re)
  await rejectsWithCode(assert, async () => { for await (const _ of session.stream([{ role: 'nobody', content: '' }])) {} }, 'INVALID_ARGUMENT', /role/)
  assert.throws(() => session.tokenize(5), (e) => e.code === 'INVALID_ARGUMENT')
  assert.throws(() => session.detokenize([1, -1]), (e) => e.code === 'INVALID_ARGUMENT')
  assert.throws(() => session.detokenize([100000]), (e) => e.code === 'INVALID_ARGUMENT')
  assert.throws(() => session.applyChatTemplate([{ role: 'robot', content: 'x' }]), (e) => e.code === 'INVALID_ARGUMENT')
})

test('loading a missing or broken model rejects with its code', async () => {
  await rejectsWithCode(assert, () => Session.load(join(tmpdir(), 'mlex-no-such-model-dir')), 'MODEL_NOT_FOUND')
  const broken = mkdtempSync(join(tmpdir(), 'mlex-broken-'))
  writeFileSync(join(broken, 'config.json'), '{ "model_type": "llama", ')
  await rejectsWithCode(assert, () => Session.load(broken), 'INVALID_CHECKPOINT')
  const noWeights = join(mkdtempSync(join(tmpdir(), 'mlex-noweights-')), 'm')
  mkdirSync(noWeights)
  writeFileSync(join(noWeights, 'config.json'), JSON.stringify({ model_type: 'llama', hidden_size: 8, num_hidden_layers: 1, intermediate_size: 8, num_attention_heads: 1, vocab_size: 4, rms_norm_eps: 1e-5 }))
  await rejectsWithCode(assert, () => Session.load(noWeights), 'INVALID_CHECKPOINT')
})

test('tokenize, detokenize and applyChatTemplate', () => {
  const ids = session.tokenize('Hello, world')
  assert.equal(ids.length, 'Hello, world'.length) // byte-level, no merges: one token per byte
  assert.equal(session.detokenize(ids), 'Hello, world')
  assert.deepEqual(session.tokenize('<|im_start|>'), [256])
  assert.deepEqual(session.tokenize('hi', { addSpecialTokens: true }).length, 2)
  const prompt = session.applyChatTemplate([{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }])
  assert.equal(prompt, '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n')
  const noGen = session.applyChatTemplate(user('Hi'), { addGenerationPrompt: false })
  assert.equal(noGen, '<|im_start|>user\nHi<|im_end|>\n')
  const parts = session.applyChatTemplate([{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }], { addGenerationPrompt: false })
  assert.equal(parts, '<|im_start|>user\nab<|im_end|>\n')
  const withTool = session.applyChatTemplate([
    { role: 'user', content: 'weather?' },
    { role: 'assistant', content: '', toolCalls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', toolCallId: 'c1', content: 'sunny' },
  ])
  assert.match(withTool, /<\|im_start\|>tool\nsunny<\|im_end\|>/)
})

test('after close every call rejects with SESSION_CLOSED', async () => {
  const s = await Session.load(modelDir())
  const running = s.generate(user('long'), { maxTokens: 1_000_000, ignoreEos: true })
  await new Promise((r) => setTimeout(r, 50))
  await s.close()
  assert.equal(s.closed, true)
  const r = await running
  assert.equal(r.finishReason, 'abort')
  await rejectsWithCode(assert, () => s.generate(user('x')), 'SESSION_CLOSED')
  await rejectsWithCode(assert, async () => { for await (const _ of s.stream(user('x'))) {} }, 'SESSION_CLOSED')
  assert.throws(() => s.tokenize('x'), (e) => e.code === 'SESSION_CLOSED')
  assert.throws(() => s.applyChatTemplate(user('x')), (e) => e.code === 'SESSION_CLOSED')
  await s.close() // idempotent
  const t = await Session.load(modelDir())
  await t[Symbol.asyncDispose]()
  assert.equal(t.closed, true)
})

test('the options index.d.ts declares for generate are the core schema\'s, and unknown ones are refused', async () => {
  const { createRequire } = await import('node:module')
  const { readFileSync } = await import('node:fs')
  const native = createRequire(import.meta.url)('../index.js')
  const dts = readFileSync(new URL('../index.d.ts', import.meta.url), 'utf8')
  const body = dts.match(/export interface GenerateOptions \{([\s\S]*?)\n\}/)[1]
  const declared = [...body.matchAll(/^\s+(\w+)\??:/gm)].map((m) => m[1]).filter((k) => k !== 'signal' && k !== 'onToken')
  assert.deepEqual(declared.sort(), native.generateOptionNames().sort())
  await rejectsWithCode(assert, () => session.generate(user('x'), { maxToken: 3 }), 'INVALID_ARGUMENT', /unknown option "maxToken"/)
  const r = await session.generate(user('x'), { maxTokens: 3, ignoreEos: true, prefillStepSize: 2 })
  assert.equal(r.tokens.length, 3)
})
