// `mlex serve` against the official `openai` client (no mocks): the CLI binary the Rust tests
// built serves the tiny model; whole and streamed chat completions, completions, models, JSON
// Schema output, a forced tool call, concurrency, the errors each in OpenAI's shape; and the
// server's own behaviour: /metrics, CORS only with --cors, 429 with Retry-After past
// --max-queue, --request-timeout in each API's shape, 1,000 rapid connect/disconnects.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { connect } from 'node:net'
import OpenAI from 'openai'
import Anthropic from '@anthropic-ai/sdk'
import { startServer, KEY } from './serve-helpers.mjs'

let main
let base
let client
before(async () => {
  main = await startServer(['--max-body-bytes', '65536'])
  base = main.base
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 })
})
after(async () => {
  if (main) await main.stop()
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

test('top_logprobs: chat completions whole and streamed, legacy completions logprobs: N, bad counts', async () => {
  const req = { model: 'tiny', messages: msgs, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3 }
  const whole = await client.chat.completions.create(req)
  const content = whole.choices[0].logprobs.content
  assert.equal(content.length, whole.usage.completion_tokens)
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 3)
    // Greedy: the most likely is the token itself, with its logprob; the rest in order.
    assert.equal(t.top_logprobs[0].token, t.token)
    assert.equal(t.top_logprobs[0].logprob, t.logprob)
    for (let j = 1; j < 3; j++) assert.ok(t.top_logprobs[j].logprob <= t.top_logprobs[j - 1].logprob)
    for (const alt of [t, ...t.top_logprobs]) assert.deepEqual(alt.bytes, [...Buffer.from(alt.token)])
  }
  // Streamed: each chunk carries its tokens' entries, together the whole reply's.
  const streamed = []
  for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
    for (const c of chunk.choices) streamed.push(...(c.logprobs?.content ?? []))
  }
  assert.deepEqual(streamed, content)
  // logprobs: true alone: no alternatives.
  const bare = await client.chat.completions.create({ ...req, top_logprobs: undefined })
  assert.ok(bare.choices[0].logprobs.content.every((t) => t.top_logprobs.length === 0))
  assert.deepEqual(bare.choices[0].logprobs.content.map((t) => t.logprob), content.map((t) => t.logprob))

  // Legacy completions: logprobs: N → tokens, token_logprobs, top_logprobs maps, text_offset.
  const creq = { model: 'tiny', prompt: 'Once upon a time', max_tokens: 6, temperature: 0, logprobs: 2 }
  const c = await client.completions.create(creq)
  const lp = c.choices[0].logprobs
  assert.equal(lp.tokens.length, c.usage.completion_tokens)
  assert.equal(lp.token_logprobs.length, lp.tokens.length)
  assert.equal(lp.text_offset[0], 0)
  lp.top_logprobs.forEach((m, i) => {
    const entries = Object.entries(m)
    assert.ok(entries.length >= 1 && entries.length <= 2)
    assert.equal(m[lp.tokens[i]], lp.token_logprobs[i])
  })
  const parts = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] }
  for await (const chunk of await client.completions.create({ ...creq, stream: true })) {
    const l = chunk.choices[0]?.logprobs
    if (l) for (const k of Object.keys(parts)) parts[k].push(...l[k])
  }
  assert.deepEqual(parts, lp)

  const bad = (body, param) => assert.rejects(body, (e) => e.status === 400 && e.param === param && /logprobs/.test(e.message))
  await bad(client.chat.completions.create({ ...req, top_logprobs: 21 }), 'top_logprobs')
  await bad(client.chat.completions.create({ ...req, logprobs: false }), 'top_logprobs')
  await bad(client.completions.create({ ...creq, logprobs: 21 }), 'logprobs')
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
  // Image parts, as the OpenAI client sends them: read (inline), then refused by this text-only
  // model; a URL is not fetched and a server path is not read.
  const withImage = (url) => client.chat.completions.create({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'text', text: 'what is it?' }, { type: 'image_url', image_url: { url } }] }] })
  await assert.rejects(withImage('data:image/png;base64,iVBORw0KGgo='), (e) => e.status === 400 && /takes no images/.test(e.message))
  await assert.rejects(withImage('https://example.com/a.png'), (e) => e.status === 400 && /remote image URLs are not fetched/.test(e.message))
  await assert.rejects(withImage('/etc/hostname'), (e) => e.status === 400 && /inline here, as data: URLs/.test(e.message))
  // Video parts (frames): inline frames reach the model, which takes no video; frames from a
  // server path are not read; a video file is refused (no video codecs: frames or an animated image).
  const withVideo = (video) => client.chat.completions.create({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'text', text: 'what happens?' }, { type: 'video', video }] }] })
  await assert.rejects(withVideo(['data:image/png;base64,iVBORw0KGgo=']), (e) => e.status === 400 && /holds a video part, and this model takes no video/.test(e.message))
  await assert.rejects(withVideo(['/etc/hostname']), (e) => e.status === 400 && /frame 0: images must be sent inline here/.test(e.message))
  await assert.rejects(withVideo('clip.mp4'), (e) => e.status === 400 && /mlex decodes no video codecs/.test(e.message))
  // Audio parts (OpenAI's input_audio): an inline clip reaches the model, which takes no audio;
  // a server path is not read.
  const withAudio = (part) => client.chat.completions.create({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'text', text: 'what is it?' }, part] }] })
  await assert.rejects(withAudio({ type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } }), (e) => e.status === 400 && /holds an audio part, and this model takes no audio/.test(e.message))
  await assert.rejects(withAudio({ type: 'audio', audio: '/etc/hostname' }), (e) => e.status === 400 && /audio must be sent inline here/.test(e.message))
  const raw = async (body, headers = {}) => {
    const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json', ...headers }, body })
    return { status: r.status, body: await r.json() }
  }
  for (const [body, status] of [
    ['{not json', 400], ['[1, 2]', 400], [Buffer.from([0x7b, 0xff, 0xfe, 0x7d]), 400], ['x'.repeat(70000), 413], [JSON.stringify({ model: 'tiny' }), 400],
    [JSON.stringify({ model: 'tiny', messages: 'hi' }), 400], [JSON.stringify({ model: 'tiny', messages: msgs, max_tokens: 'many' }), 400],
    [JSON.stringify({ model: ['tiny'], messages: msgs }), 400],
    // A schema llguidance rejects.
    [JSON.stringify({ model: 'tiny', messages: msgs, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'no-such-type' } } } } } }), 400],
  ]) {
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

/** The value of a metric line `name{labels}` in Prometheus text (undefined when absent). */
const metric = (text, series) => {
  const line = text.split('\n').find((l) => l.startsWith(series + ' '))
  return line === undefined ? undefined : Number(line.slice(series.length + 1))
}

test('/metrics: Prometheus text with requests, tokens, queue depth and batch size; behind the key', async () => {
  await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 3 })
  const r = await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })
  assert.equal(r.status, 200)
  assert.match(r.headers.get('content-type'), /^text\/plain; version=0\.0\.4/)
  const text = await r.text()
  assert.ok(metric(text, 'mlex_requests_total{route="/v1/chat/completions",status="200"}') >= 1, text)
  assert.ok(metric(text, 'mlex_requests_total{route="/v1/chat/completions",status="404"}') >= 1)
  assert.ok(metric(text, 'mlex_generated_tokens_total{model="tiny"}') >= 3)
  assert.ok(metric(text, 'mlex_prompt_tokens_total{model="tiny"}') > 0)
  assert.equal(metric(text, 'mlex_requests_in_flight{model="tiny"}'), 0)
  assert.equal(metric(text, 'mlex_requests_queued{model="tiny"}'), 0)
  assert.ok(metric(text, 'mlex_batch_size_last{model="tiny"}') >= 1)
  assert.ok(metric(text, 'mlex_batch_size_average{model="tiny"}') >= 1)
  assert.ok(metric(text, 'mlex_generation_duration_seconds_count{model="tiny"}') >= 1)
  assert.ok(text.split('\n').every((l) => l === '' || l.startsWith('# HELP ') || l.startsWith('# TYPE ') || /^mlex_\w+(\{[^}]*\})? \S+$/.test(l)), 'every line parses')
  assert.equal((await fetch(`${base}/metrics`)).status, 401)
  assert.equal((await fetch(`${base}/health`)).status, 200)
})

