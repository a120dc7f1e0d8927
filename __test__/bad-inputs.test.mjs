// A corpus of bad inputs through the Node API (issue 16 item 4): broken checkpoints, bad arguments,
// bad chat messages, bad tool schemas, callbacks that throw. Each case asserts the exact error code
// and that the message names the cause (file, field, option or tensor). The table is written out
// as docs/bad-inputs.md: this test fails when that file is not what the table says
// (MLEX_WRITE_DOCS=1 rewrites it).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { cpSync, mkdtempSync, readFileSync, writeFileSync, rmSync, truncateSync, statSync, existsSync } from 'node:fs'
import { join } from 'node:path'
import { tmpdir } from 'node:os'
import { Session, parseToolCalls } from 'mlex'
import { modelDir, user } from './helpers.mjs'

const root = new URL('..', import.meta.url).pathname
const u = user('hi')
const fn = (name, parameters) => ({ type: 'function', function: { name, ...(parameters === undefined ? {} : { parameters }) } })
const call = (id, name = 'f', args = '{}') => ({ id, type: 'function', function: { name, arguments: args } })

// ---- checkpoints: a copy of the tiny model with one thing broken
let scratch
function broken(mutate) {
  scratch ??= mkdtempSync(join(tmpdir(), 'mlex-bad-'))
  const dir = mkdtempSync(join(scratch, 'ckpt-'))
  cpSync(modelDir(), dir, { recursive: true })
  mutate(dir)
  return dir
}
const editJson = (file, f) => (dir) => {
  const p = join(dir, file)
  const v = JSON.parse(readFileSync(p, 'utf8'))
  f(v)
  writeFileSync(p, JSON.stringify(v))
}
/** Rewrites the safetensors header with `f(header)` (data unchanged). */
const editHeader = (f) => (dir) => {
  const p = join(dir, 'model.safetensors')
  const buf = readFileSync(p)
  const n = Number(buf.readBigUInt64LE(0))
  const header = JSON.parse(buf.subarray(8, 8 + n).toString())
  f(header)
  let json = JSON.stringify(header)
  json += ' '.repeat((8 - (json.length % 8)) % 8)
  const head = Buffer.alloc(8)
  head.writeBigUInt64LE(BigInt(json.length))
  writeFileSync(p, Buffer.concat([head, Buffer.from(json), buf.subarray(8 + n)]))
}
const load = (mutate, options) => () => Session.load(broken(mutate), options)
const generateWith = (mutate) => async () => {
  const s = await Session.load(broken(mutate))
  try {
    return await s.generate(u, { maxTokens: 2 })
  } finally {
    await s.close()
  }
}

