// `mlex/ai-sdk` against the real AI SDK (`ai` 7, zod 4) and the real addon, no mocks: generateText,
// streamText, usage, reasoning, abort, structured output, a forced two-step tool loop, the prompt
// conversion and the errors, on the tiny random checkpoint; then structured output and the tool
// loop on SmolLM2-135M-Instruct when its GGUF and the mlex CLI (to convert it) are there.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, execFileSync } from 'node:child_process'
import { promisify } from 'node:util'
import { cpSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { homedir, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  APICallError,
  NoSuchModelError,
  Output,
  UnsupportedFunctionalityError,
  generateObject,
  generateText,
  stepCountIs,
  streamText,
  tool,
} from 'ai'
import { z } from 'zod'
import { Session } from 'mlex'
import { createMlex, mlex, MlexLanguageModel } from 'mlex/ai-sdk'
import { modelDir } from './helpers.mjs'

globalThis.AI_SDK_LOG_WARNINGS = false // the tests read the warnings themselves

// The thinking template of chat.test.mjs: the generation prompt opens the reasoning span.
const THINK_TEMPLATE =
  "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"

let session // the tiny model, shared by the tests
let thinking // the tiny model with the thinking template
let model
before(async () => {
  session = await Session.load(modelDir())
  model = createMlex({ session })('tiny')
  const dir = mkdtempSync(join(tmpdir(), 'mlex-ai-think-'))
  cpSync(modelDir(), dir, { recursive: true })
  const cfgPath = join(dir, 'tokenizer_config.json')
  writeFileSync(cfgPath, JSON.stringify({ ...JSON.parse(readFileSync(cfgPath, 'utf8')), chat_template: THINK_TEMPLATE }))
  thinking = await Session.load(dir)
})
after(async () => {
  await session?.close()
  await thinking?.close()
  await smol?.close()
})

/** Every part of a doStream call. */
async function streamParts(m, options) {
  const { stream } = await m.doStream(options)
  const parts = []
  for await (const part of stream) parts.push(part)
  return parts
}

const userPrompt = (text) => [{ role: 'user', content: [{ type: 'text', text }] }]

test('the provider: a v4 language model over a session, or one it loads and owns', async () => {
  assert.equal(model.specificationVersion, 'v4')
  assert.equal(model.provider, 'mlex')
  assert.equal(model.modelId, 'tiny')
  assert.deepEqual(model.supportedUrls, {})
  assert.ok(model instanceof MlexLanguageModel)
  assert.equal(mlex(session).modelId, session.info.path)
  assert.throws(() => mlex.embeddingModel('x'), (e) => NoSuchModelError.isInstance(e))

  const owner = createMlex({ model: modelDir() })
  const owned = owner()
  assert.equal(owned.modelId, modelDir())
  const { text } = await generateText({ model: owned, prompt: 'Hi', maxOutputTokens: 3 })
  assert.equal(typeof text, 'string')
  const loaded = await owned.getSession()
  assert.equal(owner('another/dir').modelId, 'another/dir')
  await owner.close()
  assert.equal(loaded.closed, true, 'close() frees the sessions the provider loaded')
  assert.equal(session.closed, false)

  await assert.rejects(generateText({ model: mlex('/nonexistent/mlex-model'), prompt: 'x' }), (e) => {
    assert.ok(NoSuchModelError.isInstance(e), e.message)
    assert.equal(e.code, 'MODEL_NOT_FOUND')
    return true
  })
})

test('generateText: greedy text, finish reason and usage match the session\'s own reply', async () => {
  const direct = await session.generate([{ role: 'user', content: 'Hello' }], { maxTokens: 12 })
  const r = await generateText({ model, prompt: 'Hello', maxOutputTokens: 12, temperature: 0 })
  assert.equal(r.text, direct.text)
  assert.equal(r.rawFinishReason, direct.finishReason)
  assert.equal(r.finishReason, { stop: 'stop', length: 'length' }[direct.finishReason])
  assert.equal(r.usage.inputTokens, direct.usage.promptTokens)
  assert.equal(r.usage.outputTokens, direct.usage.completionTokens)
  assert.equal(r.usage.totalTokens, direct.usage.promptTokens + direct.usage.completionTokens)
  assert.equal(r.usage.outputTokenDetails.reasoningTokens, 0)
  assert.equal(r.usage.inputTokenDetails.cacheReadTokens + r.usage.inputTokenDetails.noCacheTokens, r.usage.inputTokens)
  assert.equal(r.usage.raw.completionTokens, direct.usage.completionTokens)
  assert.equal(r.response.modelId, 'tiny')
  assert.deepEqual(r.warnings, [])
})

test('streamText: the text deltas add up to generateText\'s text; same usage and finish', async () => {
  const settings = { model, prompt: 'Tell me something.', maxOutputTokens: 16, temperature: 0, providerOptions: { mlex: { ignoreEos: true } } }
  const whole = await generateText(settings)
  const streamed = streamText(settings)
  const deltas = []
  for await (const delta of streamed.textStream) deltas.push(delta)
  assert.ok(deltas.length > 1, 'several deltas')
  assert.equal(deltas.join(''), whole.text)
  assert.equal(await streamed.text, whole.text)
  assert.equal(await streamed.finishReason, 'length')
  assert.equal((await streamed.usage).outputTokens, 16)
  assert.equal((await streamed.usage).inputTokens, whole.usage.inputTokens)
})

test('doStream: the v4 parts in order (stream-start, metadata, one text block, finish with usage)', async () => {
  const parts = await streamParts(model, { prompt: userPrompt('Hi'), maxOutputTokens: 6, providerOptions: { mlex: { ignoreEos: true } }, includeRawChunks: true })
  const types = parts.map((p) => p.type).filter((t) => t !== 'raw')
  assert.deepEqual(types.slice(0, 3), ['stream-start', 'response-metadata', 'text-start'])
  assert.deepEqual(types.slice(-2), ['text-end', 'finish'])
  assert.ok(types.slice(3, -2).every((t) => t === 'text-delta'), types.join(' '))
  assert.equal(parts.filter((p) => p.type === 'raw').length, 6, 'includeRawChunks: one raw part per token')
  const ids = new Set(parts.filter((p) => p.type.startsWith('text-')).map((p) => p.id))
  assert.equal(ids.size, 1)
  const finish = parts.at(-1)
  assert.deepEqual(finish.finishReason, { unified: 'length', raw: 'length' })
  assert.equal(finish.usage.outputTokens.total, 6)
  assert.equal(finish.usage.outputTokens.text, 6)
  assert.ok(finish.usage.inputTokens.total > 0)
})

test('reasoning: thinking tokens become reasoning parts, the same streamed and whole', async () => {
  const m = mlex(thinking)
  const settings = { model: m, prompt: 'Think.', maxOutputTokens: 20, providerOptions: { mlex: { ignoreEos: true, reasoningBudgetTokens: 3 } } }
  const whole = await generateText(settings)
  assert.ok(whole.reasoningText.length > 0)
  assert.ok(!whole.text.includes('think>'))
  // 3 budgeted tokens, then the closer's tokens (also reasoning): 20 in all.
  assert.ok(whole.usage.outputTokenDetails.reasoningTokens > 3, JSON.stringify(whole.usage))
  assert.equal(whole.usage.outputTokenDetails.textTokens + whole.usage.outputTokenDetails.reasoningTokens, 20)

  const streamed = streamText(settings)
  let reasoning = ''
  let text = ''
  const order = []
  for await (const part of streamed.fullStream) {
    if (part.type === 'reasoning-delta') reasoning += part.text
    if (part.type === 'text-delta') text += part.text
    if (/^(reasoning|text)-(start|end)$/.test(part.type)) order.push(part.type)
  }
  assert.equal(reasoning, whole.reasoningText)
  assert.equal(text, whole.text)
  assert.deepEqual(order, ['reasoning-start', 'reasoning-end', 'text-start', 'text-end'])
})

test('abort: an AbortSignal stops generateText and streamText; the session keeps serving', async () => {
  const long = { prompt: 'Go on forever.', maxOutputTokens: 1_000_000, providerOptions: { mlex: { ignoreEos: true } } }
  await assert.rejects(generateText({ model, ...long, abortSignal: AbortSignal.abort() }), (e) => e.name === 'AbortError')
  const started = Date.now()
  await assert.rejects(generateText({ model, ...long, abortSignal: AbortSignal.timeout(100) }), (e) => e.name === 'TimeoutError')
  assert.ok(Date.now() - started < 10_000, 'stopped long before a million tokens')

  const controller = new AbortController()
  let aborted = false
  const s = streamText({ model, ...long, abortSignal: controller.signal, onAbort: () => { aborted = true } })
  const types = []
  let deltas = 0
  for await (const part of s.fullStream) {
    types.push(part.type)
    if (part.type === 'text-delta' && ++deltas === 5) controller.abort()
  }
  assert.equal(types.at(-1), 'abort')
  assert.ok(aborted, 'onAbort ran')

  const after = await generateText({ model, prompt: 'Still there?', maxOutputTokens: 4 })
  assert.ok(after.usage.outputTokens > 0)
})

test('structured output: a zod schema holds every reply (Output.object and generateObject)', async () => {
  const schema = z.object({
    city: z.string().max(8),
    sunny: z.boolean(),
    rating: z.number().int().min(1).max(5),
    tags: z.array(z.enum(['warm', 'cold', 'wet'])).max(2),
  })
  const prompts = ['Weather in Paris?', 'Weather in Oslo?', 'Weather at sea?', 'Anything.']
  const replies = await Promise.all(
    prompts.map((prompt, i) => generateText({ model, prompt, output: Output.object({ schema }), maxOutputTokens: 120, temperature: 1, seed: i })),
  )
  for (const r of replies) {
    assert.deepEqual(schema.parse(r.output), r.output)
    assert.equal(r.finishReason, 'stop')
  }
  const { object } = await generateObject({ model, schema, prompt: 'One more.', maxOutputTokens: 120 })
  assert.deepEqual(schema.parse(object), object)

  // JSON without a schema: any object.
  const parts = await streamParts(model, { prompt: userPrompt('JSON please'), maxOutputTokens: 60, responseFormat: { type: 'json' } })
  const json = parts.filter((p) => p.type === 'text-delta').map((p) => p.delta).join('')
  assert.equal(parts.at(-1).finishReason.unified, 'stop')
  assert.equal(typeof JSON.parse(json), 'object', json)
})

/** A tool with small integer arguments, and the two-step loop the tests run with it. */
function toolLoop(m, run, extra = {}) {
  const calls = []
  const tools = {
    add: tool({
      description: 'Adds two digits.',
      inputSchema: z.object({ a: z.number().int().min(0).max(9), b: z.number().int().min(0).max(9) }),
      execute: async ({ a, b }) => {
        calls.push({ a, b })
        return { sum: a + b }
      },
    }),
  }
  const result = run({
    model: m,
    prompt: 'What is 2 plus 3? Use the add tool.',
    tools,
    // The first step must call the tool (mlex holds the call to the schema); the second must not.
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? { type: 'tool', toolName: 'add' } : 'none' }),
    stopWhen: stepCountIs(2),
    maxOutputTokens: 100,
    temperature: 0,
    ...extra,
  })
  return { calls, result }
}