test('CORS: no headers without --cors; with it, preflights answered and allowed origins echoed', async () => {
  const origin = 'http://app.example'
  const plain = await fetch(`${base}/v1/models`, { headers: { origin, authorization: `Bearer ${KEY}` } })
  assert.equal(plain.status, 200)
  assert.equal(plain.headers.get('access-control-allow-origin'), null)
  const plainPre = await fetch(`${base}/v1/chat/completions`, { method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST' } })
  assert.equal(plainPre.headers.get('access-control-allow-origin'), null)

  const s = await startServer(['--cors', `${origin},http://other.example`])
  try {
    const pre = await fetch(`${s.base}/v1/messages`, {
      method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'x-api-key, anthropic-version, content-type' },
    })
    assert.equal(pre.status, 204)
    assert.equal(pre.headers.get('access-control-allow-origin'), origin)
    assert.match(pre.headers.get('access-control-allow-methods'), /POST/)
    assert.match(pre.headers.get('access-control-allow-headers'), /x-api-key/)
    const ok = await fetch(`${s.base}/v1/models`, { headers: { origin, authorization: `Bearer ${KEY}` } })
    assert.equal(ok.headers.get('access-control-allow-origin'), origin)
    // Errors carry it too, so the page can read them.
    const denied = await fetch(`${s.base}/v1/models`, { headers: { origin } })
    assert.equal(denied.status, 401)
    assert.equal(denied.headers.get('access-control-allow-origin'), origin)
    const stranger = await fetch(`${s.base}/v1/models`, { headers: { origin: 'http://evil.example', authorization: `Bearer ${KEY}` } })
    assert.equal(stranger.headers.get('access-control-allow-origin'), null)
    const strangerPre = await fetch(`${s.base}/v1/models`, { method: 'OPTIONS', headers: { origin: 'http://evil.example', 'access-control-request-method': 'GET' } })
    assert.equal(strangerPre.status, 403)
    assert.equal(strangerPre.headers.get('access-control-allow-origin'), null)
  } finally {
    await s.stop()
  }
})

test('429 with Retry-After once a model holds --max-batch + --max-queue requests, in each API\'s shape', async () => {
  const s = await startServer(['--max-batch', '1', '--max-queue', '1'])
  try {
    const oa = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: KEY, maxRetries: 0 })
    // Two long streams: one decoding, one queued behind it (each admitted once its headers come).
    // ignore_eos (mlex's option): they run until their clients go.
    const long = () => oa.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 100000, ignore_eos: true, stream: true })
    const streams = [await long(), await long()]
    const m = await (await fetch(`${s.base}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })).text()
    assert.equal(metric(m, 'mlex_requests_in_flight{model="tiny"}'), 2)
    assert.equal(metric(m, 'mlex_requests_queued{model="tiny"}'), 1)
    await assert.rejects(oa.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 2 }), (e) => {
      assert.equal(e.status, 429)
      assert.equal(e.code, 'rate_limit_exceeded')
      assert.equal(e.headers.get('retry-after'), '1')
      return true
    })
    const an = new Anthropic({ baseURL: s.base, apiKey: KEY, maxRetries: 0 })
    await assert.rejects(an.messages.create({ model: 'tiny', max_tokens: 2, messages: msgs }), (e) => e.status === 429 && e.type === 'rate_limit_error')
    await assert.rejects(oa.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 2 }), (e) => e.status === 429)
    // The clients go away: their places come back, and requests are served again.
    for (const st of streams) st.controller.abort()
    const deadline = Date.now() + 10000
    for (;;) {
      const t = await (await fetch(`${s.base}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })).text()
      if (metric(t, 'mlex_requests_in_flight{model="tiny"}') === 0) {
        assert.equal(metric(t, 'mlex_generations_total{model="tiny",outcome="disconnected"}'), 2)
        break
      }
      assert.ok(Date.now() < deadline, 'aborted streams free their places')
      await new Promise((r) => setTimeout(r, 20))
    }
    const r = await oa.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 2 })
    assert.ok(r.usage.completion_tokens > 0)
  } finally {
    await s.stop()
  }
})

