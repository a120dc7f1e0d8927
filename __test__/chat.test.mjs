// Chat features through the Node API: parseToolCalls, typed tokens, the reasoning split and
// budget, toolCallFormat. The tiny random model never writes tool calls on its own; the parsers
// are exercised directly, the engine plumbing through a thinking template and the budget.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { tmpdir } from 'node:os'
import { Session, parseToolCalls } from 'mlex'
import { modelDir, user, rejectsWithCode } from './helpers.mjs'

// Qwen3-Thinking style: the generation prompt opens the reasoning span.
const THINK_TEMPLATE =
  "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"

let plain
let thinking
before(async () => {
  plain = await Session.load(modelDir())
  const dir = mkdtempSync(join(tmpdir(), 'mlex-think-'))
  cpSync(modelDir(), dir, { recursive: true })
  const cfgPath = join(dir, 'tokenizer_config.json')
  const cfg = JSON.parse(readFileSync(cfgPath, 'utf8'))
  cfg.chat_template = THINK_TEMPLATE
  writeFileSync(cfgPath, JSON.stringify(cfg))
  thinking = await Session.load(dir)
})
after(async () => {
  await plain?.close()
  await thinking?.close()
})

test('parseToolCalls: Hermes, Qwen3-Coder XML, Gemma 4, Llama 3, Mistral, tool_code', () => {
  const hermes = parseToolCalls(
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    'hermes',
  )
  assert.equal(hermes.text, 'Let me check.')
  assert.equal(hermes.toolCalls.length, 1)
  const [call] = hermes.toolCalls
  assert.equal(call.type, 'function')
  assert.equal(call.function.name, 'get_weather')
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' })
  assert.match(call.id, /^call_[0-9a-f]+$/)

  const xml = parseToolCalls('<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=s>\nhi there\n</parameter>\n</function>\n</tool_call>', 'qwen3_coder')
  assert.deepEqual(JSON.parse(xml.toolCalls[0].function.arguments), { n: 3, s: 'hi there' })

  const gemma = parseToolCalls('<|tool_call>call:search{query:<|"|>mlx, rust<|"|>,limit:5}<tool_call|>', 'gemma4')
  assert.deepEqual(JSON.parse(gemma.toolCalls[0].function.arguments), { query: 'mlx, rust', limit: 5 })

  const llama = parseToolCalls('<|python_tag|>{"name": "f", "parameters": {"a": 1}}', 'llama3_json')
  assert.equal(llama.toolCalls[0].function.name, 'f')

  const mistral = parseToolCalls('[TOOL_CALLS]f[ARGS]{"a": 1}', 'mistral')
  assert.equal(mistral.toolCalls[0].function.name, 'f')

  const code = parseToolCalls('```tool_code\nf(a="x", b=True)\n```', 'gemma_tool_code')
  assert.deepEqual(JSON.parse(code.toolCalls[0].function.arguments), { a: 'x', b: true })

  // Two calls get two ids.
  const two = parseToolCalls('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>', 'hermes')
  assert.notEqual(two.toolCalls[0].id, two.toolCalls[1].id)
})

test('parseToolCalls without a format tries them all', () => {
  assert.equal(parseToolCalls('<|tool_call>call:f{}<tool_call|>').toolCalls[0].function.name, 'f')
  assert.equal(parseToolCalls('[TOOL_CALLS][{"name": "g", "arguments": {}}]').toolCalls[0].function.name, 'g')
  assert.deepEqual(parseToolCalls('just text'), { text: 'just text', toolCalls: [] })
})

test('parseToolCalls leaves malformed calls in the text and never throws on model output', () => {
  for (const text of [
    '<tool_call>{"name": "f", "arguments": {',
    '<tool_call>{"name": "f", "arguments": {</tool_call>',
    '<tool_call>not json</tool_call>',
    '<|tool_call>call:f{a:<|"|>x}<tool_call|>',
    '\u0000<tool_call>\uFFFD</tool_call>',
  ]) {
    const r = parseToolCalls(text, text.includes('<|tool_call>') ? 'gemma4' : 'hermes')
    assert.deepEqual(r.toolCalls, [], text)
    assert.equal(r.text, text)
  }
})

