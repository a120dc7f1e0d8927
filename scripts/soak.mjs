#!/usr/bin/env node
// Soak (issue 16 item 1): many generations through Node on one session (random lengths, random
// aborts, streaming or not, some with tools, several in flight), then load/close cycles of
// sessions; reports RSS and MLX's active memory (memoryStats(), read with the session idle and its
// prompt-cache pool expired) once a fifth of the generations have run and at the end, and the
// threads left behind by closed sessions. __test__/soak.test.mjs runs a short version of it in CI.
//
//   node scripts/soak.mjs [--generations 1000] [--cycles 200] [--minutes M] [--model DIR]
//
// --minutes repeats the generation phase until that much time has passed. Without --model the
// tiny random checkpoint of the Node tests is written to a temporary directory. The exit and
// signal cases of __test__/faults.test.mjs, 50 times each: MLEX_EXIT_REPEATS=50 node --test
// __test__/faults.test.mjs.
import { readdirSync, readFileSync } from 'node:fs'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { Session, memoryStats } from 'mlex'
import { rng, tinyModelDir } from '../__test__/fixtures.mjs'

setFlagsFromString('--expose-gc')
const gc = runInNewContext('gc')

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
export const threads = () => readdirSync('/proc/self/task').length
/** Names of this process's threads, counted. */
export function threadNames() {
  const m = {}
  for (const t of readdirSync('/proc/self/task')) {
    let n = '?'
    try {
      n = readFileSync(`/proc/self/task/${t}/comm`, 'utf8').trim()
    } catch {}
    m[n] = (m[n] || 0) + 1
  }
  return m
}
/** Resident set size in bytes (from /proc: process.memoryUsage().rss includes nothing else). */
export function rss() {
  const pages = Number(readFileSync('/proc/self/statm', 'utf8').split(' ')[1])
  return pages * 4096
}

async function settle() {
  for (let i = 0; i < 3; i++) {
    gc()
    await sleep(50)
  }
}

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
]

/**
 * One generation of the mix: a random length, streamed or not, with tools one time in four, and
 * aborted (by signal or by leaving the stream) one time in five. Returns its outcome.
 */
async function one(s, rand, i) {
  const maxTokens = 1 + Math.floor(rand() * 48)
  const options = { maxTokens, temperature: rand() < 0.5 ? 0 : 0.8, seed: i, ignoreEos: rand() < 0.5 }
  if (rand() < 0.25) options.tools = TOOLS
  const messages = [{ role: 'user', content: `soak ${i} ${'x'.repeat(Math.floor(rand() * 200))}` }]
  const abort = rand() < 0.2
  let timer
  if (abort) {
    const ac = new AbortController()
    options.signal = ac.signal
    timer = setTimeout(() => ac.abort(), rand() * 20)
  }
  try {
    if (rand() < 0.5) {
      let n = 0
      const breakAt = abort && rand() < 0.5 ? 1 + Math.floor(rand() * 4) : Infinity
      for await (const _ of s.stream(messages, options)) if (++n >= breakAt) return 'break'
      return 'stream'
    }
    const r = await s.generate(messages, options)
    return r.finishReason
  } catch (e) {
    if (e.code !== 'ABORTED') throw e
    return 'aborted'
  } finally {
    clearTimeout(timer)
  }
}

/** Pooled prompt caches last this long unused (short, so that the pool can be seen empty). */
const TTL_MS = 1500

/**
 * MLX's active memory once the session is idle and its prompt-cache pool has expired: what the
 * session holds beyond that (weights) is what it leaked.
 */
async function idleActive() {
  await sleep(TTL_MS + 300)
  return memoryStats().activeBytes
}

/**
 * Runs the soak on `model`; returns its figures. `generations` after a warm-up of a tenth of
 * them; `concurrency` requests in flight at a time; then `cycles` load/close cycles.
 */
