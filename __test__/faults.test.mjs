// Faults (issue 16 item 2): a request past the session's memory budget, an abort storm on one
// session, the process ending (process.exit(), SIGINT, SIGTERM) in the middle of a generation, and
// the addon in worker_threads. The exit cases run MLEX_EXIT_REPEATS times each (default 10; the
// long version: MLEX_EXIT_REPEATS=50 node --test __test__/faults.test.mjs).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { Session } from 'mlex'
import { modelDir, user } from './helpers.mjs'
import { rng } from './fixtures.mjs'

const root = new URL('..', import.meta.url).pathname
const REPEATS = Number(process.env.MLEX_EXIT_REPEATS || 10)
const greedy = { temperature: 0, ignoreEos: true }

test('a request past the session memory budget fails with OUT_OF_MEMORY and the session keeps serving', async () => {
  // The tiny model's KV cache takes 512 bytes a token: 64 KiB hold 128 tokens.
  const s = await Session.load(modelDir(), { kvBudgetBytes: 64 * 1024 })
  try {
    const before = await s.generate(user('hi'), { ...greedy, maxTokens: 8 })
    for (let i = 0; i < 3; i++) {
      await assert.rejects(s.generate(user('hi'), { ...greedy, maxTokens: 100_000 }), (e) => {
        assert.equal(e.code, 'OUT_OF_MEMORY', e.message)
        assert.match(e.message, /kv_budget_bytes/)
        assert.match(e.message, /prompt tokens \+ max_tokens \d+/)
        return true
      })
      // Streaming: the same error from the iterator, and the session goes on.
      await assert.rejects(async () => {
        for await (const _ of s.stream(user('hi'), { ...greedy, maxTokens: 100_000 })) { /* none */ }
      }, (e) => e.code === 'OUT_OF_MEMORY')
      const after = await s.generate(user('hi'), { ...greedy, maxTokens: 8 })
      assert.deepEqual(after.tokens, before.tokens)
    }
    // Requests that fit run side by side with one that cannot.
    const mixed = await Promise.allSettled([
      s.generate(user('a'), { ...greedy, maxTokens: 16 }),
      s.generate(user('b'), { ...greedy, maxTokens: 100_000 }),
      s.generate(user('c'), { ...greedy, maxTokens: 16 }),
    ])
    assert.deepEqual(mixed.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled'])
    assert.equal(mixed[1].reason.code, 'OUT_OF_MEMORY')
  } finally {
    await s.close()
  }
})

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

test('an abort storm across concurrent requests leaves no stuck request and no crash', { timeout: 120_000 }, async () => {
  const s = await Session.load(modelDir())
  try {
    const reference = await s.generate(user('storm'), { ...greedy, maxTokens: 12 })
    const rand = rng(16)
    const N = 300
    const outcomes = { abort: 0, aborted: 0, length: 0, broke: 0 }
    let next = 0
    async function one() {
      const i = next++
      const ac = new AbortController()
      const maxTokens = 1 + Math.floor(rand() * 64)
      const stream = rand() < 0.5
      const abortAt = rand() * 15
      // Aborts land before the start, in the queue, during prefill and during decoding.
      const timer = abortAt < 1 ? (ac.abort(), null) : setTimeout(() => ac.abort(), abortAt)
      try {
        if (stream) {
          const breakAt = Math.floor(rand() * 8)
          let n = 0
          for await (const _ of s.stream(user(`storm ${i}`), { ...greedy, maxTokens, signal: ac.signal })) {
            if (++n === breakAt) {
              outcomes.broke++
              return
            }
          }
          outcomes.length++
        } else {
          const r = await s.generate(user(`storm ${i}`), { ...greedy, maxTokens, signal: ac.signal })
          assert.ok(['abort', 'length'].includes(r.finishReason), r.finishReason)
          outcomes[r.finishReason]++
        }
      } catch (e) {
        assert.equal(e.code, 'ABORTED', `request ${i}: ${e.message}`)
        outcomes.aborted++
      } finally {
        if (timer) clearTimeout(timer)
      }
    }
    // 16 requests in flight at a time until N have run.
    const workers = Array.from({ length: 16 }, async () => {
      while (next < N) await one()
    })
    const all = Promise.all(workers)
    const stuck = sleep(90_000).then(() => { throw new Error(`stuck: ${next} of ${N} started, outcomes ${JSON.stringify(outcomes)}`) })
    await Promise.race([all, stuck])
    const total = Object.values(outcomes).reduce((a, b) => a + b, 0)
    assert.equal(total, N, JSON.stringify(outcomes))
    assert.ok(outcomes.abort + outcomes.aborted > N / 4, `few aborts landed: ${JSON.stringify(outcomes)}`)
    // Still serving, and the same greedy reply as before the storm.
    const after = await s.generate(user('storm'), { ...greedy, maxTokens: 12 })
    assert.deepEqual(after.tokens, reference.tokens)
  } finally {
    await s.close()
  }
})

/** Runs `code` (an ES module) in a child; `onStdout(line, child)` sees each line. */
function child(code, onStdout = () => {}) {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, ['--input-type=module', '-e', code], {
      cwd: root,
      env: { ...process.env, MODEL: modelDir() },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    const timer = setTimeout(() => p.kill('SIGKILL'), 60_000)
    p.stdout.on('data', (d) => {
      stdout += d
      for (const line of String(d).split('\n')) if (line) onStdout(line, p)
    })
    p.stderr.on('data', (d) => { stderr += d })
    p.on('close', (status, signal) => {
      clearTimeout(timer)
      resolve({ status, signal, stdout, stderr })
    })
  })
}

