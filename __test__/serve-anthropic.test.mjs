// `mlex serve`'s Anthropic Messages API against the official `@anthropic-ai/sdk` client (no
// mocks): the CLI binary serves the tiny model, and a copy of it whose chat template opens a
// <think> span (so thinking blocks come out, ended by thinking.budget_tokens). Whole and
// streamed replies with the same greedy text, the exact event order, a forced tool_use block
// and a tool_result round trip, stop sequences, and errors in Anthropic's shape.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import Anthropic from '@anthropic-ai/sdk'
import { startServer, thinkingModelDir, KEY } from './serve-helpers.mjs'

let server
let base
let client
before(async () => {
  server = await startServer(['--max-body-bytes', '65536'], { think: thinkingModelDir('{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}') })
  base = server.base
  client = new Anthropic({ baseURL: base, apiKey: KEY, maxRetries: 0 })
})
after(async () => {
  if (server) await server.stop()
})

const messages = [{ role: 'user', content: 'Say something.' }]
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('')

test('messages.create, whole and streamed, with the same greedy text and Anthropic event order', async () => {
  const whole = await client.messages.create({ model: 'tiny', max_tokens: 12, temperature: 0, system: 'Be brief.', messages })
  assert.match(whole.id, /^msg_/)
  assert.equal(whole.type, 'message')
  assert.equal(whole.role, 'assistant')
  assert.ok(['end_turn', 'max_tokens'].includes(whole.stop_reason))
  assert.ok(whole.usage.input_tokens + (whole.usage.cache_read_input_tokens ?? 0) > 0 && whole.usage.output_tokens > 0)

  const events = []
  const stream = await client.messages.create({ model: 'tiny', max_tokens: 12, temperature: 0, system: 'Be brief.', messages, stream: true })
  for await (const e of stream) events.push(e)
  const types = events.map((e) => e.type)
  assert.equal(types[0], 'message_start')
  assert.equal(types.at(-1), 'message_stop')
  assert.equal(types.at(-2), 'message_delta')
  // Blocks open, take deltas, and close in turn, indices counting up from 0.
  let open = null
  let next = 0
  for (const e of events.slice(1, -2)) {
    if (e.type === 'content_block_start') {
      assert.equal(open, null)
      assert.equal(e.index, next)
      open = e.index
    } else if (e.type === 'content_block_delta') {
      assert.equal(e.index, open)
    } else if (e.type === 'content_block_stop') {
      assert.equal(e.index, open)
      open = null
      next++
    } else assert.fail(`unexpected ${e.type} between message_start and message_delta`)
  }
  assert.equal(open, null)
  const text = events.filter((e) => e.type === 'content_block_delta' && e.delta.type === 'text_delta').map((e) => e.delta.text).join('')
  assert.equal(text, textOf(whole))
  const delta = events.at(-2)
  assert.equal(delta.delta.stop_reason, whole.stop_reason)
  assert.equal(delta.usage.output_tokens, whole.usage.output_tokens)

  // The SDK's stream helper accumulates the same message.
  const final = await client.messages.stream({ model: 'tiny', max_tokens: 12, temperature: 0, system: 'Be brief.', messages }).finalMessage()
  assert.equal(textOf(final), textOf(whole))
  assert.equal(final.stop_reason, whole.stop_reason)
})

test('models.list / retrieve in Anthropic shape, and messages.countTokens', async () => {
  const page = await client.models.list()
  assert.deepEqual(page.data.map((m) => [m.type, m.id]), [['model', 'tiny'], ['model', 'think']])
  assert.ok(!Number.isNaN(Date.parse(page.data[0].created_at)))
  assert.equal((await client.models.retrieve('think')).id, 'think')
  await assert.rejects(client.models.retrieve('nope'), (e) => e.status === 404 && e.type === 'not_found_error')
  const req = { model: 'tiny', system: 'Count me.', messages: [{ role: 'user', content: 'How many tokens is this?' }] }
  const counted = await client.messages.countTokens(req)
  const r = await client.messages.create({ ...req, max_tokens: 1 })
  assert.equal(counted.input_tokens, r.usage.input_tokens + r.usage.cache_read_input_tokens)
})

test('a stop sequence ends the reply with stop_reason stop_sequence', async () => {
  const free = await client.messages.create({ model: 'tiny', max_tokens: 16, messages })
  const text = textOf(free)
  // A piece of the greedy reply from its middle (ASCII, so that it is whole characters).
  const at = [...text].findIndex((c, i) => i >= 3 && /[ -~]/.test(c))
  if (at < 0) return // no printable character to stop at in this model's output
  const stop = [...text][at]
  const r = await client.messages.create({ model: 'tiny', max_tokens: 16, messages, stop_sequences: [stop] })
  assert.equal(r.stop_reason, 'stop_sequence')
  assert.equal(r.stop_sequence, stop)
  assert.ok(!textOf(r).includes(stop))
})

const tools = [{
  name: 'lookup',
  description: 'Looks a word up.',
  input_schema: { type: 'object', properties: { q: { type: 'string', maxLength: 6 } }, required: ['q'], additionalProperties: false },
}]

