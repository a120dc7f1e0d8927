// Process exit with sessions open, and garbage collection of sessions, in child processes.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { modelDir } from './helpers.mjs'

const root = new URL('..', import.meta.url).pathname

function runChild(code, args = []) {
  const t0 = performance.now()
  const r = spawnSync(process.execPath, [...args, '--input-type=module', '-e', code], {
    cwd: root,
    env: { ...process.env, MODEL: modelDir() },
    encoding: 'utf8',
    timeout: 60_000,
  })
  return { ...r, ms: performance.now() - t0 }
}

test('the process exits promptly, without a crash, with sessions still open', () => {
  const r = runChild(`
    import { Session } from 'mlex'
    const a = await Session.load(process.env.MODEL)
    const b = await Session.load(process.env.MODEL)
    const reply = await a.generate([{ role: 'user', content: 'hi' }], { maxTokens: 4, ignoreEos: true })
    console.log('ok', reply.tokens.length)
  `)
  assert.equal(r.signal, null, r.stderr)
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stdout, /ok 4/)
  assert.ok(r.ms < 15_000, `took ${r.ms} ms`)
})

test('process.exit() in the middle of a generation does not crash', () => {
  const r = runChild(`
    import { Session } from 'mlex'
    const s = await Session.load(process.env.MODEL)
    let n = 0
    for await (const t of s.stream([{ role: 'user', content: 'hi' }], { maxTokens: 1000000, ignoreEos: true })) {
      if (++n === 20) { console.log('exiting'); process.exit(0) }
    }
  `)
  assert.equal(r.signal, null, r.stderr)
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stdout, /exiting/)
})

test('an unfinished stream does not keep the process alive once dropped', () => {
  const r = runChild(`
    import { Session } from 'mlex'
    const s = await Session.load(process.env.MODEL)
    const it = s.stream([{ role: 'user', content: 'hi' }], { maxTokens: 1000000, ignoreEos: true })
    await it.next()
    await it.return()
    console.log('left')
  `)
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stdout, /left/)
  assert.ok(r.ms < 15_000, `took ${r.ms} ms`)
})

test('a garbage-collected session releases its memory, and its engine thread goes back to the pool', { skip: process.platform !== 'linux' && 'reads /proc' }, () => {
  const r = runChild(`
    import { Session, memoryStats } from 'mlex'
    import { readdirSync } from 'node:fs'
    const threads = () => readdirSync('/proc/self/task').length
    const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
    const before = memoryStats().activeBytes
    // Engine threads are pooled (src/mlx/threads.rs): a collected session's job ends and its
    // thread waits for the next session, so MLX's memory is what shows the drop.
    {
      let s = await Session.load(process.env.MODEL)
      await s.generate([{ role: 'user', content: 'hi' }], { maxTokens: 2, ignoreEos: true })
      let t = await Session.load(process.env.MODEL)
      await t.generate([{ role: 'user', content: 'hi' }], { maxTokens: 2, ignoreEos: true })
      s = null; t = null
    }
    const loaded = memoryStats().activeBytes
    const pooled = threads()
    let now = loaded
    for (let i = 0; i < 100 && now > before; i++) {
      globalThis.gc()
      await sleep(20)
      now = memoryStats().activeBytes
    }
    // Two more sessions reuse the pooled threads.
    for (let i = 0; i < 2; i++) {
      const u = await Session.load(process.env.MODEL)
      await u.generate([{ role: 'user', content: 'hi' }], { maxTokens: 2, ignoreEos: true })
      await u.close()
    }
    await sleep(200)
    console.log('held', loaded > before, 'freed', now <= before, 'new threads', threads() - pooled)
  `, ['--expose-gc'])
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stdout, /held true freed true new threads 0/)
})

test('CommonJS require works too', () => {
  const r = spawnSync(process.execPath, ['-e', `
    const { Session } = require('mlex')
    Session.load(process.env.MODEL).then(async (s) => {
      const reply = await s.generate([{ role: 'user', content: 'hi' }], { maxTokens: 3, ignoreEos: true })
      console.log('cjs', reply.tokens.length, typeof require('mlex').ERROR_CODES)
      await s.close()
    })
  `], { cwd: root, env: { ...process.env, MODEL: modelDir() }, encoding: 'utf8', timeout: 60_000 })
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stdout, /cjs 3 object/)
})
