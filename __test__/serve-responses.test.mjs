// `mlex serve`'s Responses API against the official `openai` client (no mocks): the CLI binary
// serves the tiny model, and a copy whose chat template opens a <think> span (reasoning items).
// Whole and streamed responses with the same greedy text, the event sequence (types, order,
// sequence_number), function calls forced by tool_choice and their outputs sent back, JSON
// Schema through text.format, and the refusals of server-side state, each in OpenAI's shape.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import OpenAI from 'openai'
import { startServer, thinkingModelDir, KEY } from './serve-helpers.mjs'

let server
let client
before(async () => {
  server = await startServer([], { think: thinkingModelDir() })
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: KEY, maxRetries: 0 })
})
after(async () => {
  if (server) await server.stop()
})

test('responses.create, whole and streamed, with the same greedy text and the event sequence', async () => {
  const req = { model: 'tiny', instructions: 'Be brief.', input: 'Say something.', max_output_tokens: 12, temperature: 0 }
  const whole = await client.responses.create(req)
  assert.match(whole.id, /^resp_/)
  assert.equal(whole.object, 'response')
  assert.ok(['completed', 'incomplete'].includes(whole.status))
  if (whole.status === 'incomplete') assert.equal(whole.incomplete_details.reason, 'max_output_tokens')
  assert.equal(whole.output.at(-1).type, 'message')
  assert.equal(typeof whole.output_text, 'string')
  assert.ok(whole.usage.input_tokens > 0 && whole.usage.output_tokens > 0)
  assert.equal(whole.usage.total_tokens, whole.usage.input_tokens + whole.usage.output_tokens)

  const events = []
  for await (const e of await client.responses.create({ ...req, stream: true })) events.push(e)
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i))
  const types = events.map((e) => e.type)
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added'])
  const tail = types.slice(-4)
  assert.deepEqual(tail, ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', whole.status === 'completed' ? 'response.completed' : 'response.incomplete'])
  assert.ok(types.slice(4, -4).every((t) => t === 'response.output_text.delta'))
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('')
  assert.equal(text, whole.output_text)
  assert.equal(events.at(-1).response.usage.output_tokens, whole.usage.output_tokens)

  // The SDK's stream helper accumulates the same response.
  const final = await client.responses.stream(req).finalResponse()
  assert.equal(final.output_text, whole.output_text)
})

test('include message.output_text.logprobs with top_logprobs, whole and on each delta', async () => {
  const req = { model: 'tiny', input: 'Say something.', max_output_tokens: 8, temperature: 0, top_logprobs: 2, include: ['message.output_text.logprobs'] }
  const whole = await client.responses.create(req)
  const part = whole.output.at(-1).content[0]
  assert.equal(part.logprobs.length, whole.usage.output_tokens)
  for (const t of part.logprobs) {
    assert.equal(t.top_logprobs.length, 2)
    assert.equal(t.top_logprobs[0].token, t.token)
    assert.equal(t.top_logprobs[0].logprob, t.logprob)
  }
  const events = []
  for await (const e of await client.responses.create({ ...req, stream: true })) events.push(e)
  const deltas = events.filter((e) => e.type === 'response.output_text.delta').flatMap((e) => e.logprobs)
  assert.deepEqual(deltas, part.logprobs)
  assert.deepEqual(events.find((e) => e.type === 'response.output_text.done').logprobs, part.logprobs)
  // Not asked for: empty.
  const plain = await client.responses.create({ ...req, top_logprobs: undefined, include: undefined })
  assert.deepEqual(plain.output.at(-1).content[0].logprobs, [])
})

const tools = [{
  type: 'function', name: 'lookup', description: 'Looks a word up.', strict: true,
  parameters: { type: 'object', properties: { q: { type: 'string', maxLength: 6 } }, required: ['q'], additionalProperties: false },
}]

