// The user's install, on the platforms whose packages this machine builds (linux-x64 CPU,
// darwin-arm64 Metal): scripts/package-<platform>.sh --no-build --debug packs the main package,
// the platform package and the CLI archive from what scripts/test.sh has already built (the addon
// of `npm run build:debug`, the debug `mlex` of `cargo test --all-targets`); then
//  1. the two tarballs are installed into a fresh project outside the repository with no registry
//     (an empty npm cache, --offline) and no toolchain on the PATH (only node and npm: no cc,
//     cargo, rustc, python), and a tiny checkpoint streams a reply from ESM and from CommonJS,
//     with libmlx loaded from the platform package;
//  2. the CLI archive is checked against its .sha256, unpacked elsewhere and its binary run from
//     another directory (`mlex --version`, a tiny generation) with no library path set: the
//     packaged binaries' runpath holds only $ORIGIN/mlx/lib (@loader_path/mlx/lib), so this
//     proves relocation.
// Set MLEX_SKIP_INSTALL_TEST=1 to skip (CI must not).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { existsSync, mkdtempSync, mkdirSync, writeFileSync, symlinkSync, readdirSync, readFileSync, realpathSync, rmSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { tmpdir } from 'node:os'
import { modelDir } from './helpers.mjs'

const root = realpathSync(new URL('..', import.meta.url).pathname)
const PLATFORMS = {
  'linux-x64': { name: 'linux-x64-gnu', triple: 'x86_64-unknown-linux-gnu', lib: 'libmlx.so', script: 'package-linux-x64.sh' },
  'darwin-arm64': { name: 'darwin-arm64', triple: 'aarch64-apple-darwin', lib: 'libmlx.dylib', script: 'package-darwin-arm64.sh' },
}
const platform = PLATFORMS[`${process.platform}-${process.arch}`]
const skip =
  process.env.MLEX_SKIP_INSTALL_TEST === '1'
    ? 'MLEX_SKIP_INSTALL_TEST=1'
    : !platform
      ? `no package is built for ${process.platform}-${process.arch}`
      : false
const version = skip ? '' : JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).version

const consumer = `
  const chunks = []
  const s = await Session.load(process.env.MODEL)
  for await (const t of s.stream([{ role: 'user', content: 'hi' }], { maxTokens: 8, ignoreEos: true })) chunks.push(t.id)
  await s.close()
  const libs = process.report.getReport().sharedObjects
  const lib = libs.find((p) => /\\/libmlx\\.(so|dylib)$/.test(p))
  const blas = libs.find((p) => p.includes('libblas'))
  console.log(JSON.stringify({ kind: KIND, tokens: chunks.length, lib, blas }))
`

let work, dist, bin, env
// The tarballs and installs take ~400 MB (the CUDA package most): gone after the run.
after(() => { if (work) rmSync(work, { recursive: true, force: true }) })
/** Packs once for both tests: scripts/package-<platform>.sh --no-build --debug. */
function packed() {
  if (dist) return dist
  work = realpathSync(mkdtempSync(join(tmpdir(), 'mlex-install-')))
  dist = join(work, 'dist')
  execFileSync('bash', [join(root, 'scripts', platform.script), '--no-build', '--debug', '--out', dist], {
    cwd: root, stdio: ['ignore', 'inherit', 'inherit'],
  })
  // PATH with node and npm only: no compiler, no cargo/rustc, no python, no make.
  bin = join(work, 'bin')
  mkdirSync(bin)
  symlinkSync(process.execPath, join(bin, 'node'))
  const npmCli = join(dirname(realpathSync(process.execPath)), '../lib/node_modules/npm/bin/npm-cli.js')
  writeFileSync(join(bin, 'npm'), `#!/bin/sh\nexec "${join(bin, 'node')}" "${npmCli}" "$@"\n`, { mode: 0o755 })
  env = { HOME: work, PATH: bin, MODEL: modelDir(), npm_config_cache: join(work, 'npm-cache'), npm_config_update_notifier: 'false' }
  const tools = spawnSync('/bin/sh', ['-c', 'for t in cc c++ gcc g++ clang ld cargo rustc python3 make; do command -v $t && exit 1; done; exit 0'], { env, encoding: 'utf8' })
  assert.equal(tools.status, 0, `a toolchain is on the test PATH: ${tools.stdout}`)
  return dist
}

test('npm install of the packed tarballs works in a fresh project without a toolchain', { skip, timeout: 600_000 }, () => {
  assert.ok(existsSync(join(root, `mlex.${platform.name}.node`)), `mlex.${platform.name}.node is missing: run \`npm run build\` (or build:debug) first, or set MLEX_SKIP_INSTALL_TEST=1`)
  packed()
  const mainTgz = join(dist, `mlex-${version}.tgz`)
  const platformTgz = join(dist, `mlex-${platform.name}-${version}.tgz`)
  assert.ok(existsSync(mainTgz) && existsSync(platformTgz), `packed: ${readdirSync(dist)}`)

  const app = join(work, 'app')
  mkdirSync(app)
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }))
  const install = spawnSync(join(bin, 'npm'), ['install', '--offline', '--no-audit', '--no-fund', platformTgz, mainTgz], {
    cwd: app, env, encoding: 'utf8', timeout: 300_000,
  })
  assert.equal(install.status, 0, `npm install failed:\n${install.stdout}\n${install.stderr}`)
  assert.deepEqual(readdirSync(join(app, 'node_modules')).filter((n) => n.startsWith('mlex')).sort(), ['mlex', `mlex-${platform.name}`])
  const pkg = join(app, 'node_modules', `mlex-${platform.name}`)
  if (process.platform === 'darwin') assert.ok(existsSync(join(pkg, 'mlx/lib/mlx.metallib')), 'mlx.metallib beside libmlx.dylib')

  writeFileSync(join(app, 'esm.mjs'), `import { Session } from 'mlex'\nconst KIND = 'esm'\n${consumer}`)
  writeFileSync(join(app, 'cjs.cjs'), `const { Session } = require('mlex')\nconst KIND = 'cjs'\n;(async () => {\n${consumer}\n})().catch((e) => { console.error(e); process.exit(1) })`)
  for (const script of ['esm.mjs', 'cjs.cjs']) {
    const r = spawnSync(join(bin, 'node'), [script], { cwd: app, env, encoding: 'utf8', timeout: 120_000 })
    assert.equal(r.status, 0, `${script}:\n${r.stdout}\n${r.stderr}`)
    const out = JSON.parse(r.stdout.trim().split('\n').pop())
    assert.equal(out.tokens, 8)
    assert.equal(realpathSync(out.lib), realpathSync(join(pkg, 'mlx/lib', platform.lib)), 'libmlx comes from the platform package')
    if (process.platform === 'linux') assert.ok(realpathSync(out.blas).startsWith(join(pkg, 'mlx_cpu.libs/')), `BLAS comes from the platform package: ${out.blas}`)
  }
})