test('parseToolCalls rejects bad arguments with INVALID_ARGUMENT', () => {
  for (const [args, re] of [
    [[42], /text must be a string/],
    [['x', 'yaml'], /unknown tool call format/],
    [['x', 5], /format must be a string/],
  ]) {
    assert.throws(() => parseToolCalls(...args), (e) => e.code === 'INVALID_ARGUMENT' && re.test(e.message))
  }
})

test('tokens carry kinds; text tokens add up to reply.text', async () => {
  const tokens = []
  const reply = await plain.generate(user('Hi'), { maxTokens: 12, ignoreEos: true, onToken: (t) => { tokens.push(t) } })
  assert.ok(tokens.every((t) => t.kind === 'text'), JSON.stringify(tokens.map((t) => t.kind)))
  assert.equal(tokens.map((t) => t.text).join(''), reply.text)
  assert.equal(reply.reasoning ?? null, null)
  assert.deepEqual(reply.toolCalls, [])
})

test('reasoning budget: the closer is fed after N reasoning tokens, typed reasoning, then the answer', async () => {
  const closer = [...Buffer.from('\n</think>\n\n')]
  const n = 3
  const tokens = []
  for await (const t of thinking.stream(user('Think.'), { maxTokens: 20, ignoreEos: true, reasoningBudgetTokens: n })) {
    tokens.push(t)
  }
  const ids = tokens.map((t) => t.id)
  assert.deepEqual(ids.slice(n, n + closer.length), closer, JSON.stringify(ids))
  assert.equal(ids.length, 20)
  assert.ok(tokens.slice(0, n + closer.length).every((t) => t.kind === 'reasoning'), JSON.stringify(tokens))
  assert.ok(tokens.slice(n + closer.length).every((t) => t.kind === 'text'))
  const reply = await thinking.generate(user('Think.'), { maxTokens: 20, ignoreEos: true, reasoningBudgetTokens: n })
  assert.deepEqual(reply.tokens, ids)
  assert.ok(!reply.text.includes('think>'))
  assert.equal(tokens.filter((t) => t.kind === 'text').map((t) => t.text).join(''), reply.text)
})

test('tools with an explicit toolCallFormat generate; a bad format rejects', async () => {
  const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }]
  const reply = await plain.generate(user('Call f'), { maxTokens: 6, ignoreEos: true, tools, toolCallFormat: 'hermes' })
  assert.equal(reply.finishReason, 'length')
  await rejectsWithCode(assert, () => plain.generate(user('x'), { tools, toolCallFormat: 'nope' }), 'INVALID_ARGUMENT', /toolCallFormat/)
})

test('responseFormat holds the reply to a JSON Schema, a regex; bad ones reject with INVALID_ARGUMENT', async () => {
  const schema = {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 10 }, sunny: { type: 'boolean' } },
    required: ['city', 'sunny'],
    additionalProperties: false,
  }
  const replies = await Promise.all([
    plain.generate(user('Weather?'), { maxTokens: 80, responseFormat: { type: 'json_schema', schema } }),
    plain.generate(user('Weather again?'), {
      maxTokens: 80,
      responseFormat: { type: 'json_schema', json_schema: { name: 'weather', strict: true, schema } },
    }),
    plain.generate(user('A code'), { maxTokens: 20, responseFormat: { type: 'regex', pattern: '[A-Z]{2}-[0-9]{3}' } }),
  ])
  for (const r of replies.slice(0, 2)) {
    assert.equal(r.finishReason, 'stop', r.text)
    const v = JSON.parse(r.text)
    assert.deepEqual(Object.keys(v).sort(), ['city', 'sunny'])
    assert.equal(typeof v.city, 'string')
    assert.ok(v.city.length <= 10)
    assert.equal(typeof v.sunny, 'boolean')
  }
  assert.match(replies[2].text, /^[A-Z]{2}-[0-9]{3}$/)
  await rejectsWithCode(assert, () => plain.generate(user('x'), { responseFormat: { type: 'xml' } }), 'INVALID_ARGUMENT', /responseFormat\.type/)
  await rejectsWithCode(assert, () => plain.generate(user('x'), { responseFormat: { type: 'regex', pattern: '([a-z' } }), 'INVALID_ARGUMENT', /response_format/)
})

