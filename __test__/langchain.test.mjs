// `mlex/langchain` (adapters/langchain.mjs): the real @langchain/core 1 driving the real addon, no
// mocks. The tiny random model covers invoke/stream equality, usage, stop, abort, forced tool calls,
// a tool loop, structured output, reasoning (a copy with a thinking template) and the errors; the
// real SmolLM2-135M-Instruct (converted from its GGUF with the debug CLI, skipped when absent) shows
// that structured output and a tool loop work on a model that writes meaningful text.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, execFileSync } from 'node:child_process'
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { homedir, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { z } from 'zod'
import { AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage } from '@langchain/core/messages'
import { ModelAbortError } from '@langchain/core/errors'
import { OutputParserException } from '@langchain/core/output_parsers'
import { tool } from '@langchain/core/tools'
import { Session } from 'mlex'
import { ChatMlex, toMlexMessages } from 'mlex/langchain'
import { modelDir } from './helpers.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const tmp = mkdtempSync(join(tmpdir(), 'mlex-langchain-'))

// Qwen3-Thinking style: the generation prompt opens the reasoning span.
const THINK_TEMPLATE =
  "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"

function thinkingModelDir() {
  const dir = join(tmp, 'tiny-thinking')
  cpSync(modelDir(), dir, { recursive: true })
  const path = join(dir, 'tokenizer_config.json')
  const cfg = JSON.parse(readFileSync(path, 'utf8'))
  cfg.chat_template = THINK_TEMPLATE
  writeFileSync(path, JSON.stringify(cfg))
  return dir
}

let session
let model
before(async () => {
  session = await Session.load(modelDir())
  model = new ChatMlex({ session, maxTokens: 12, temperature: 0 })
})
after(async () => {
  await session?.close()
  await smol?.then((s) => s.session?.close(), () => {})
  rmSync(tmp, { recursive: true, force: true })
})

const add = tool(async ({ a, b }) => String(a + b), {
  name: 'add',
  description: 'Adds two digits.',
  schema: z.object({ a: z.number().int().min(0).max(9), b: z.number().int().min(0).max(9) }),
})
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather of a city.',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'], additionalProperties: false },
  },
}
const Weather = z.object({ city: z.string().max(10), sunny: z.boolean(), celsius: z.number().int().min(-30).max(50) })

/** Concatenates a stream of AIMessageChunks, checking each one. */
async function collect(stream) {
  const chunks = []
  for await (const chunk of stream) {
    assert.ok(AIMessageChunk.isInstance(chunk))
    chunks.push(chunk)
  }
  return { chunks, whole: chunks.reduce((a, b) => a.concat(b)) }
}

test('invoke: the addon reply as an AIMessage, with usage and metadata', async () => {
  const messages = [new SystemMessage('Be brief.'), new HumanMessage('Hi')]
  const reply = await model.invoke(messages)
  const direct = await session.generate(
    [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }],
    { maxTokens: 12, temperature: 0 },
  )
  assert.ok(AIMessage.isInstance(reply))
  assert.equal(reply.content, direct.text)
  assert.deepEqual(reply.tool_calls, [])
  const usage = reply.usage_metadata
  assert.equal(usage.input_tokens, direct.usage.promptTokens)
  assert.equal(usage.output_tokens, direct.usage.completionTokens)
  assert.equal(usage.total_tokens, usage.input_tokens + usage.output_tokens)
  assert.equal(typeof usage.input_token_details.cache_read, 'number')
  assert.equal(reply.response_metadata.finish_reason, direct.finishReason)
  assert.equal(reply.response_metadata.model_name, 'tiny-llama')
  assert.equal(reply.response_metadata.model_provider, 'mlex')
  assert.equal(model._llmType(), 'mlex')
  assert.deepEqual(model._identifyingParams(), { model_name: 'tiny-llama', maxTokens: 12, temperature: 0 })
})

test('stream: greedy chunks add up to the invoke reply; the last chunk carries usage and the finish reason', async () => {
  const whole = await model.invoke('Tell me something.')
  const { chunks, whole: streamed } = await collect(await model.stream('Tell me something.'))
  assert.ok(chunks.length > 2, `${chunks.length} chunks`)
  assert.equal(chunks.map((c) => c.content).join(''), whole.content)
  assert.equal(streamed.content, whole.content)
  assert.equal(streamed.usage_metadata.output_tokens, whole.usage_metadata.output_tokens)
  assert.equal(streamed.usage_metadata.input_tokens, whole.usage_metadata.input_tokens)
  assert.equal(chunks.at(-1).response_metadata.finish_reason, whole.response_metadata.finish_reason)
  assert.ok(chunks.slice(0, -1).every((c) => c.usage_metadata === undefined))
})