function checkToolLoop(steps, calls) {
  assert.equal(steps.length, 2)
  assert.equal(steps[0].finishReason, 'tool-calls')
  assert.equal(steps[0].toolCalls.length, 1)
  assert.equal(steps[0].toolCalls[0].toolName, 'add')
  assert.equal(calls.length, 1, 'execute ran once')
  assert.deepEqual(steps[0].toolCalls[0].input, calls[0])
  assert.deepEqual(steps[0].toolResults[0].output, { sum: calls[0].a + calls[0].b })
  assert.equal(steps[1].toolCalls.length, 0)
  assert.notEqual(steps[1].finishReason, 'tool-calls')
}

test('a two-step tool loop: a call forced by toolChoice, its execute, then text with toolChoice none', async () => {
  const { calls, result } = toolLoop(model, generateText)
  const r = await result
  checkToolLoop(r.steps, calls)
  assert.equal(r.text, r.steps[1].text)

  // The same loop streamed: the call's input parts, then the call, then the next step's text.
  const streamed = toolLoop(model, streamText)
  const types = []
  for await (const part of streamed.result.fullStream) types.push(part.type)
  checkToolLoop(await streamed.result.steps, streamed.calls)
  const at = (t) => types.indexOf(t)
  assert.ok(at('tool-input-start') < at('tool-input-delta') && at('tool-input-delta') < at('tool-input-end'), types.join(' '))
  assert.ok(at('tool-input-end') < at('tool-call') && at('tool-call') < at('tool-result'), types.join(' '))
  assert.ok(types.lastIndexOf('start-step') > at('tool-result'))
})

