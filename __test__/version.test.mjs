// One version everywhere: Cargo.toml's [package] version is the source, and package.json (with its
// optionalDependencies), npm/*/package.json, the napi loader index.js and Cargo.lock agree
// (scripts/version.sh --check; `scripts/version.sh set X.Y.Z` changes them all).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { readFileSync } from 'node:fs'

const root = new URL('..', import.meta.url).pathname

test('every version field agrees with Cargo.toml', () => {
  const r = spawnSync('bash', ['scripts/version.sh', '--check'], { cwd: root, encoding: 'utf8' })
  assert.equal(r.status, 0, r.stderr)
  const version = spawnSync('bash', ['scripts/version.sh'], { cwd: root, encoding: 'utf8' }).stdout.trim()
  assert.match(version, /^\d+\.\d+\.\d+/)
  assert.equal(JSON.parse(readFileSync(new URL('../package.json', import.meta.url))).version, version)
  const tag = spawnSync('bash', ['scripts/version.sh', '--check', 'v0.0.0-not-this'], { cwd: root, encoding: 'utf8' })
  assert.notEqual(tag.status, 0, 'a tag naming another version is refused')
})