test('call options: maxTokens and stop reach mlex; invocationParams maps tools and tool_choice', async () => {
  const three = await model.invoke('Hi', { maxTokens: 3 })
  assert.equal(three.usage_metadata.output_tokens, 3)
  assert.equal(three.response_metadata.finish_reason, 'length')

  const full = await model.invoke('Hi')
  const stop = [...full.content].find((c) => c.charCodeAt(0) > 32 && c.charCodeAt(0) < 127)
  assert.ok(stop, JSON.stringify(full.content))
  const stopped = await model.invoke('Hi', { stop: [stop] })
  assert.equal(stopped.content, full.content.slice(0, full.content.indexOf(stop)))
  assert.equal(stopped.response_metadata.finish_reason, 'stop')

  const params = model.invocationParams({ stop: ['x'], topK: 5, tools: [add, weather], tool_choice: 'any' })
  assert.deepEqual(params.stop, ['x'])
  assert.equal(params.topK, 5)
  assert.equal(params.maxTokens, 12)
  assert.deepEqual(params.tools.map((t) => t.function.name), ['add', 'get_weather'])
  assert.equal(params.tools[0].function.parameters.properties.a.type, 'integer')
  assert.equal(params.toolChoice, 'required')
  assert.deepEqual(model.invocationParams({ tool_choice: 'add' }).toolChoice, { name: 'add' })
  assert.equal(model.invocationParams({ tool_choice: 'none' }).toolChoice, 'none')
  assert.deepEqual(model.invocationParams({ tool_choice: { type: 'function', function: { name: 'f' } } }).toolChoice, { name: 'f' })
})

test('abort: before the start, mid-stream and mid-invoke; the session goes on', async () => {
  const aborted = new AbortController()
  aborted.abort()
  await assert.rejects(model.invoke('Hi', { signal: aborted.signal }), (e) => ModelAbortError.isInstance(e))

  const controller = new AbortController()
  let seen = 0
  await assert.rejects(async () => {
    for await (const chunk of await model.stream('Hi', { maxTokens: 200, signal: controller.signal })) {
      seen += chunk.content.length
      controller.abort()
    }
  }, (e) => e.name === 'AbortError' || ModelAbortError.isInstance(e))
  assert.ok(seen > 0)

  // A regular expression holds the reply to 4000 letters: only the abort can end it early.
  const long = { responseFormat: { type: 'regex', pattern: '[a-z]{4000}' }, maxTokens: 4000 }
  await assert.rejects(model.invoke('Hi', { ...long, signal: AbortSignal.timeout(30) }), (e) => {
    assert.ok(ModelAbortError.isInstance(e), String(e))
    if (e.partialOutput) assert.match(e.partialOutput.content, /^[a-z]*$/)
    return true
  })
  const after = await model.invoke('Hi', { maxTokens: 2 })
  assert.equal(after.usage_metadata.output_tokens, 2)
})

test('bindTools: a forced call comes back in tool_calls with an id and arguments inside the schema', async () => {
  const forced = model.bindTools([add, weather], { tool_choice: 'add', maxTokens: 80 })
  const reply = await forced.invoke('Add two and three.')
  assert.equal(reply.response_metadata.finish_reason, 'tool_calls')
  assert.equal(reply.tool_calls.length, 1)
  const [call] = reply.tool_calls
  assert.equal(call.name, 'add')
  assert.match(call.id, /^call_/)
  assert.ok(add.schema.safeParse(call.args).success, JSON.stringify(call.args))
  assert.equal(reply.content, '')

  const any = await model.bindTools([weather], { tool_choice: 'any', maxTokens: 80 }).invoke('Weather in Paris?')
  assert.equal(any.tool_calls[0].name, 'get_weather')
  assert.equal(typeof any.tool_calls[0].args.city, 'string')
  assert.ok(any.tool_calls[0].args.city.length <= 8)

  const { whole } = await collect(await forced.stream('Add two and three.'))
  assert.equal(whole.tool_calls.length, 1)
  assert.equal(whole.tool_calls[0].name, 'add')
  assert.deepEqual(whole.tool_calls[0].args, call.args)
  assert.equal(whole.content, '')
  assert.equal(whole.response_metadata.finish_reason, 'tool_calls')
})

