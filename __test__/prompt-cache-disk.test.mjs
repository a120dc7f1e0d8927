// The prompt cache on disk through the Node API (`promptCache: { dir, diskMaxBytes }`): a second
// session, and a second process, reuse the KV state of a shared system prompt that the first one
// wrote, with the same greedy tokens as a run without the cache. (Its file format, bad files,
// other models and the byte bound are tests/prompt_cache_disk.rs's.)
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readdirSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { tmpdir } from 'node:os'
import { fileURLToPath } from 'node:url'
import { Session } from 'mlex'
import { modelDir, rejectsWithCode } from './helpers.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const SYSTEM = 'You are a careful assistant. '.repeat(12)
const messages = (q) => [{ role: 'system', content: SYSTEM }, { role: 'user', content: q }]
const greedy = { maxTokens: 8, ignoreEos: true }
const entries = (dir) => readdirSync(dir).filter((n) => n.startsWith('pc-') && n.endsWith('.safetensors'))

test('a second session reuses the system prompt a first one left on disk', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'mlex-pc-'))
  const first = await Session.load(modelDir(), { device: 'cpu', promptCache: { dir, diskMaxBytes: 64 << 20 } })
  try {
    const r = await first.generate(messages('Hello!'), greedy)
    assert.equal(r.usage.cachedTokens, 0)
  } finally {
    await first.close()
  }
  // The entry is written in the background (after the reply; close() does not wait for it).
  for (let i = 0; i < 200 && entries(dir).length === 0; i++) await new Promise((r) => setTimeout(r, 50))
  assert.equal(entries(dir).length, 1)

  const second = await Session.load(modelDir(), { device: 'cpu', promptCache: { dir } })
  try {
    const cold = await second.generate(messages('What is new?'), { ...greedy, promptCache: false })
    const warm = await second.generate(messages('What is new?'), greedy)
    assert.ok(warm.usage.cachedTokens > SYSTEM.length, `${warm.usage.cachedTokens} tokens from disk`)
    assert.deepEqual(warm.tokens, cold.tokens)
  } finally {
    await second.close()
  }
})

test('a second process reuses it too', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'mlex-pc-'))
  const code = `
    import { Session } from 'mlex'
    const s = await Session.load(process.env.MODEL, { device: 'cpu', promptCache: { dir: process.env.CACHE } })
    const msgs = [{ role: 'system', content: process.env.SYSTEM }, { role: 'user', content: process.env.Q }]
    const cold = await s.generate(msgs, { maxTokens: 8, ignoreEos: true, promptCache: false })
    const r = await s.generate(msgs, { maxTokens: 8, ignoreEos: true })
    await s.close()
    console.log(JSON.stringify({ cached: r.usage.cachedTokens, same: JSON.stringify(r.tokens) === JSON.stringify(cold.tokens) }))
  `
  const run = (q) => {
    const p = spawnSync(process.execPath, ['--input-type=module', '-e', code], {
      cwd: root,
      env: { ...process.env, MODEL: modelDir(), CACHE: dir, SYSTEM, Q: q },
      encoding: 'utf8',
      timeout: 120_000,
    })
    assert.equal(p.status, 0, p.stderr)
    return JSON.parse(p.stdout.trim().split('\n').pop())
  }
  const a = run('First question?')
  assert.equal(a.cached, 0)
  assert.ok(a.same)
  const b = run('Second question?')
  assert.ok(b.cached > SYSTEM.length, `${b.cached} tokens from disk`)
  assert.ok(b.same, 'greedy tokens equal the run without the cache')
})

test('bad disk options reject naming the option', async () => {
  await rejectsWithCode(assert, () => Session.load(modelDir(), { promptCache: { dir: 3 } }), 'INVALID_ARGUMENT', /promptCache\.dir must be a string/)
  await rejectsWithCode(assert, () => Session.load(modelDir(), { promptCache: { diskMaxBytes: -1 } }), 'INVALID_ARGUMENT', /promptCache\.diskMaxBytes must be a non-negative integer/)
})