// Two sessions, two generations in flight on one of them; the parent acts once tokens flow.
const generating = (onSignal, how) => `
  import { Session } from 'mlex'
  const EXIT = ${how === 'exit'}
  ${onSignal}
  const a = await Session.load(process.env.MODEL)
  const b = await Session.load(process.env.MODEL)
  const long = { maxTokens: 1000000, ignoreEos: true }
  b.generate([{ role: 'user', content: 'other' }], long).catch(() => {})
  let n = 0
  for await (const t of a.stream([{ role: 'user', content: 'hi' }], long)) {
    if (++n === 5) console.log('generating')
    if (n === 5 && EXIT) process.exit(0)
  }
`

/** A crash: a fatal signal other than the one sent, a non-zero status, or a native complaint. */
function assertClean(r, expected, what) {
  const detail = `${what}: status ${r.status} signal ${r.signal}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`
  assert.match(r.stdout, /generating/, detail)
  if (expected.signal) assert.equal(r.signal, expected.signal, detail)
  else {
    assert.equal(r.signal, null, detail)
    assert.equal(r.status, expected.status, detail)
  }
  assert.doesNotMatch(r.stderr, /panick|Segmentation|Aborted|terminate called|libc\+\+abi|core dumped|FATAL/i, detail)
}

const exitCases = [
  ['process.exit() during generation', '', 'exit', null, { status: 0 }],
  ['SIGINT (default action) during generation', '', 'signal', 'SIGINT', { signal: 'SIGINT' }],
  ['SIGTERM (default action) during generation', '', 'signal', 'SIGTERM', { signal: 'SIGTERM' }],
  ['SIGINT handled with process.exit(0)', "process.on('SIGINT', () => process.exit(0))", 'signal', 'SIGINT', { status: 0 }],
  ['SIGTERM handled with process.exit(3)', "process.on('SIGTERM', () => process.exit(3))", 'signal', 'SIGTERM', { status: 3 }],
]

for (const [name, handler, how, sig, expected] of exitCases) {
  test(`${name} ends the process cleanly (${REPEATS}×)`, { timeout: 300_000 }, async () => {
    // Two children at a time (CI has two cores).
    let i = 0
    const run = async () => {
      while (i < REPEATS) {
        const k = i++
        const r = await child(generating(handler, how), (line, p) => {
          if (line === 'generating' && sig) setTimeout(() => p.kill(sig), Math.floor(Math.random() * 20))
        })
        assertClean(r, expected, `${name} #${k}`)
      }
    }
    await Promise.all([run(), run()])
  })
}

test('the addon loads and generates in several worker_threads at once and unloads with them', { skip: process.platform !== 'linux' && 'reads /proc' }, async () => {
  const r = await child(`
    import { Worker } from 'node:worker_threads'
    import { readdirSync, readFileSync } from 'node:fs'
    const tasks = () => readdirSync('/proc/self/task').length
    const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
    // Worker k closes its session when k is even, and leaves it to the worker's teardown when odd.
    const code = \`
      const { parentPort, workerData } = require('node:worker_threads')
      const { Session } = require(workerData.root + 'wrapper.js')
      ;(async () => {
        const s = await Session.load(workerData.model)
        const r = await s.generate([{ role: 'user', content: 'hi' }], { maxTokens: 6, temperature: 0, ignoreEos: true })
        if (workerData.k % 2 === 0) await s.close()
        parentPort.postMessage(r.tokens)
      })().catch((e) => { parentPort.postMessage('error ' + e.code + ' ' + e.message) })
    \`
    const run = (k) => new Promise((resolve, reject) => {
      const w = new Worker(code, { eval: true, execArgv: [], workerData: { root: process.cwd() + '/', model: process.env.MODEL, k } })
      let out
      w.on('message', (m) => { out = m })
      w.on('error', reject)
      w.on('exit', (c) => c === 0 ? resolve(out) : reject(new Error('worker exit ' + c)))
    })
    // Threads once the first round has come and gone (its workers' sessions released), then
    // after three more rounds. Before engine threads were pooled (src/mlx/threads.rs) each
    // session left an MLX stream thread behind: 12 more here. The pool may keep a few idle
    // threads more (a session released while the next round loads), never one per session.
    const settled = async (want) => {
      let n = tasks()
      for (let i = 0; i < 200 && (want === undefined ? i < 20 : n > want); i++) { await sleep(25); n = tasks() }
      return n
    }
    let first
    for (let round = 0; round < 4; round++) {
      const outs = await Promise.all([0, 1, 2, 3].map(run))
      for (const o of outs) if (!Array.isArray(o) || o.length !== 6) throw new Error('worker said ' + o)
      if (new Set(outs.map(String)).size !== 1) throw new Error('workers disagree ' + JSON.stringify(outs))
      if (round === 0) first = await settled()
    }
    const last = await settled(first)
    console.log('generating')
    console.log('threads after the first round', first, 'after the last', last, 'left behind', last - first)
  `)
  assertClean(r, { status: 0 }, 'workers')
  const left = Number(/left behind (-?\d+)/.exec(r.stdout)[1])
  assert.ok(left <= 4, r.stdout + r.stderr)
})