test('a tool loop: the call runs, its ToolMessage goes back, the second turn answers in text', async () => {
  const history = [new HumanMessage('What is 2 + 3? Use the tool.')]
  const first = await model.bindTools([add], { tool_choice: 'add', maxTokens: 80 }).invoke(history)
  const [call] = first.tool_calls
  const result = await add.invoke(call)
  assert.ok(ToolMessage.isInstance(result))
  assert.equal(result.tool_call_id, call.id)
  history.push(first, result)

  const mlexMessages = toMlexMessages(history)
  assert.deepEqual(mlexMessages[1].toolCalls, [{ id: call.id, type: 'function', function: { name: 'add', arguments: JSON.stringify(call.args) } }])
  assert.deepEqual(mlexMessages[2], { role: 'tool', toolCallId: call.id, content: String(call.args.a + call.args.b), name: 'add' })
  assert.match(session.applyChatTemplate(mlexMessages), new RegExp(`<\\|im_start\\|>tool\\n${result.content}<\\|im_end\\|>`))

  const second = await model.bindTools([add]).invoke(history)
  assert.equal(typeof second.content, 'string')
  assert.ok(second.content.length > 0)
  assert.deepEqual(second.tool_calls, [])
  assert.ok(second.usage_metadata.input_tokens > first.usage_metadata.input_tokens)
})

