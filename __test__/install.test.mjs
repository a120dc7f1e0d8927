// The user's install: pack the main package and the linux-x64 CPU platform package, install the
// tarballs into a fresh project outside the repository with no registry (an empty npm cache,
// --offline) and no toolchain on the PATH (only node and npm), then load a tiny checkpoint and
// stream a reply from ESM and from CommonJS.
//
// Needs the addon built first (`npm run build` or `npm run build:debug`); scripts/build-npm.sh
// then assembles the platform package. Set MLEX_SKIP_INSTALL_TEST=1 to skip (CI must not).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, mkdirSync, writeFileSync, symlinkSync, readdirSync, realpathSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { tmpdir } from 'node:os'
import { modelDir } from './helpers.mjs'

const root = realpathSync(new URL('..', import.meta.url).pathname)
const addon = join(root, 'mlex.linux-x64-gnu.node')
const skip =
  process.env.MLEX_SKIP_INSTALL_TEST === '1'
    ? 'MLEX_SKIP_INSTALL_TEST=1'
    : process.platform !== 'linux' || process.arch !== 'x64'
      ? 'builds the linux-x64 package'
      : false

const consumer = `
  const chunks = []
  const s = await Session.load(process.env.MODEL)
  for await (const t of s.stream([{ role: 'user', content: 'hi' }], { maxTokens: 8, ignoreEos: true })) chunks.push(t.id)
  await s.close()
  const maps = require('node:fs').readFileSync('/proc/self/maps', 'utf8')
  const lib = maps.split('\\n').map((l) => l.split(' ').pop()).find((p) => p.endsWith('/libmlx.so'))
  const blas = maps.split('\\n').map((l) => l.split(' ').pop()).find((p) => p.includes('libblas'))
  console.log(JSON.stringify({ kind: KIND, tokens: chunks.length, lib, blas }))
`

test('npm install of the packed tarballs works in a fresh project without a toolchain', { skip, timeout: 600_000 }, () => {
  assert.ok(existsSync(addon), `${addon} is missing: run \`npm run build\` (or build:debug) first, or set MLEX_SKIP_INSTALL_TEST=1`)
  execFileSync('bash', [join(root, 'scripts/build-npm.sh'), '--no-build', 'cpu'], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] })

  const work = mkdtempSync(join(tmpdir(), 'mlex-install-'))
  const packs = join(work, 'packs')
  mkdirSync(packs)
  const pack = (dir) => {
    const out = execFileSync('npm', ['pack', '--silent', '--pack-destination', packs, dir], { cwd: root, encoding: 'utf8' })
    return join(packs, out.trim().split('\n').pop())
  }
  const mainTgz = pack(root)
  const platformTgz = pack(join(root, 'npm/linux-x64-gnu'))

  // PATH with node and npm only: no compiler, no python, no make.
  const bin = join(work, 'bin')
  mkdirSync(bin)
  symlinkSync(process.execPath, join(bin, 'node'))
  const npmCli = join(dirname(realpathSync(process.execPath)), '../lib/node_modules/npm/bin/npm-cli.js')
  writeFileSync(join(bin, 'npm'), `#!/bin/sh\nexec "${join(bin, 'node')}" "${npmCli}" "$@"\n`, { mode: 0o755 })
  const env = { HOME: work, PATH: bin, MODEL: modelDir(), npm_config_cache: join(work, 'npm-cache'), npm_config_update_notifier: 'false' }

  const app = join(work, 'app')
  mkdirSync(app)
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }))
  const install = spawnSync(join(bin, 'npm'), ['install', '--offline', '--no-audit', '--no-fund', platformTgz, mainTgz], {
    cwd: app, env, encoding: 'utf8', timeout: 300_000,
  })
  assert.equal(install.status, 0, `npm install failed:\n${install.stdout}\n${install.stderr}`)
  assert.deepEqual(readdirSync(join(app, 'node_modules')).filter((n) => n.startsWith('mlex')).sort(), ['mlex', 'mlex-linux-x64-gnu'])

  writeFileSync(join(app, 'esm.mjs'), `import { Session } from 'mlex'\nimport { createRequire } from 'node:module'\nconst require = createRequire(import.meta.url)\nconst KIND = 'esm'\n${consumer}`)
  writeFileSync(join(app, 'cjs.cjs'), `const { Session } = require('mlex')\nconst KIND = 'cjs'\n;(async () => {\n${consumer}\n})().catch((e) => { console.error(e); process.exit(1) })`)
  for (const script of ['esm.mjs', 'cjs.cjs']) {
    const r = spawnSync(join(bin, 'node'), [script], { cwd: app, env, encoding: 'utf8', timeout: 120_000 })
    assert.equal(r.status, 0, `${script}:\n${r.stdout}\n${r.stderr}`)
    const out = JSON.parse(r.stdout.trim().split('\n').pop())
    assert.equal(out.tokens, 8)
    const pkg = join(app, 'node_modules/mlex-linux-x64-gnu')
    assert.equal(out.lib, join(pkg, 'mlx/lib/libmlx.so'), 'libmlx.so comes from the platform package')
    assert.ok(out.blas.startsWith(join(pkg, 'mlx_cpu.libs/')), `BLAS comes from the platform package: ${out.blas}`)
  }
})
