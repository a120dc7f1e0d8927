// `mlex serve` against the official `openai` client (no mocks): the CLI binary the Rust tests
// built serves the tiny model; whole and streamed chat completions, completions, models, JSON
// Schema output, a forced tool call, concurrency, and the errors each in OpenAI's shape.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import OpenAI from 'openai'
import { modelDir } from './helpers.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const host = execFileSync('rustc', ['-vV']).toString().match(/^host: (.+)$/m)[1]
const bin = [join(root, 'target', host, 'debug', 'mlex'), join(root, 'target', host, 'release', 'mlex')].find(existsSync)
const KEY = 'test-key'

let server
let base
let client
before(async () => {
  assert.ok(bin, `the mlex binary (cargo build --target ${host}) is needed`)
  server = spawn(bin, ['serve', '--model', `tiny=${modelDir()}`, '--port', '0', '--api-key', KEY, '--max-body-bytes', '65536'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  base = await new Promise((resolve, reject) => {
    let out = ''
    server.stdout.on('data', (d) => {
      out += d
      const m = out.match(/listening on (http:\/\/\S+)/)
      if (m) resolve(m[1])
    })
    server.on('exit', (code) => reject(new Error(`mlex serve exited with ${code}`)))
  })
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 })
})
after(async () => {
  if (!server) return
  const exited = new Promise((resolve) => server.on('exit', resolve))
  server.kill('SIGTERM')
  assert.equal(await exited, 0, 'SIGTERM ends the server cleanly')
})

const msgs = [{ role: 'user', content: 'Say something.' }]

test('models and health', async () => {
  const models = await client.models.list()
  assert.deepEqual(models.data.map((m) => m.id), ['tiny'])
  const health = await (await fetch(`${base}/health`)).json()
  assert.equal(health.status, 'ok')
})

test('a chat completion, whole and streamed, with the same greedy tokens', async () => {
  const whole = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 12, temperature: 0 })
  assert.equal(whole.object, 'chat.completion')
  assert.equal(whole.choices[0].message.role, 'assistant')
  assert.equal(typeof whole.choices[0].message.content, 'string')
  assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason))
  assert.ok(whole.usage.prompt_tokens > 0 && whole.usage.completion_tokens > 0)

  const stream = await client.chat.completions.create({
    model: 'tiny', messages: msgs, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
  })
  let text = ''
  let finish = null
  let usage = null
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage
    for (const c of chunk.choices) {
      text += c.delta?.content ?? ''
      finish = c.finish_reason ?? finish
    }
  }
  assert.equal(text, whole.choices[0].message.content)
  assert.equal(finish, whole.choices[0].finish_reason)
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens)
})

test('legacy completions with a raw prompt, and logprobs', async () => {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 8 })
  assert.equal(r.object, 'text_completion')
  assert.equal(typeof r.choices[0].text, 'string')
  const c = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 5, logprobs: true })
  assert.equal(c.choices[0].logprobs.content.length, c.usage.completion_tokens)
  assert.ok(c.choices[0].logprobs.content.every((t) => t.logprob <= 0))
})

test('response_format json_schema and a tool call forced by tool_choice', async () => {
  const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['n'], additionalProperties: false }
  const r = await client.chat.completions.create({
    model: 'tiny', messages: msgs, max_tokens: 40,
    response_format: { type: 'json_schema', json_schema: { name: 'digit', strict: true, schema } },
  })
  const v = JSON.parse(r.choices[0].message.content)
  assert.ok(Number.isInteger(v.n) && v.n >= 0 && v.n <= 9, r.choices[0].message.content)

  const tools = [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: { q: { type: 'string', maxLength: 6 } }, required: ['q'], additionalProperties: false } } }]
  const t = await client.chat.completions.create({
    model: 'tiny', messages: msgs, max_tokens: 200, tools, tool_choice: { type: 'function', function: { name: 'lookup' } },
  })
  assert.equal(t.choices[0].finish_reason, 'tool_calls')
  const call = t.choices[0].message.tool_calls[0]
  assert.equal(call.function.name, 'lookup')
  assert.equal(typeof JSON.parse(call.function.arguments).q, 'string')
})

test('eight clients at once are all served (batched)', async () => {
  const replies = await Promise.all(
    Array.from({ length: 8 }, (_, i) => client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: `Request ${i}` }], max_tokens: 10 })),
  )
  assert.equal(replies.length, 8)
  assert.ok(replies.every((r) => r.usage.completion_tokens > 0))
})

test('errors come in OpenAI shape and the server keeps serving', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'nope', messages: msgs }), (e) => e.status === 404 && e.code === 'model_not_found')
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: msgs, temperature: -1 }), (e) => e.status === 400 && /temperature/.test(e.message))
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: msgs, n: 2 }), (e) => e.status === 400 && e.param === 'n')
  const wrongKey = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 })
  await assert.rejects(wrongKey.models.list(), (e) => e.status === 401)
  const raw = async (body, headers = {}) => {
    const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json', ...headers }, body })
    return { status: r.status, body: await r.json() }
  }
  for (const [body, status] of [['{not json', 400], ['[1, 2]', 400], [Buffer.from([0x7b, 0xff, 0xfe, 0x7d]), 400], ['x'.repeat(70000), 413], [JSON.stringify({ model: 'tiny' }), 400]]) {
    const r = await raw(body)
    assert.equal(r.status, status, JSON.stringify(r.body))
    assert.equal(typeof r.body.error.message, 'string')
  }
  // A client that disconnects mid-stream (leaving the loop closes the stream): its request is
  // dropped at the next step, others go on.
  const s = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 100000, stream: true })
  let n = 0
  for await (const _ of s) if (++n === 3) break
  const after = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 4 })
  assert.ok(after.usage.completion_tokens > 0)
})
