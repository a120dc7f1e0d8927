// Many requests at once, two sessions, and the event loop staying free during generation.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Session } from 'mlex'
import { modelDir, user } from './helpers.mjs'

let session
before(async () => {
  session = await Session.load(modelDir())
})
after(async () => {
  await session?.close()
})

const prompts = ['one', 'two two', 'three three three', 'four', 'five is here', 'six']
const opts = (i) => ({ maxTokens: 24, ignoreEos: true, ...(i % 2 ? { temperature: 0.8, seed: 100 + i } : {}) })

test('concurrent generate and stream calls equal the same calls one by one', async (t) => {
  const sequential = []
  for (const [i, p] of prompts.entries()) sequential.push(await session.generate(user(p), opts(i)))

  const t0 = performance.now()
  const concurrent = await Promise.all(
    prompts.map(async (p, i) => {
      if (i % 3 === 2) {
        const ids = []
        for await (const tok of session.stream(user(p), opts(i))) ids.push(tok.id)
        return { tokens: ids }
      }
      return session.generate(user(p), opts(i))
    }),
  )
  const ms = performance.now() - t0
  for (const [i, r] of concurrent.entries()) assert.deepEqual(r.tokens, sequential[i].tokens, `request ${i}`)
  // The generate() calls were batched with no change to the calling code.
  const sizes = concurrent.filter((r) => r.usage).map((r) => r.usage.batchSize)
  assert.ok(Math.max(...sizes) > 1, `batch sizes ${sizes}`)
  assert.ok(concurrent.filter((r) => r.usage).every((r) => r.usage.batched === true))
  assert.ok(sequential.every((r) => r.usage.batchSize === 1))
  t.diagnostic(`${prompts.length} concurrent requests (4 generate + 2 stream) on one session: all equal to sequential, ${ms.toFixed(0)} ms`)
})

test('maxBatch bounds how many requests decode together', async () => {
  const small = await Session.load(modelDir(), { maxBatch: 2 })
  try {
    const replies = await Promise.all(prompts.map((p) => small.generate(user(p), { maxTokens: 8, ignoreEos: true })))
    assert.ok(replies.every((r) => r.usage.batchSize <= 2), `${replies.map((r) => r.usage.batchSize)}`)
    assert.ok(replies.some((r) => r.usage.batchSize === 2))
  } finally {
    await small.close()
  }
  await assert.rejects(Session.load(modelDir(), { maxBatch: 0 }), (e) => e.code === 'INVALID_ARGUMENT' && /maxBatch/.test(e.message))
})

test('two sessions in one process, generating at the same time', async () => {
  const other = await Session.load(modelDir())
  try {
    const [a, b] = await Promise.all([
      session.generate(user('twin'), { maxTokens: 16, ignoreEos: true }),
      other.generate(user('twin'), { maxTokens: 16, ignoreEos: true }),
    ])
    assert.deepEqual(a.tokens, b.tokens)
    assert.equal(a.text, b.text)
  } finally {
    await other.close()
  }
})

test('the event loop keeps ticking during a long generation', async (t) => {
  let last = performance.now()
  let maxGap = 0
  let ticks = 0
  const timer = setInterval(() => {
    const now = performance.now()
    maxGap = Math.max(maxGap, now - last)
    last = now
    ticks++
  }, 1)
  let streamed = 0
  const t0 = performance.now()
  try {
    const [reply] = await Promise.all([
      session.generate(user('a long story'), { maxTokens: 1500, ignoreEos: true }),
      (async () => { for await (const _ of session.stream(user('and another'), { maxTokens: 500, ignoreEos: true })) streamed++ })(),
    ])
    assert.equal(reply.tokens.length, 1500)
    assert.equal(streamed, 500)
  } finally {
    clearInterval(timer)
  }
  const ms = performance.now() - t0
  t.diagnostic(`2000 tokens in ${ms.toFixed(0)} ms; 1 ms interval ticked ${ticks} times, max gap ${maxGap.toFixed(1)} ms`)
  assert.ok(maxGap < 50, `max event-loop gap ${maxGap.toFixed(1)} ms`)
})