test('withStructuredOutput: a zod schema holds every sampled reply; functionCalling, includeRaw and JSON Schema too', async () => {
  // Byte-level tokens: a 10-character string can take 40 of them, a Hermes tool call ~120 in all.
  // Seeded: a free JSON object (jsonMode) sampled from random weights can outrun any maxTokens,
  // and did once in a CI run; the seed makes the replies the same on every run.
  const sampling = new ChatMlex({ session, maxTokens: 200, temperature: 1, seed: 11 })
  const structured = sampling.withStructuredOutput(Weather, { name: 'weather' })
  const prompts = ['Weather in Paris?', 'Weather in Oslo?', 'Weather in Rome?', 'Weather in Lima?']
  for (const value of await structured.batch(prompts)) Weather.parse(value)

  const viaTool = await sampling.withStructuredOutput(Weather, { method: 'functionCalling', name: 'weather' }).invoke('Weather?')
  Weather.parse(viaTool)

  const { raw, parsed } = await sampling.withStructuredOutput(Weather, { includeRaw: true }).invoke('Weather?')
  assert.ok(AIMessage.isInstance(raw))
  assert.deepEqual(JSON.parse(raw.content), parsed)
  Weather.parse(parsed)

  const schema = { title: 'point', type: 'object', properties: { x: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['x'], additionalProperties: false }
  const point = await sampling.withStructuredOutput(schema).invoke('A point?')
  assert.deepEqual(Object.keys(point), ['x'])
  assert.ok(Number.isInteger(point.x) && point.x >= 0 && point.x <= 9)

  const json = await sampling.withStructuredOutput({ type: 'object' }, { method: 'jsonMode' }).invoke('Any JSON.')
  assert.equal(typeof json, 'object')
})

test('reasoning: thinking tokens in additional_kwargs, v1 content blocks and streamEvents', async () => {
  const thinker = new ChatMlex({ model: thinkingModelDir(), maxTokens: 20, temperature: 0, reasoningBudgetTokens: 3 })
  try {
    const reply = await thinker.invoke('Think.')
    const reasoning = reply.additional_kwargs.reasoning_content
    assert.equal(typeof reasoning, 'string')
    assert.ok(reasoning.length > 0)
    assert.ok(!reply.content.includes('think>'))
    assert.ok(reply.usage_metadata.output_token_details.reasoning > 0)

    const { whole } = await collect(await thinker.stream('Think.'))
    assert.equal(whole.additional_kwargs.reasoning_content, reasoning)
    assert.equal(whole.content, reply.content)

    const v1 = await thinker.invoke('Think.', { outputVersion: 'v1' })
    assert.deepEqual(v1.content, [{ type: 'reasoning', reasoning }, { type: 'text', text: reply.content }])
    const { whole: v1Streamed } = await collect(await thinker.stream('Think.', { outputVersion: 'v1' }))
    assert.deepEqual(v1Streamed.contentBlocks.map((b) => [b.type, b.reasoning ?? b.text]), [['reasoning', reasoning], ['text', reply.content]])

    const events = thinker.streamEvents('Think.')
    assert.equal(await events.reasoning, reasoning)
    assert.equal(await events.text, reply.content)
    const message = await events
    assert.equal(message.response_metadata.finish_reason, 'length')
    assert.equal(message.usage_metadata.output_tokens, 20)
  } finally {
    await thinker.close()
  }
  await assert.rejects(thinker.invoke('Think.'), (e) => e.code === 'SESSION_CLOSED')
})

test('errors: bad construction, bad options, unknown tools, unsupported content, cut-off structured output', async () => {
  assert.throws(() => new ChatMlex({}), (e) => e.code === 'INVALID_ARGUMENT')
  assert.throws(() => new ChatMlex({ session, model: modelDir() }), (e) => e.code === 'INVALID_ARGUMENT')
  await assert.rejects(model.invoke('Hi', { temperature: -1 }), (e) => e.code === 'INVALID_ARGUMENT' && /temperature/.test(e.message))
  await assert.rejects(model.bindTools([add], { tool_choice: 'nope' }).invoke('Hi'), (e) => e.code === 'INVALID_ARGUMENT' && /not among the tools/.test(e.message))
  await assert.rejects(model.invoke([new HumanMessage({ content: [{ type: 'audio', data: 'AAAA', mimeType: 'audio/wav' }] })]), (e) => e.code === 'INVALID_ARGUMENT')
  const missing = new ChatMlex({ model: join(tmp, 'no-such-model') })
  await assert.rejects(missing.invoke('Hi'), (e) => e.code === 'MODEL_NOT_FOUND')
  await missing.close()

  const cut = model.withStructuredOutput(Weather)
  await assert.rejects(cut.invoke('Weather?', { maxTokens: 3 }), (e) => e instanceof OutputParserException && /maxTokens/.test(e.message))
  const { raw, parsed } = await model.withStructuredOutput(Weather, { includeRaw: true }).invoke('Weather?', { maxTokens: 3 })
  assert.equal(raw.response_metadata.finish_reason, 'length')
  assert.equal(parsed, null)

  // The session passed in stays open: ChatMlex.close() only frees what it loaded.
  const borrowed = new ChatMlex({ session })
  await borrowed.close()
  assert.equal(session.closed, false)
})

// --- the real SmolLM2-135M-Instruct -------------------------------------------------------------

let smol
/** SmolLM2 converted from its GGUF (once per process) and loaded, or a reason to skip. */
function smolModel() {
  smol ??= (async () => {
    const gguf = process.env.MLEX_SMOLLM2_GGUF ?? join(homedir(), '.cache', 'mlex', 'models', 'SmolLM2-135M-Instruct.Q4_1.gguf')
    if (!existsSync(gguf)) return { skip: `no SmolLM2 GGUF at ${gguf} (set MLEX_SMOLLM2_GGUF)` }
    const host = execFileSync('rustc', ['-vV']).toString().match(/^host: (.+)$/m)[1]
    const bin = join(root, 'target', host, 'debug', 'mlex')
    if (!existsSync(bin)) return { skip: `no mlex debug binary at ${bin} (cargo build --target ${host})` }
    const out = join(tmp, 'smollm2')
    await promisify(execFile)(bin, ['convert', '--gguf', gguf, '--out', out])
    const s = await Session.load(out)
    return { session: s, model: new ChatMlex({ session: s, temperature: 0, maxTokens: 48 }) }
  })()
  return smol
}

test('SmolLM2: withStructuredOutput returns a zod-valid object', async (t) => {
  const { skip, model: smolChat } = await smolModel()
  if (skip) return t.skip(skip)
  const Person = z.object({ name: z.string().min(1).max(20), age: z.number().int().min(0).max(120) })
  const person = await smolChat.withStructuredOutput(Person).invoke('Invent a person. Reply in JSON with a name and an age.')
  Person.parse(person)
  assert.ok(/[A-Za-z]/.test(person.name), JSON.stringify(person))
})

test('SmolLM2: a forced tool call, its result, then an answer in text', async (t) => {
  const { skip, model: smolChat } = await smolModel()
  if (skip) return t.skip(skip)
  const getWeather = tool(async ({ city }) => `Sunny and 22 degrees in ${city}.`, {
    name: 'get_weather',
    description: 'The current weather of a city.',
    schema: z.object({ city: z.string().min(1).max(20) }),
  })
  const history = [new HumanMessage('What is the weather in Paris?')]
  const first = await smolChat.bindTools([getWeather], { tool_choice: 'get_weather' }).invoke(history)
  assert.equal(first.tool_calls.length, 1, JSON.stringify(first))
  assert.equal(first.tool_calls[0].name, 'get_weather')
  assert.match(first.tool_calls[0].args.city, /paris/i)
  history.push(first, await getWeather.invoke(first.tool_calls[0]))
  const second = await smolChat.bindTools([getWeather]).invoke(history)
  assert.deepEqual(second.tool_calls, [])
  assert.match(second.content, /\w+ \w+/)
  assert.ok(['stop', 'length'].includes(second.response_metadata.finish_reason))
})