export async function runSoak({ model, generations = 1000, cycles = 200, concurrency = 4, minutes = 0, seed = 1 }) {
  const rand = rng(seed)
  const t0 = performance.now()
  const outcomes = {}
  const s = await Session.load(model, { promptCache: { ttlMs: TTL_MS } })
  const loaded = await idleActive()
  const mix = async (n) => {
    let next = 0
    await Promise.all(Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const k = next++
        const o = await one(s, rand, k)
        outcomes[o] = (outcomes[o] || 0) + 1
      }
    }))
  }
  // Warm-up: MLX's buffer cache, the prompt cache and V8 reach their working size.
  await mix(Math.max(400, Math.floor(generations / 4)))
  await settle()
  const warm = { rss: 0, mlxActive: 0, threads: threads() }
  let done = 0
  const deadline = t0 + minutes * 60_000
  // RSS and MLX memory after every tenth of the generations.
  const samples = []
  const chunk = Math.max(1, Math.floor(generations / 10))
  do {
    for (let k = 0; k < generations; k += chunk) {
      await mix(Math.min(chunk, generations - k))
      done += Math.min(chunk, generations - k)
      await settle()
      samples.push({ generations: done, rss: rss(), heap: process.memoryUsage().heapUsed })
      if (samples.length === 2) warm.mlxActive = await idleActive()
    }
  } while (minutes > 0 && performance.now() < deadline)
  const after = { rss: rss(), mlxActive: await idleActive(), threads: threads(), stats: memoryStats() }
  // The baseline: once a fifth of the generations have run (RSS climbs for the first hundred
  // or so: V8's code and heap, malloc's arenas, MLX's buffer cache and the prompt cache filling).
  // Medians of three samples, against the noise of V8's and malloc's own ups and downs.
  const median = (xs) => xs.map((x) => x.rss).sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]
  const at = Math.min(Math.floor(samples.length / 5), Math.max(0, samples.length - 3))
  warm.rss = median(samples.slice(at, at + 3))
  after.rss = median(samples.slice(-3))
  if (!warm.mlxActive) warm.mlxActive = await idleActive()
  const stillServes = (await s.generate([{ role: 'user', content: 'hi' }], { maxTokens: 3, ignoreEos: true })).tokens.length === 3
  await s.close()
  const generationMs = performance.now() - t0

  // Load/close cycles: warm up with a few, then measure.
  const cycle = async () => {
    const c = await Session.load(model)
    await c.generate([{ role: 'user', content: 'cycle' }], { maxTokens: 4, ignoreEos: true })
    await c.close()
  }
  const warmCycles = Math.min(5, cycles)
  for (let i = 0; i < warmCycles; i++) await cycle()
  await settle()
  const cyclesWarm = { rss: rss(), threads: threads(), names: threadNames() }
  for (let i = warmCycles; i < cycles; i++) await cycle()
  // A closed session's engine job ends on a helper thread: give the releases a moment.
  for (let i = 0; i < 200 && threads() > cyclesWarm.threads; i++) await sleep(25)
  await settle()
  const cyclesAfter = { rss: rss(), threads: threads(), names: threadNames() }
  const drift = (a, b) => (b - a) / a
  return {
    generations: done,
    outcomes,
    stillServes,
    generationSeconds: +(generationMs / 1000).toFixed(1),
    warm,
    after,
    mlxActiveLoaded: loaded,
    samples: samples.map((x) => `${x.generations}: RSS ${(x.rss / 2 ** 20).toFixed(1)} MiB, JS heap ${(x.heap / 2 ** 20).toFixed(1)} MiB`),
    rssDrift: drift(warm.rss, after.rss),
    mlxActiveDrift: drift(warm.mlxActive, after.mlxActive),
    threadsLeftByGenerations: after.threads - warm.threads,
    cycles,
    cyclesWarm,
    cyclesAfter,
    cycleRssDrift: drift(cyclesWarm.rss, cyclesAfter.rss),
    threadsLeftByCycles: cyclesAfter.threads - cyclesWarm.threads,
    totalSeconds: +((performance.now() - t0) / 1000).toFixed(1),
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const arg = (name, d) => {
    const i = process.argv.indexOf(`--${name}`)
    return i > 0 ? process.argv[i + 1] : d
  }
  let model = arg('model')
  if (!model) model = tinyModelDir()
  const figures = await runSoak({
    model,
    generations: Number(arg('generations', 1000)),
    cycles: Number(arg('cycles', 200)),
    minutes: Number(arg('minutes', 0)),
  })
  const mb = (b) => `${(b / 2 ** 20).toFixed(1)} MiB`
  console.log(JSON.stringify(figures, null, 2))
  console.log(
    `${figures.generations} generations (${JSON.stringify(figures.outcomes)}) in ${figures.generationSeconds} s: ` +
      `RSS ${mb(figures.warm.rss)} -> ${mb(figures.after.rss)} (${(figures.rssDrift * 100).toFixed(2)} %), ` +
      `MLX active (idle, pool expired) ${mb(figures.warm.mlxActive)} -> ${mb(figures.after.mlxActive)} (${(figures.mlxActiveDrift * 100).toFixed(2)} %); ` +
      `${figures.cycles} load/close cycles: RSS ${mb(figures.cyclesWarm.rss)} -> ${mb(figures.cyclesAfter.rss)} ` +
      `(${(figures.cycleRssDrift * 100).toFixed(2)} %), threads left behind ${figures.threadsLeftByCycles}`,
  )
}