test('--request-timeout: whole replies get 504 in their API\'s shape, streams end with an error event', async () => {
  const s = await startServer(['--request-timeout', '0.3'])
  try {
    const oa = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: KEY, maxRetries: 0 })
    const an = new Anthropic({ baseURL: s.base, apiKey: KEY, maxRetries: 0 })
    // ignore_eos (mlex's option): each would run for minutes.
    const long = { model: 'tiny', messages: msgs, max_tokens: 100000, ignore_eos: true }
    const longResponse = { model: 'tiny', input: 'x', max_output_tokens: 100000, ignore_eos: true }
    await Promise.all([
      assert.rejects(oa.chat.completions.create(long), (e) => e.status === 504 && e.code === 'timeout'),
      // (Anthropic's client refuses whole requests whose max_tokens could take over 10 minutes.)
      assert.rejects(an.messages.create({ ...long, max_tokens: 20000 }), (e) => e.status === 504 && e.type === 'timeout_error'),
      assert.rejects(oa.responses.create(longResponse), (e) => e.status === 504),
      // A chat stream: an error chunk, which the client raises.
      assert.rejects(async () => {
        for await (const _ of await oa.chat.completions.create({ ...long, stream: true }));
      }, (e) => e.code === 'timeout'),
      // An Anthropic stream: an `error` event, which the client raises.
      assert.rejects(async () => {
        for await (const _ of await an.messages.create({ ...long, stream: true }));
      }, (e) => e.type === 'timeout_error'),
      // A Responses stream: `error`, then `response.failed`.
      (async () => {
        const types = []
        for await (const e of await oa.responses.create({ ...longResponse, stream: true })) types.push(e.type)
        assert.deepEqual(types.slice(-2), ['error', 'response.failed'])
      })(),
    ])
    const m = await (await fetch(`${s.base}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })).text()
    assert.equal(metric(m, 'mlex_generations_total{model="tiny",outcome="timeout"}'), 6)
    const r = await oa.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 2 })
    assert.ok(r.usage.completion_tokens > 0)
  } finally {
    await s.stop()
  }
})

test('1,000 rapid connect/disconnects (some mid-request) leave the server serving', async () => {
  const { hostname, port } = new URL(base)
  const once = (i) => new Promise((resolve) => {
    const sock = connect({ host: hostname, port: Number(port) }, () => {
      if (i % 3 === 1) sock.write('POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"mod')
      else if (i % 3 === 2) sock.write('GET /v1/mo')
      sock.destroy()
    })
    sock.on('close', resolve)
    sock.on('error', resolve)
  })
  for (let i = 0; i < 1000; i += 50) await Promise.all(Array.from({ length: 50 }, (_, j) => once(i + j)))
  const r = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 3 })
  assert.ok(r.usage.completion_tokens > 0)
  assert.equal((await fetch(`${base}/health`)).status, 200)
})