test('toolChoice by name makes a call that parses with arguments inside the schema', async () => {
  const tools = [
    { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['a', 'b'], additionalProperties: false } } },
    { type: 'function', function: { name: 'noop', parameters: { type: 'object' } } },
  ]
  const reply = await plain.generate(user('Add two numbers'), { maxTokens: 80, tools, toolCallFormat: 'hermes', toolChoice: { type: 'function', function: { name: 'add' } } })
  assert.equal(reply.finishReason, 'tool_calls')
  assert.equal(reply.toolCalls.length, 1)
  assert.equal(reply.toolCalls[0].function.name, 'add')
  const args = JSON.parse(reply.toolCalls[0].function.arguments)
  assert.ok(Number.isInteger(args.a) && args.a >= 0 && args.a <= 9 && Number.isInteger(args.b), JSON.stringify(args))
  await rejectsWithCode(assert, () => plain.generate(user('x'), { tools, toolChoice: { name: 'nope' } }), 'INVALID_ARGUMENT', /not among the tools/)
})

test("a chat template without tool support gets mlex's generic tool prompt, and the reply says so", async () => {
  // The fixture's ChatML template ignores `tools` (as SmolLM2's does): without help the model
  // would never see them.
  const tools = [
    { type: 'function', function: { name: 'add', description: 'Adds two digits', parameters: { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['a', 'b'], additionalProperties: false } } },
  ]
  const msgs = user('Add 2 and 3')
  const bare = await plain.generate(msgs, { maxTokens: 4, ignoreEos: true })
  assert.equal(bare.toolCallFormat ?? null, null)
  const auto = await plain.generate(msgs, { maxTokens: 4, ignoreEos: true, tools })
  assert.equal(auto.toolCallFormat, 'generic')
  assert.ok(auto.usage.promptTokens > bare.usage.promptTokens + 100, `${auto.usage.promptTokens} vs ${bare.usage.promptTokens}`)
  // A format given explicitly is taken at its word: the template's prompt, as it is.
  const explicit = await plain.generate(msgs, { maxTokens: 4, ignoreEos: true, tools, toolCallFormat: 'hermes' })
  assert.equal(explicit.toolCallFormat, 'hermes')
  assert.equal(explicit.usage.promptTokens, bare.usage.promptTokens)
  // A call it must make is held to the generic format, streamed as toolCall tokens, and parsed.
  const kinds = []
  const forced = await plain.generate(msgs, { maxTokens: 120, tools, toolChoice: { name: 'add' }, onToken: (t) => { kinds.push(t.kind) } })
  assert.equal(forced.toolCallFormat, 'generic')
  assert.equal(forced.finishReason, 'tool_calls', forced.text)
  assert.equal(forced.toolCalls.length, 1)
  assert.equal(forced.toolCalls[0].function.name, 'add')
  const args = JSON.parse(forced.toolCalls[0].function.arguments)
  assert.ok([args.a, args.b].every((x) => Number.isInteger(x) && x >= 0 && x <= 9), JSON.stringify(args))
  assert.ok(kinds.includes('toolCall'))
  // The same form through parseToolCalls.
  const parsed = parseToolCalls('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', 'generic')
  assert.equal(parsed.toolCalls[0].function.name, 'add')
})
