// Audio content parts (issue 15) through the Node API: refused, naming the part, by a model
// without an audio tower; and, when the mlx-vlm oracle venv is at hand (as for the Rust tests), a
// Gemma 4 checkpoint with an audio tower (tests/oracle/gemma4_audio.py) that reports
// supportsAudio and answers a prompt holding a WAV with mlx-vlm's 32 greedy tokens.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, writeFileSync, copyFileSync, existsSync } from 'node:fs'
import { join, dirname, resolve } from 'node:path'
import { tmpdir } from 'node:os'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { Session } from 'mlex'
import { modelDir, rejectsWithCode } from './helpers.mjs'
import { byteToUnicode } from './fixtures.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')

let session
before(async () => {
  session = await Session.load(modelDir(), { device: 'cpu' })
})
after(async () => {
  await session?.close()
})

test('a model without an audio tower refuses audio parts, naming them', async () => {
  assert.equal(session.info.supportsAudio, false)
  const wav = new Uint8Array(readFileSync(join(root, 'tests/fixtures/audio_tone.mp3')))
  const ask = (part) => session.generate([{ role: 'user', content: [{ type: 'text', text: 'hear this' }, part] }], { maxTokens: 2 })
  await rejectsWithCode(assert, () => ask({ type: 'audio', audio: wav }), 'INVALID_ARGUMENT', /message 0 holds an audio part, and this model takes no audio/)
  const b64 = Buffer.from(wav).toString('base64')
  await rejectsWithCode(assert, () => ask({ type: 'input_audio', input_audio: { data: b64, format: 'mp3' } }), 'INVALID_ARGUMENT', /takes no audio/)
  await rejectsWithCode(assert, () => ask({ type: 'input_audio', input_audio: { data: b64, format: 'ogg' } }), 'INVALID_ARGUMENT', /content part 1 \(audio\): input_audio format "ogg" is not taken/)
  await rejectsWithCode(assert, () => ask({ type: 'audio', audio: 'https://example.com/a.wav' }), 'INVALID_ARGUMENT', /remote audio URLs are not fetched/)
  await rejectsWithCode(assert, () => ask({ type: 'audio', audio: '/no/such/clip.wav' }), 'INVALID_ARGUMENT', /\/no\/such\/clip\.wav/)
})

/** A byte-level tokenizer over the oracle model's 320 ids with Gemma 4's image and audio tokens. */
function writeGemma4Tokenizer(dir) {
  const vocab = {}
  byteToUnicode().forEach((ch, i) => { vocab[ch] = i })
  const specials = { 300: '<|image|>', 301: '<|image>', 302: '<image|>', 303: '<|audio|>', 304: '<|video|>', 305: '<bos>', 306: '<eos>', 307: '<|audio>', 308: '<audio|>' }
  const added = []
  for (let id = 256; id < 320; id++) {
    const content = specials[id] ?? `<unused_${id}>`
    vocab[content] = id
    added.push({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })
  }
  const tok = {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null, decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [] },
  }
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tok))
  const template = "{{ bos_token }}{% for message in messages %}{% for item in message['content'] %}" +
    "{% if item['type'] == 'image' %}<|image|>{% elif item['type'] == 'audio' %}<|audio|>" +
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endfor %}"
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ bos_token: '<bos>', eos_token: '<eos>', chat_template: template }))
}

// The oracle venv as the Rust tests find it: $MLEX_ORACLE_VENV, else .venv-oracle at the root
// (scripts/setup-oracle.sh); under CI its absence is a failure, not a skip.
const venvDir = process.env.MLEX_ORACLE_VENV ? resolve(root, process.env.MLEX_ORACLE_VENV) : join(root, '.venv-oracle')
const python = ['bin/python', 'bin/python3'].map((p) => join(venvDir, p)).find(existsSync)
const ci = !!process.env.CI && process.env.CI !== '0' && process.env.CI.toLowerCase() !== 'false'
test('a Gemma 4 checkpoint with an audio tower answers a WAV as mlx-vlm does', { skip: !python && !ci && 'no oracle venv (run scripts/setup-oracle.sh or set MLEX_ORACLE_VENV)' }, async () => {
  assert.ok(python, 'CI is set and the oracle venv is missing')
  const out = mkdtempSync(join(tmpdir(), 'mlex-audio-oracle-'))
  const run = spawnSync(python, [join(root, 'tests/oracle/gemma4_audio.py'), out], { encoding: 'utf8' })
  assert.equal(run.status, 0, run.stderr)
  const line = run.stdout.split('\n').find((l) => l.startsWith('gemma4_audio:'))
  const want = JSON.parse(line.match(/tokens (\[[^\]]*\])/)[1])
  const promptTokens = Number(line.match(/: (\d+) prompt ids/)[1])
  const dir = mkdtempSync(join(tmpdir(), 'mlex-audio-model-'))
  for (const f of ['config.json', 'processor_config.json', 'model.safetensors']) copyFileSync(join(out, f), join(dir, f))
  writeGemma4Tokenizer(dir)
  assert.ok(existsSync(join(out, 'clip.wav')))
  const s = await Session.load(dir, { device: 'cpu' })
  try {
    assert.equal(s.info.supportsAudio, true)
    assert.equal(s.info.supportsImages, true)
    const wav = new Uint8Array(readFileSync(join(out, 'clip.wav')))
    const parts = (clip) => [{ type: 'text', text: 'listen: ' }, clip, { type: 'text', text: ' what is it?' }]
    for (const clip of [{ type: 'audio', audio: wav }, { type: 'input_audio', input_audio: { data: Buffer.from(wav).toString('base64'), format: 'wav' } }, { type: 'audio', audio: join(out, 'clip.wav') }]) {
      const reply = await s.generate([{ role: 'user', content: parts(clip) }], { maxTokens: want.length, ignoreEos: true })
      assert.equal(reply.usage.promptTokens, promptTokens)
      assert.deepEqual(reply.tokens, want)
    }
    await rejectsWithCode(assert, () => s.generate([{ role: 'user', content: parts({ type: 'audio', audio: new Uint8Array([1, 2, 3, 4]) }) }], { maxTokens: 2 }),
      'INVALID_ARGUMENT', /the audio \(media part 1 of the conversation\): the audio is not WAV, FLAC or MP3/)
  } finally {
    await s.close()
  }
})