test('the prompt: system, assistant tool calls, reasoning and tool results reach mlex in its shape', async () => {
  const r = await generateText({
    model,
    system: 'Be brief.',
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'Weather in ' }, { type: 'text', text: 'Paris?' }] },
      {
        role: 'assistant',
        content: [
          { type: 'reasoning', text: 'Look it up.' },
          { type: 'text', text: 'Checking.' },
          { type: 'tool-call', toolCallId: 'call_1', toolName: 'weather', input: { city: 'Paris' } },
        ],
      },
      { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call_1', toolName: 'weather', output: { type: 'json', value: { sky: 'sunny' } } }] },
      { role: 'user', content: [{ type: 'text', text: 'And ' }, { type: 'file', mediaType: 'text/plain', data: Buffer.from('this file') }] },
    ],
    maxOutputTokens: 4,
    include: { requestBody: true },
  })
  assert.deepEqual(r.request.body.messages, [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Weather in Paris?' },
    {
      role: 'assistant',
      content: 'Checking.',
      reasoning: 'Look it up.',
      toolCalls: [{ id: 'call_1', type: 'function', function: { name: 'weather', arguments: '{"city":"Paris"}' } }],
    },
    { role: 'tool', toolCallId: 'call_1', name: 'weather', content: '{"sky":"sunny"}' },
    { role: 'user', content: 'And this file' },
  ])
  // Sampling settings map to mlex's options; those mlex lacks come back as warnings.
  const w = await generateText({
    model,
    prompt: 'x',
    maxOutputTokens: 3,
    temperature: 0.5,
    topP: 0.9,
    topK: 20,
    seed: 7,
    stopSequences: ['\n\n'],
    presencePenalty: 0.5,
    frequencyPenalty: 0.5,
    include: { requestBody: true },
  })
  const opts = w.request.body.options
  assert.deepEqual([opts.maxTokens, opts.temperature, opts.topP, opts.topK, opts.seed, opts.stop], [3, 0.5, 0.9, 20, 7, ['\n\n']])
  assert.deepEqual(w.warnings.map((x) => [x.type, x.feature]), [['unsupported', 'presencePenalty'], ['unsupported', 'frequencyPenalty']])
  // Images reach mlex as image parts; this model has no vision tower, so mlex refuses them.
  await assert.rejects(
    generateText({ model, messages: [{ role: 'user', content: [{ type: 'image', image: new Uint8Array([1, 2, 3]), mediaType: 'image/png' }] }] }),
    (e) => APICallError.isInstance(e) && e.code === 'INVALID_ARGUMENT' && /takes no images/.test(e.message),
  )
  // Remote image URLs are not fetched.
  await assert.rejects(
    generateText({ model, messages: [{ role: 'user', content: [{ type: 'image', image: new URL('https://example.com/a.png') }] }] }),
    (e) => UnsupportedFunctionalityError.isInstance(e) || /example\.com/.test(e.message),
  )
})