test('a function call forced by tool_choice, whole and streamed; its output goes back as input', async () => {
  const input = [{ role: 'user', content: [{ type: 'input_text', text: 'Look something up.' }] }]
  const r = await client.responses.create({ model: 'tiny', input, tools, tool_choice: { type: 'function', name: 'lookup' }, max_output_tokens: 200 })
  assert.equal(r.status, 'completed')
  const call = r.output.find((o) => o.type === 'function_call')
  assert.equal(call.name, 'lookup')
  assert.ok(call.call_id)
  assert.equal(typeof JSON.parse(call.arguments).q, 'string')

  const events = []
  for await (const e of await client.responses.create({ model: 'tiny', input, tools, tool_choice: 'required', max_output_tokens: 200, stream: true })) events.push(e)
  const types = events.map((e) => e.type)
  const added = types.lastIndexOf('response.output_item.added')
  assert.deepEqual(types.slice(added), [
    'response.output_item.added', 'response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done', 'response.completed',
  ])
  const done = events.find((e) => e.type === 'response.function_call_arguments.done')
  assert.equal(typeof JSON.parse(done.arguments).q, 'string')
  assert.equal(events.at(-1).response.output.at(-1).type, 'function_call')

  const next = await client.responses.create({
    model: 'tiny', tools, max_output_tokens: 6,
    input: [...input, { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments }, { type: 'function_call_output', call_id: call.call_id, output: 'found' }],
  })
  assert.equal(next.output.at(-1).type, 'message')
})

test('text.format json_schema holds the reply to the schema', async () => {
  const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['n'], additionalProperties: false }
  const r = await client.responses.create({ model: 'tiny', input: 'A digit.', max_output_tokens: 40, text: { format: { type: 'json_schema', name: 'digit', strict: true, schema } } })
  const v = JSON.parse(r.output_text)
  assert.ok(Number.isInteger(v.n) && v.n >= 0 && v.n <= 9, r.output_text)
})

test('a reasoning item, whole and streamed (reasoning_text events), before the message', async () => {
  const req = { model: 'think', input: 'Think, then answer.', max_output_tokens: 30, reasoning_budget_tokens: 3 }
  const whole = await client.responses.create(req)
  assert.deepEqual(whole.output.map((o) => o.type), ['reasoning', 'message'])
  const reasoning = whole.output[0].content[0].text
  assert.ok(reasoning.length > 0)
  assert.equal(whole.usage.output_tokens_details.reasoning_tokens > 0, true)

  const events = []
  for await (const e of await client.responses.create({ ...req, stream: true })) events.push(e)
  const streamed = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('')
  assert.equal(streamed, reasoning)
  const items = events.filter((e) => e.type === 'response.output_item.done').map((e) => e.item.type)
  assert.deepEqual(items, ['reasoning', 'message'])
  // The reasoning item goes back as input with the assistant's message.
  const next = await client.responses.create({ model: 'think', max_output_tokens: 5, input: [{ role: 'user', content: 'Q' }, ...whole.output, { role: 'user', content: 'And?' }] })
  assert.ok(next.output.length > 0)
})

test('errors come in OpenAI shape: server-side state, bad fields, unknown model, a schema llguidance rejects', async () => {
  const bad = (extra, check) => assert.rejects(client.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 4, ...extra }), check)
  await bad({ store: true }, (e) => e.status === 400 && e.param === 'store' && /store/.test(e.message))
  await bad({ previous_response_id: 'resp_123' }, (e) => e.status === 400 && e.param === 'previous_response_id')
  await bad({ model: 'nope' }, (e) => e.status === 404 && e.code === 'model_not_found')
  await bad({ input: 42 }, (e) => e.status === 400 && e.param === 'input')
  await bad({ input: [{ type: 'item_reference', id: 'msg_1' }] }, (e) => e.status === 400 && /item_reference/.test(e.message))
  await bad({ tools: [{ type: 'web_search' }] }, (e) => e.status === 400 && /web_search/.test(e.message))
  await bad({ max_output_tokens: -3 }, (e) => e.status === 400 && /max_output_tokens/.test(e.message))
  await bad({ text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', properties: { a: { type: 'no-such-type' } } } } } }, (e) => e.status === 400)
  const ok = await client.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 2, store: false })
  assert.ok(ok.usage.output_tokens > 0)
})
