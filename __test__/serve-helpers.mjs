// Shared by the `mlex serve` test files: the CLI binary the Rust build made, a running server on
// the tiny checkpoint (port 0, the address read from its "listening on" line), and a copy of the
// tiny checkpoint whose chat template opens a <think> span.
import assert from 'node:assert/strict'
import { spawn, execFileSync } from 'node:child_process'
import { existsSync, readFileSync, writeFileSync, mkdtempSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { tmpdir } from 'node:os'
import { fileURLToPath } from 'node:url'
import { modelDir } from './helpers.mjs'
import { writeTinyLlama } from './fixtures.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const host = execFileSync('rustc', ['-vV']).toString().match(/^host: (.+)$/m)[1]
/** The debug (else release) `mlex` binary, or undefined when neither was built. */
export const bin = [join(root, 'target', host, 'debug', 'mlex'), join(root, 'target', host, 'release', 'mlex')].find(existsSync)
export const KEY = 'test-key'

/**
 * Starts `mlex serve --api-key KEY` on the tiny model (as `tiny`) plus `models` ({ id: dir })
 * with the extra `args`; resolves to { proc, base, stop() } (stop: SIGTERM, and asserts a clean exit).
 */
export async function startServer(args = [], models = {}) {
  assert.ok(bin, `the mlex binary (cargo build --target ${host}) is needed`)
  const modelArgs = Object.entries({ tiny: modelDir(), ...models }).flatMap(([id, dir]) => ['--model', `${id}=${dir}`])
  const proc = spawn(bin, ['serve', ...modelArgs, '--port', '0', '--api-key', KEY, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
  const base = await new Promise((resolve, reject) => {
    let out = ''
    proc.stdout.on('data', (d) => {
      out += d
      const m = out.match(/listening on (http:\/\/\S+)/)
      if (m) resolve(m[1])
    })
    proc.on('exit', (code) => reject(new Error(`mlex serve exited with ${code}`)))
  })
  const stop = async () => {
    const exited = new Promise((resolve) => proc.on('exit', resolve))
    proc.kill('SIGTERM')
    assert.equal(await exited, 0, 'SIGTERM ends the server cleanly')
  }
  return { proc, base, stop }
}

/** A copy of the tiny checkpoint whose generation prompt ends with `opener` (e.g. "<think>\n"). */
export function thinkingModelDir(opener = '<think>\n') {
  const dir = writeTinyLlama(join(mkdtempSync(join(tmpdir(), 'mlex-think-')), 'think'))
  const cfgPath = join(dir, 'tokenizer_config.json')
  const cfg = JSON.parse(readFileSync(cfgPath, 'utf8'))
  cfg.chat_template = cfg.chat_template.replace('<|im_start|>assistant\n{% endif %}', `<|im_start|>assistant\n${opener}{% endif %}`)
  writeFileSync(cfgPath, JSON.stringify(cfg))
  return dir
}