test('the CLI archive runs from anywhere once unpacked', { skip, timeout: 600_000 }, () => {
  const cli = join(root, 'target', platform.triple, 'debug', 'mlex')
  assert.ok(existsSync(cli), `${cli} is missing: run \`cargo build --target ${platform.triple} --bin mlex\` (scripts/test.sh's cargo test builds it), or set MLEX_SKIP_INSTALL_TEST=1`)
  packed()
  const name = `mlex-${version}-${platform.name}`
  const tarball = join(dist, `${name}.tar.gz`)
  const [sum, file] = readFileSync(`${tarball}.sha256`, 'utf8').trim().split(/\s+/)
  assert.equal(file, `${name}.tar.gz`)
  assert.equal(createHash('sha256').update(readFileSync(tarball)).digest('hex'), sum, 'checksum file matches')

  const unpacked = join(work, 'opt')
  mkdirSync(unpacked)
  execFileSync('tar', ['-xzf', tarball, '-C', unpacked])
  const mlex = join(unpacked, name, 'mlex')
  const elsewhere = join(work, 'elsewhere')
  mkdirSync(elsewhere)
  const cliEnv = { HOME: work, PATH: bin }
  const v = spawnSync(mlex, ['--version'], { cwd: elsewhere, env: cliEnv, encoding: 'utf8' })
  assert.equal(v.status, 0, v.stderr)
  assert.equal(v.stdout.trim(), `mlex ${version}`)
  // Through a symlink on the PATH, as users install it ($ORIGIN / @loader_path are the real file's).
  const onPath = join(elsewhere, 'bin')
  mkdirSync(onPath)
  symlinkSync(mlex, join(onPath, 'mlex'))
  const s = spawnSync('mlex', ['--version'], { cwd: elsewhere, env: { ...cliEnv, PATH: `${onPath}:${bin}` }, encoding: 'utf8' })
  assert.equal(s.status, 0, s.stderr)
  assert.equal(s.stdout.trim(), `mlex ${version}`)

  // A tiny generation; on Linux the dynamic loader says where libmlx and BLAS came from.
  const traceEnv = process.platform === 'linux' ? { ...cliEnv, LD_DEBUG: 'libs' } : cliEnv
  const g = spawnSync(mlex, ['generate', '--model', modelDir(), '--prompt-tokens', '1,2,3', '--max-tokens', '4', '--ignore-eos', '--json'], {
    cwd: elsewhere, env: traceEnv, encoding: 'utf8', timeout: 120_000,
  })
  assert.equal(g.status, 0, `mlex generate:\n${g.stdout}\n${g.stderr.slice(-4000)}`)
  const reply = JSON.parse(g.stdout)
  assert.equal(reply.tokens.length, 4)
  if (process.platform === 'linux') {
    const inits = g.stderr.split('\n').filter((l) => l.includes('calling init:')).map((l) => l.split('calling init: ')[1].trim())
    const lib = inits.find((p) => p.endsWith('/libmlx.so'))
    const blas = inits.find((p) => p.includes('libblas'))
    assert.equal(realpathSync(lib), join(unpacked, name, 'mlx/lib/libmlx.so'), `libmlx.so from the archive: ${lib}`)
    assert.ok(realpathSync(blas).startsWith(join(unpacked, name, 'mlx_cpu.libs/')), `BLAS from the archive: ${blas}`)
  }
})

// The CUDA package and archive cannot run here (no GPU), but they are assembled from the same
// debug builds and checked: the addon and the binary find the CUDA libmlx.so and its bundled BLAS
// inside the package, and only NVIDIA's libraries are left to the system.
test('the CUDA package and CLI archive assemble (GPU-free checks)', { skip: skip || (process.platform !== 'linux' && 'Linux only'), timeout: 600_000 }, () => {
  packed()
  execFileSync('bash', [join(root, 'scripts/package-linux-x64-cuda.sh'), '--no-build', '--debug', '--out', dist], {
    cwd: root, stdio: ['ignore', 'inherit', 'inherit'],
  })
  for (const f of [`mlex-linux-x64-gnu-cuda-${version}.tgz`, `mlex-${version}-linux-x64-gnu-cuda.tar.gz`, `mlex-${version}-linux-x64-gnu-cuda.tar.gz.sha256`]) {
    assert.ok(existsSync(join(dist, f)), `${f} was made`)
  }
})