// [area, case, run(session), code, what the message must say]
const CASES = [
  // checkpoints
  ['checkpoint', 'no config.json', load((d) => rmSync(join(d, 'config.json'))), 'MODEL_NOT_FOUND', /config\.json/],
  ['checkpoint', 'config.json is not JSON', load((d) => writeFileSync(join(d, 'config.json'), '{ "model_type": ')), 'INVALID_CHECKPOINT', /config\.json/],
  ['checkpoint', 'config.json: hidden_size missing', load(editJson('config.json', (c) => delete c.hidden_size)), 'INVALID_CHECKPOINT', /hidden_size/],
  ['checkpoint', 'config.json: num_hidden_layers a string', load(editJson('config.json', (c) => { c.num_hidden_layers = 'two' })), 'INVALID_CHECKPOINT', /num_hidden_layers/],
  ['checkpoint', 'config.json: unknown model_type', load(editJson('config.json', (c) => { c.model_type = 'llama99' })), 'INVALID_CHECKPOINT', /llama99/],
  ['checkpoint', 'config.json: unknown quantization mode', load(editJson('config.json', (c) => { c.quantization = { group_size: 64, bits: 4, mode: 'int4_made_up' } })), 'INVALID_CHECKPOINT', /int4_made_up/],
  ['checkpoint', 'config.json: heads do not divide hidden size', load(editJson('config.json', (c) => { c.num_attention_heads = 5; delete c.head_dim })), 'INVALID_CHECKPOINT', /num_attention_heads|head/],
  ['checkpoint', 'safetensors truncated in the data', load((d) => truncateSync(join(d, 'model.safetensors'), statSync(join(d, 'model.safetensors')).size - 1000)), 'INVALID_CHECKPOINT', /model\.safetensors/],
  ['checkpoint', 'safetensors truncated in the header', load((d) => truncateSync(join(d, 'model.safetensors'), 20)), 'INVALID_CHECKPOINT', /model\.safetensors/],
  ['checkpoint', 'safetensors of zero bytes', load((d) => truncateSync(join(d, 'model.safetensors'), 0)), 'INVALID_CHECKPOINT', /model\.safetensors/],
  ['checkpoint', 'safetensors header not JSON', load((d) => { const p = join(d, 'model.safetensors'); const b = readFileSync(p); b.write('!', 8); writeFileSync(p, b) }), 'INVALID_CHECKPOINT', /model\.safetensors/],
  ['checkpoint', 'tensor missing', load(editHeader((h) => delete h['model.layers.1.mlp.up_proj.weight'])), 'INVALID_CHECKPOINT', /model\.layers\.1\.mlp\.up_proj\.weight/],
  ['checkpoint', 'tensor of the wrong shape', load(editHeader((h) => { h['model.norm.weight'].shape = [32, 2] })), 'INVALID_CHECKPOINT', /model\.norm\.weight/],
  ['checkpoint', 'tensor of an unknown dtype', load(editHeader((h) => { h['model.norm.weight'].dtype = 'F12' })), 'INVALID_CHECKPOINT', /F12|model\.norm\.weight/],
  ['checkpoint', 'tensor dtype size disagrees with its bytes', load(editHeader((h) => { h['model.norm.weight'].dtype = 'F16' })), 'INVALID_CHECKPOINT', /model\.norm\.weight/],
  ['checkpoint', 'tensor offsets past the end of the file', load(editHeader((h) => { h['lm_head.weight'].data_offsets = [0, 1 << 30] })), 'INVALID_CHECKPOINT', /lm_head\.weight/],
  ['checkpoint', 'no weights file', load((d) => rmSync(join(d, 'model.safetensors'))), 'INVALID_CHECKPOINT', /safetensors|weights/],
  ['checkpoint', 'tokenizer.json is not JSON', load((d) => writeFileSync(join(d, 'tokenizer.json'), '{"model": ')), 'INVALID_CHECKPOINT', /tokenizer/],
  ['checkpoint', 'tokenizer.json without a model', load(editJson('tokenizer.json', (t) => delete t.model)), 'INVALID_CHECKPOINT', /tokenizer/],
  ['checkpoint', 'chat template that does not parse', generateWith(editJson('tokenizer_config.json', (t) => { t.chat_template = '{% for m in messages %}{{ m.content ' })), 'INVALID_CHECKPOINT', /template/],
  ['checkpoint', 'chat template chaining 100,000 operators', generateWith(editJson('tokenizer_config.json', (t) => { t.chat_template = `{{ 1${' + 1'.repeat(100_000)} }}` })), 'INVALID_CHECKPOINT', /chains 100000 operators/],
  ['checkpoint', 'chat template that raises', generateWith(editJson('tokenizer_config.json', (t) => { t.chat_template = "{{ raise_exception('no system role here') }}" })), 'INVALID_CHECKPOINT', /no system role here/],

  // load options
  ['load options', 'model an empty string', () => Session.load(''), 'INVALID_ARGUMENT', /model must be a non-empty string/],
  ['load options', 'model a number', () => Session.load(3), 'INVALID_ARGUMENT', /model must be a non-empty string/],
  ['load options', 'model a path that does not exist', () => Session.load('/nonexistent/mlex-model'), 'MODEL_NOT_FOUND', /\/nonexistent\/mlex-model/],
  ['load options', 'device tpu', () => Session.load(modelDir(), { device: 'tpu' }), 'INVALID_ARGUMENT', /device must be 'gpu' or 'cpu', got "tpu"/],
  ['load options', 'dtype int3', () => Session.load(modelDir(), { dtype: 'int3' }), 'INVALID_ARGUMENT', /dtype must be .*"int3"/],
  ['load options', 'unknown option', () => Session.load(modelDir(), { devise: 'cpu' }), 'INVALID_ARGUMENT', /unknown option "devise"/],
  ['load options', 'maxBatch 0', () => Session.load(modelDir(), { maxBatch: 0 }), 'INVALID_ARGUMENT', /maxBatch must be at least 1/],
  ['load options', 'promptCache.maxEntries -1', () => Session.load(modelDir(), { promptCache: { maxEntries: -1 } }), 'INVALID_ARGUMENT', /promptCache\.maxEntries must be a non-negative integer/],
  ['load options', 'unknown promptCache option', () => Session.load(modelDir(), { promptCache: { size: 3 } }), 'INVALID_ARGUMENT', /unknown option promptCache\."size"/],
  ['load options', 'kvBudgetBytes -5', () => Session.load(modelDir(), { kvBudgetBytes: -5 }), 'INVALID_ARGUMENT', /kvBudgetBytes must be a non-negative integer/],
  ['load options', 'int8Activations a string', () => Session.load(modelDir(), { int8Activations: 'yes' }), 'INVALID_ARGUMENT', /int8Activations must be true or false, got "yes"/],
  ['load options', 'onProgress not a function', () => Session.load(modelDir(), { onProgress: 'yes' }), 'INVALID_ARGUMENT', /onProgress must be a function/],

  // generate options
  ['generate options', 'options an array', (s) => s.generate(u, []), 'INVALID_ARGUMENT', /options must be an object/],
  ['generate options', 'unknown option', (s) => s.generate(u, { maxTokenz: 5 }), 'INVALID_ARGUMENT', /unknown option "maxTokenz"/],
  ['generate options', 'maxTokens -1', (s) => s.generate(u, { maxTokens: -1 }), 'INVALID_ARGUMENT', /maxTokens must be a non-negative integer, got -1/],
  ['generate options', 'maxTokens 1.5', (s) => s.generate(u, { maxTokens: 1.5 }), 'INVALID_ARGUMENT', /maxTokens must be a non-negative integer, got 1\.5/],
  ['generate options', 'maxTokens a string', (s) => s.generate(u, { maxTokens: '5' }), 'INVALID_ARGUMENT', /maxTokens must be a non-negative integer, got "5"/],
  ['generate options', 'maxTokens NaN', (s) => s.generate(u, { maxTokens: NaN }), 'INVALID_ARGUMENT', /maxTokens must be a finite number, got NaN/],
  ['generate options', 'temperature -1', (s) => s.generate(u, { temperature: -1 }), 'INVALID_ARGUMENT', /temperature must be >= 0, got -1/],
  ['generate options', 'temperature Infinity', (s) => s.generate(u, { temperature: Infinity }), 'INVALID_ARGUMENT', /temperature must be a finite number/],
  ['generate options', 'topP 2', (s) => s.generate(u, { topP: 2 }), 'INVALID_ARGUMENT', /topP must be in \(0, 1\], got 2/],
  ['generate options', 'topK -3', (s) => s.generate(u, { topK: -3 }), 'INVALID_ARGUMENT', /topK must be a non-negative integer, got -3/],
  ['generate options', 'minP 1.5', (s) => s.generate(u, { minP: 1.5 }), 'INVALID_ARGUMENT', /minP must be in \[0, 1\], got 1\.5/],
  ['generate options', 'repetitionPenalty 0', (s) => s.generate(u, { repetitionPenalty: 0 }), 'INVALID_ARGUMENT', /repetitionPenalty must be > 0, got 0/],
  ['generate options', 'seed a bigint', (s) => s.generate(u, { seed: 10n }), 'INVALID_ARGUMENT', /seed must be a number, got a bigint/],
  ['generate options', 'stop an array of numbers', (s) => s.generate(u, { stop: [5] }), 'INVALID_ARGUMENT', /stop must be an array of strings/],
  ['generate options', 'topLogprobs 100', (s) => s.generate(u, { topLogprobs: 100 }), 'INVALID_ARGUMENT', /topLogprobs must be in \[0, 20\], got 100/],
  ['generate options', 'signal not an AbortSignal', (s) => s.generate(u, { signal: {} }), 'INVALID_ARGUMENT', /signal must be an AbortSignal/],
  ['generate options', 'onToken not a function', (s) => s.generate(u, { onToken: 3 }), 'INVALID_ARGUMENT', /onToken must be a function/],
  ['generate options', 'responseFormat type xml', (s) => s.generate(u, { responseFormat: { type: 'xml' } }), 'INVALID_ARGUMENT', /responseFormat\.type must be .*"xml"/],
  ['generate options', 'responseFormat schema of an unknown type', (s) => s.generate(u, { responseFormat: { type: 'json_schema', schema: { type: 'no-such' } } }), 'INVALID_ARGUMENT', /response_format: .*no-such/],
  ['generate options', 'toolCallFormat unknown', (s) => s.generate(u, { toolCallFormat: 'yaml' }), 'INVALID_ARGUMENT', /toolCallFormat: unknown tool call format "yaml"/],
  ['generate options', 'a signal already aborted', (s) => s.generate(u, { signal: AbortSignal.abort() }), 'ABORTED', /aborted/],

  // chat messages
  ['messages', 'not an array', (s) => s.generate('hi'), 'INVALID_ARGUMENT', /messages must be an array/],
  ['messages', 'empty', (s) => s.generate([]), 'INVALID_ARGUMENT', /messages is empty/],
  ['messages', 'a null message', (s) => s.generate([null]), 'INVALID_ARGUMENT', /messages\[0\] must be an object/],
  ['messages', 'unknown role', (s) => s.generate([{ role: 'wizard', content: 'hi' }]), 'INVALID_ARGUMENT', /message 0: unknown message role "wizard"/],
  ['messages', 'no role', (s) => s.generate([{ content: 'hi' }]), 'INVALID_ARGUMENT', /message 0: missing "role"/],
  ['messages', 'role a number', (s) => s.generate([{ role: 3, content: 'hi' }]), 'INVALID_ARGUMENT', /message 0: "role" must be a string/],
  ['messages', 'content a number', (s) => s.generate([{ role: 'user', content: 42 }]), 'INVALID_ARGUMENT', /message 0: "content" must be a string/],
  ['messages', 'image bytes for a text-only model', (s) => s.generate([{ role: 'user', content: [{ type: 'image', image: new Uint8Array([137, 80, 78, 71]) }, { type: 'text', text: 'hi' }] }]), 'INVALID_ARGUMENT', /message 0 holds an image, and this model takes no images/],
  ['messages', 'image from a remote URL', (s) => s.generate([{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }] }]), 'INVALID_ARGUMENT', /message 0: content part 0: remote image URLs are not fetched/],
  ['messages', 'image file that does not exist', (s) => s.generate([{ role: 'user', content: [{ type: 'image', image: '/no/such/image.png' }] }]), 'INVALID_ARGUMENT', /\/no\/such\/image\.png/],
  ['messages', 'a video file (MP4: no video codecs; frames or an animated image are taken)', (s) => s.generate([{ role: 'user', content: [{ type: 'video', video: 'clip.mp4' }] }]), 'INVALID_ARGUMENT', /message 0: content part 0 \(video\): this is a MP4 video file, and mlex decodes no video codecs/],
  ['messages', 'video frames for a text-only model', (s) => s.generate([{ role: 'user', content: [{ type: 'video', video: [new Uint8Array([137, 80, 78, 71])] }, { type: 'text', text: 'hi' }] }]), 'INVALID_ARGUMENT', /message 0 holds a video part, and this model takes no video/],
  ['messages', 'audio bytes for a model without an audio tower', (s) => s.generate([{ role: 'user', content: [{ type: 'audio', audio: new Uint8Array([82, 73, 70, 70]) }, { type: 'text', text: 'hi' }] }]), 'INVALID_ARGUMENT', /message 0 holds an audio part, and this model takes no audio/],
  ['messages', 'audio from a remote URL', (s) => s.generate([{ role: 'user', content: [{ type: 'audio', audio: 'https://example.com/a.wav' }] }]), 'INVALID_ARGUMENT', /message 0: content part 0 \(audio\): remote audio URLs are not fetched/],
  ['messages', 'an unknown content part type', (s) => s.generate([{ role: 'user', content: [{ type: 'hologram', url: 'x' }] }]), 'INVALID_ARGUMENT', /message 0: unsupported content part type "hologram"/],
  ['messages', 'tool call without a function name', (s) => s.generate([...u, { role: 'assistant', content: '', toolCalls: [{ id: 'c1', type: 'function', function: { arguments: '{}' } }] }]), 'INVALID_ARGUMENT', /message 1: tool_calls\[0\]: missing function "name"/],
  ['messages', 'tool result for a call that was never made', (s) => s.generate([...u, { role: 'assistant', content: '', toolCalls: [call('c1')] }, { role: 'tool', toolCallId: 'zz', content: 'r' }]), 'INVALID_ARGUMENT', /message 2: tool_call_id "zz" matches no earlier tool call \(ids: c1\)/],
  ['messages', 'a message with a function value', (s) => s.generate([{ role: 'user', content: 'hi', extra: () => 1 }]), 'INVALID_ARGUMENT', /messages\.extra must not be a function/],
  ['messages', 'applyChatTemplate with a bad role', async (s) => s.applyChatTemplate([{ role: 'x', content: 'hi' }]), 'INVALID_ARGUMENT', /message 0: unknown message role "x"/],

  // tool schemas
  ['tools', 'tools not an array', (s) => s.generate(u, { tools: {} }), 'INVALID_ARGUMENT', /tools must be an array/],
  ['tools', 'a tool without a name', (s) => s.generate(u, { tools: [{ type: 'function', function: { parameters: {} } }] }), 'INVALID_ARGUMENT', /tool 0: invalid function definition: missing field `name`/],
  ['tools', 'an empty name', (s) => s.generate(u, { tools: [fn('')] }), 'INVALID_ARGUMENT', /tool 0: function "name" is empty/],
  ['tools', 'a tool of type retrieval', (s) => s.generate(u, { tools: [{ type: 'retrieval', function: { name: 'f' } }] }), 'INVALID_ARGUMENT', /tool 0: unsupported tool type "retrieval"/],
  ['tools', 'parameters a string', (s) => s.generate(u, { tools: [fn('f', 'x')] }), 'INVALID_ARGUMENT', /tool 0: function "f": "parameters" must be a JSON Schema object/],
  ['tools', 'two tools of one name', (s) => s.generate(u, { tools: [fn('f'), fn('g'), fn('f')] }), 'INVALID_ARGUMENT', /tool 2: duplicate tool name "f" \(tool 0 has it too\)/],
  ['tools', 'toolChoice names a tool not given', (s) => s.generate(u, { tools: [fn('f')], toolChoice: { type: 'function', function: { name: 'g' } } }), 'INVALID_ARGUMENT', /tool_choice names "g", which is not among the tools \(f\)/],
  ['tools', 'toolChoice sometimes', (s) => s.generate(u, { tools: [fn('f')], toolChoice: 'sometimes' }), 'INVALID_ARGUMENT', /toolChoice must be .*"sometimes"/],
  ['tools', 'toolChoice required without tools', (s) => s.generate(u, { toolChoice: 'required' }), 'INVALID_ARGUMENT', /tool_choice demands a tool call, but no tools were given/],
  ['tools', 'parseToolCalls of a number', async () => parseToolCalls(3), 'INVALID_ARGUMENT', /parseToolCalls: text must be a string, got number/],
  ['tools', 'parseToolCalls in format yaml', async () => parseToolCalls('x', 'yaml'), 'INVALID_ARGUMENT', /toolCallFormat: unknown tool call format "yaml"/],

  // tokens
  ['tokens', 'tokenize a number', async (s) => s.tokenize(3), 'INVALID_ARGUMENT', /text must be a string/],
  ['tokens', 'detokenize an id past the vocabulary', async (s) => s.detokenize([999999]), 'INVALID_ARGUMENT', /token id 999999 is outside the vocabulary/],
  ['tokens', 'detokenize a negative id', async (s) => s.detokenize([-1]), 'INVALID_ARGUMENT', /ids must be an array of non-negative integer token ids/],

  // callbacks that throw: the error rejects the call, the generation stops, the session goes on
  ['callbacks', 'onToken throws', (s) => s.generate(u, { maxTokens: 50, ignoreEos: true, onToken: () => { throw Object.assign(new Error('boom from onToken'), { code: 'E_CALLER' }) } }), 'E_CALLER', /boom from onToken/],
  ['callbacks', 'onToken throws a non-Error', (s) => s.generate(u, { maxTokens: 50, ignoreEos: true, onToken: () => { throw 'a string' } }), undefined, null],
  ['callbacks', 'onProgress throws', () => Session.load(modelDir(), { onProgress: () => { throw Object.assign(new Error('boom from onProgress'), { code: 'E_CALLER' }) } }), 'E_CALLER', /boom from onProgress/],
]

