// Speculative decoding through the Node API on the tiny checkpoint: prompt lookup and a draft
// model keep greedy replies identical to plain decoding and report their drafts in usage.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Session } from 'mlex'
import { modelDir, user, rejectsWithCode } from './helpers.mjs'
import { tinyModelDir } from './fixtures.mjs'

let session
before(async () => {
  session = await Session.load(modelDir(), { device: 'cpu' })
})
after(async () => {
  await session?.close()
})

const text = 'def add(a, b):\n    return a + b\n'
const messages = user(`Repeat this: ${text}${text}`)
const base = { maxTokens: 24, ignoreEos: true }

test('prompt lookup and a draft model give the plain greedy reply, with their drafts in usage', async () => {
  const plain = await session.generate(messages, base)
  assert.equal(plain.usage.draftTokens, 0)
  assert.equal(plain.usage.tokensPerStep, 1)
  const streamed = []
  const lookup = await session.generate(messages, {
    ...base,
    promptLookup: { maxNgram: 2, numDraftTokens: 4 },
    onToken: (t) => void streamed.push(t.id),
  })
  assert.deepEqual(lookup.tokens, plain.tokens)
  assert.equal(lookup.text, plain.text)
  assert.deepEqual(streamed, lookup.tokens)
  lookup.logprobs.forEach((lp, i) => assert.ok(Math.abs(lp - plain.logprobs[i]) < 1e-4))
  assert.ok(lookup.usage.draftTokens > 0)
  assert.equal(lookup.usage.batched, false)
  assert.ok(lookup.usage.acceptanceRate >= 0 && lookup.usage.acceptanceRate <= 1)
  assert.ok(lookup.usage.tokensPerStep >= 1)
  assert.ok(Number.isInteger(lookup.usage.droppedPasses) && lookup.usage.droppedPasses >= 0)
  assert.equal(plain.usage.droppedPasses, 0)

  const draft = await session.generate(messages, { ...base, draftModel: tinyModelDir({ seed: 77 }), numDraftTokens: 2 })
  assert.deepEqual(draft.tokens, plain.tokens)
  assert.ok(draft.usage.draftTokens > 0)
  const own = await session.generate(messages, { ...base, draftModel: modelDir() })
  assert.deepEqual(own.tokens, plain.tokens)
  assert.ok(own.usage.acceptanceRate > 0.9)
})

test('a session loaded with a draft model speculates; bad speculative options reject', async () => {
  const s = await Session.load(modelDir(), { device: 'cpu', draftModel: modelDir() })
  try {
    const r = await s.generate(messages, base)
    assert.deepEqual(r.tokens, (await session.generate(messages, base)).tokens)
    assert.ok(r.usage.draftTokens > 0)
    const off = await s.generate(messages, { ...base, numDraftTokens: 0 })
    assert.equal(off.usage.draftTokens, 0)
  } finally {
    await s.close()
  }
  await rejectsWithCode(assert, () => session.generate(messages, { promptLookup: 3 }), 'INVALID_ARGUMENT', /promptLookup/)
  await rejectsWithCode(assert, () => session.generate(messages, { numDraftTokens: 100 }), 'INVALID_ARGUMENT', /numDraftTokens/)
})