test('tool_choice forces a tool_use block, whole and streamed; a tool_result goes back', async () => {
  const r = await client.messages.create({ model: 'tiny', max_tokens: 200, messages, tools, tool_choice: { type: 'tool', name: 'lookup' } })
  assert.equal(r.stop_reason, 'tool_use')
  const use = r.content.find((b) => b.type === 'tool_use')
  assert.equal(use.name, 'lookup')
  assert.match(use.id, /^toolu_/)
  assert.equal(typeof use.input.q, 'string')

  const s = client.messages.stream({ model: 'tiny', max_tokens: 200, messages, tools, tool_choice: { type: 'any' } })
  const jsonDeltas = []
  s.on('inputJson', (partial) => jsonDeltas.push(partial))
  const final = await s.finalMessage()
  assert.equal(final.stop_reason, 'tool_use')
  const streamed = final.content.find((b) => b.type === 'tool_use')
  assert.equal(streamed.name, 'lookup')
  assert.equal(typeof streamed.input.q, 'string')
  assert.ok(jsonDeltas.length > 0)

  const next = await client.messages.create({
    model: 'tiny', max_tokens: 8, tools,
    messages: [...messages, { role: 'assistant', content: r.content }, {
      role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'found' }, { type: 'text', text: 'Go on.' }],
    }],
  })
  assert.equal(next.type, 'message')
  // tool_choice none: no tools shown, no call.
  const none = await client.messages.create({ model: 'tiny', max_tokens: 8, messages, tools, tool_choice: { type: 'none' } })
  assert.ok(none.content.every((b) => b.type !== 'tool_use'))
})

test('thinking blocks: enabled with a budget, streamed as thinking_delta with a signature; disabled gives none', async () => {
  const req = { model: 'think', max_tokens: 40, messages, thinking: { type: 'enabled', budget_tokens: 3 } }
  const whole = await client.messages.create(req)
  assert.equal(whole.content[0].type, 'thinking')
  assert.ok(whole.content[0].thinking.length > 0)
  assert.equal(typeof whole.content[0].signature, 'string')
  assert.equal(whole.content[1].type, 'text')

  const events = []
  for await (const e of await client.messages.create({ ...req, stream: true })) events.push(e)
  const starts = events.filter((e) => e.type === 'content_block_start').map((e) => e.content_block.type)
  assert.deepEqual(starts, ['thinking', 'text'])
  const deltas = events.filter((e) => e.type === 'content_block_delta').map((e) => e.delta.type)
  assert.ok(deltas.includes('thinking_delta') && deltas.includes('signature_delta') && deltas.includes('text_delta'))
  assert.ok(deltas.indexOf('signature_delta') < deltas.indexOf('text_delta'), 'the signature closes the thinking block')
  const thinking = events.filter((e) => e.delta?.type === 'thinking_delta').map((e) => e.delta.thinking).join('')
  assert.equal(thinking, whole.content[0].thinking)

  // The thinking block goes back with the assistant turn; disabled thinking gives none.
  const off = await client.messages.create({
    model: 'think', max_tokens: 8, thinking: { type: 'disabled' },
    messages: [...messages, { role: 'assistant', content: whole.content }, { role: 'user', content: 'And?' }],
  })
  assert.ok(off.content.every((b) => b.type !== 'thinking'))
})

test('errors come in Anthropic shape (SDK and raw requests) and the server keeps serving', async () => {
  const wrongKey = new Anthropic({ baseURL: base, apiKey: 'wrong', maxRetries: 0 })
  await assert.rejects(wrongKey.messages.create({ model: 'tiny', max_tokens: 4, messages }), (e) => e.status === 401 && e.type === 'authentication_error')
  await assert.rejects(client.messages.create({ model: 'nope', max_tokens: 4, messages }), (e) => e.status === 404 && e.type === 'not_found_error' && /nope/.test(e.message))
  await assert.rejects(client.messages.create({ model: 'tiny', messages }), (e) => e.status === 400 && e.type === 'invalid_request_error' && /max_tokens/.test(e.message))
  await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 4, messages, temperature: 'hot' }), (e) => e.status === 400 && /temperature/.test(e.message))
  await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: '' } }] }] }), (e) => e.status === 400 && /image/.test(e.message))
  // A schema llguidance rejects, through a forced tool call.
  const badTools = [{ name: 'f', input_schema: { type: 'object', properties: { a: { type: 'no-such-type' } } } }]
  await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 20, messages, tools: badTools, tool_choice: { type: 'tool', name: 'f' } }), (e) => e.status === 400 && e.type === 'invalid_request_error')

  const raw = async (body, headers = {}) => {
    const r = await fetch(`${base}/v1/messages`, { method: 'POST', headers: { 'x-api-key': KEY, 'anthropic-version': '2023-06-01', 'content-type': 'application/json', ...headers }, body })
    return { status: r.status, body: await r.json() }
  }
  const ok = JSON.stringify({ model: 'tiny', max_tokens: 2, messages })
  for (const [body, status, type] of [
    ['{not json', 400, 'invalid_request_error'],
    ['"a string"', 400, 'invalid_request_error'],
    [Buffer.from([0x7b, 0xff, 0xfe, 0x7d]), 400, 'invalid_request_error'],
    ['x'.repeat(70000), 413, 'request_too_large'],
    [JSON.stringify({ model: 'tiny', max_tokens: 2, messages: 'hi' }), 400, 'invalid_request_error'],
    [JSON.stringify({ model: 7, max_tokens: 2, messages }), 400, 'invalid_request_error'],
    [ok.replace('"tiny"', '"other"'), 404, 'not_found_error'],
  ]) {
    const r = await raw(body)
    assert.equal(r.status, status, JSON.stringify(r.body))
    assert.equal(r.body.type, 'error')
    assert.equal(r.body.error.type, type)
    assert.equal(typeof r.body.error.message, 'string')
  }
  const noKey = await raw(ok, { 'x-api-key': '' })
  assert.equal(noKey.status, 401)
  assert.equal(noKey.body.error.type, 'authentication_error')
  const after = await client.messages.create({ model: 'tiny', max_tokens: 3, messages })
  assert.ok(after.usage.output_tokens > 0)
})