const pattern = (re) => (re ? re.source.replace(/\\(.)/g, '$1') : '(any)')

/** docs/bad-inputs.md as the table says. */
function renderDoc() {
  const serveCases = (readFileSync(join(root, '__test__/serve.test.mjs'), 'utf8').match(/\b(400|404|413)\]/g) || []).length
  const rows = CASES.map(([area, name, , code, re], i) =>
    `| ${i + 1} | ${area} | ${name} | ${code ?? '(the thrown value)'} | \`${pattern(re).replace(/\|/g, '\\|')}\` |`)
  return `# Bad inputs

What mlex answers to malformed checkpoints, arguments, messages and tool schemas. Every row is a
case of \`__test__/bad-inputs.test.mjs\` (through the Node package, so the napi boundary is crossed
each time): the call must reject (never throw synchronously, never crash the process) with
\`err.code\` as given and a message that matches the excerpt (a regular expression: it names the
file, field, option or tensor at fault). After the table has run, the session that served the
argument cases still generates. This file is checked by that test; \`MLEX_WRITE_DOCS=1 node --test
__test__/bad-inputs.test.mjs\` rewrites it.

Codes: \`MODEL_NOT_FOUND\` (no model there), \`INVALID_CHECKPOINT\` (a file of the checkpoint is
malformed: config.json, safetensors, tokenizer, chat template), \`INVALID_ARGUMENT\` (the caller's
options, messages, tools or token ids), \`OUT_OF_MEMORY\` (a request past the session's memory
budget: __test__/faults.test.mjs), \`ABORTED\`. An error thrown by a callback of the caller's
(\`onToken\`, \`onProgress\`) rejects the call with that very error.

${CASES.length} cases:

| # | area | case | code | message must match |
|---|------|------|------|--------------------|
${rows.join('\n')}

Elsewhere in the suite:
- \`tests/bad_input.rs\`: the same kinds of broken checkpoints and bad options through the Rust API
  (\`Error::InvalidCheckpoint\` naming the file and tensor or field; \`InvalidArgument\`).
- \`tests/bad_inputs.rs\`: a table of bad options, messages and tools through the Rust parsers
  (\`GenerateOptions::from_json\`, \`LoadOptions::from_json\`, \`parse_messages_json\`,
  \`parse_tools_json\`), exact code and message.
- \`__test__/serve.test.mjs\`: ${serveCases} malformed HTTP requests to \`mlex serve\` (bad JSON, wrong
  types, oversized bodies, bad schemas) answered with their 4xx status, not duplicated here.
- \`__test__/faults.test.mjs\`: memory budget, abort storms, exit and signals, worker threads.
`
}