test('errors: mlex refusals surface as non-retryable APICallErrors carrying mlex\'s code', async () => {
  const check = (e) => {
    assert.ok(APICallError.isInstance(e), `${e.name}: ${e.message}`)
    assert.equal(e.code, 'INVALID_ARGUMENT')
    assert.equal(e.data.code, 'INVALID_ARGUMENT')
    assert.equal(e.isRetryable, false)
    assert.equal(e.cause.code, 'INVALID_ARGUMENT')
    return true
  }
  await assert.rejects(generateText({ model, prompt: 'x', temperature: -1 }), (e) => check(e) && /temperature/.test(e.message))
  await assert.rejects(generateText({ model, prompt: 'x', providerOptions: { mlex: { nope: 1 } } }), (e) => check(e) && /unknown option "nope"/.test(e.message))
  // Streaming: the refusal comes as an error part, and onError sees it.
  const seen = []
  const s = streamText({ model, prompt: 'x', temperature: -1, onError: ({ error }) => { seen.push(error) } })
  const errors = []
  for await (const part of s.fullStream) if (part.type === 'error') errors.push(part.error)
  assert.equal(errors.length, 1)
  check(errors[0])
  assert.equal(seen.length, 1)
})

// ---------------------------------------------------------------------------------------------
// SmolLM2-135M-Instruct (real weights), converted from its GGUF with the mlex CLI once per process.
// ---------------------------------------------------------------------------------------------

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const gguf = process.env.MLEX_SMOLLM2_GGUF ?? join(homedir(), '.cache/mlex/models/SmolLM2-135M-Instruct.Q4_1.gguf')
const host = (() => {
  try {
    return execFileSync('rustc', ['-vV']).toString().match(/^host: (.+)$/m)[1]
  } catch {
    return null
  }
})()
const bin = host && [join(root, 'target', host, 'debug', 'mlex'), join(root, 'target', host, 'release', 'mlex')].find(existsSync)
const smolMissing = !existsSync(gguf) ? `no SmolLM2 GGUF at ${gguf} (scripts/fetch-smollm2.sh, or MLEX_SMOLLM2_GGUF)` : !bin ? 'no mlex CLI binary to convert the GGUF (cargo build)' : null