test('docs/bad-inputs.md is the table of this test', () => {
  const path = join(root, 'docs/bad-inputs.md')
  const doc = renderDoc()
  if (process.env.MLEX_WRITE_DOCS === '1') writeFileSync(path, doc)
  assert.ok(existsSync(path), 'docs/bad-inputs.md is missing (MLEX_WRITE_DOCS=1 writes it)')
  assert.equal(readFileSync(path, 'utf8'), doc, 'docs/bad-inputs.md differs from the table (MLEX_WRITE_DOCS=1 rewrites it)')
})

test(`${CASES.length} bad inputs are refused with their code and a message that names the cause`, { timeout: 300_000 }, async () => {
  assert.ok(CASES.length >= 50)
  const s = await Session.load(modelDir())
  const reference = await s.generate(u, { maxTokens: 6, temperature: 0, ignoreEos: true })
  const failures = []
  try {
    for (const [area, name, run, code, re] of CASES) {
      const label = `${area}: ${name}`
      let p
      try {
        p = run(s)
      } catch (e) {
        failures.push(`${label}: threw synchronously (${e && e.code}: ${e && e.message})`)
        continue
      }
      if (!p || typeof p.then !== 'function') {
        failures.push(`${label}: did not return a promise`)
        continue
      }
      try {
        const r = await p
        failures.push(`${label}: succeeded (${JSON.stringify(r).slice(0, 100)})`)
      } catch (e) {
        if (code === undefined) {
          if (e !== 'a string') failures.push(`${label}: rejected with ${e}, not the thrown value`)
          continue
        }
        if (!(e instanceof Error)) failures.push(`${label}: rejected with a non-Error ${e}`)
        else if (e.code !== code) failures.push(`${label}: code ${e.code}, want ${code} (${e.message})`)
        else if (re && !re.test(e.message)) failures.push(`${label}: message ${JSON.stringify(e.message)} does not match ${re}`)
      }
    }
    assert.deepEqual(failures, [], failures.join('\n'))
    // Nothing above hurt the session: the same greedy reply as before.
    const after = await s.generate(u, { maxTokens: 6, temperature: 0, ignoreEos: true })
    assert.deepEqual(after.tokens, reference.tokens)
  } finally {
    await s.close()
    if (scratch) rmSync(scratch, { recursive: true, force: true })
  }
})

test('a throwing onToken stops the generation: no more tokens are computed for it', async () => {
  const s = await Session.load(modelDir())
  try {
    let calls = 0
    await assert.rejects(
      s.generate(u, { maxTokens: 100000, ignoreEos: true, onToken: () => { calls++; throw new Error('stop') } }),
      /stop/,
    )
    assert.equal(calls, 1)
    // The session is free at once: a short request does not wait behind 100000 tokens.
    const t0 = performance.now()
    const r = await s.generate(u, { maxTokens: 4, ignoreEos: true })
    assert.equal(r.tokens.length, 4)
    assert.ok(performance.now() - t0 < 10_000)
  } finally {
    await s.close()
  }
})