let smol
let smolLoading
/** The converted SmolLM2 session (converted and loaded on first use). */
function smolSession() {
  smolLoading ??= (async () => {
    const out = join(mkdtempSync(join(tmpdir(), 'mlex-ai-smollm2-')), 'SmolLM2-135M-Instruct')
    await promisify(execFile)(bin, ['convert', '--gguf', gguf, '--out', out])
    smol = await Session.load(out)
    return smol
  })()
  return smolLoading
}

test('SmolLM2: generateObject returns a zod-validated object', async (t) => {
  if (smolMissing) return t.skip(smolMissing)
  const m = mlex(await smolSession())
  const schema = z.object({ name: z.string().max(30), age: z.number().int().min(0).max(120), hobbies: z.array(z.string().max(20)).max(3) })
  const { object, finishReason } = await generateObject({ model: m, schema, prompt: 'Invent a person.', maxOutputTokens: 80 })
  assert.equal(finishReason, 'stop')
  assert.deepEqual(schema.parse(object), object)
  assert.ok(object.name.length > 0)
})

test('SmolLM2: the forced two-step tool loop answers from the tool result', async (t) => {
  if (smolMissing) return t.skip(smolMissing)
  const m = mlex(await smolSession())
  const calls = []
  const r = await generateText({
    model: m,
    prompt: 'What is the weather in Paris?',
    tools: {
      get_weather: tool({
        description: 'The weather of a city.',
        inputSchema: z.object({ city: z.string().max(30) }),
        execute: async ({ city }) => {
          calls.push(city)
          return { city, sky: 'sunny', celsius: 21 }
        },
      }),
    },
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? { type: 'tool', toolName: 'get_weather' } : 'none' }),
    stopWhen: stepCountIs(2),
    maxOutputTokens: 60,
    temperature: 0,
  })
  assert.equal(r.steps.length, 2)
  assert.equal(r.steps[0].finishReason, 'tool-calls')
  assert.equal(calls.length, 1)
  assert.match(calls[0], /paris/i)
  assert.equal(r.steps[1].toolCalls.length, 0)
  assert.ok(r.text.trim().length > 0, 'an answer after the tool result')
})
