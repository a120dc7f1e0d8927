// Shared by the test files: one tiny checkpoint per test process.
import { tinyModelDir } from './fixtures.mjs'

let dir
/** Directory of the tiny random llama checkpoint (written once per process). */
export function modelDir() {
  dir ??= tinyModelDir()
  return dir
}

export const user = (content) => [{ role: 'user', content }]

/** Asserts that `p` is a promise (not a synchronous throw) rejecting with `code`. */
export async function rejectsWithCode(assert, makePromise, code, messageRe) {
  let p
  try {
    p = makePromise()
  } catch (e) {
    assert.fail(`threw synchronously instead of rejecting: ${e && e.code} ${e && e.message}`)
  }
  assert.ok(p && typeof p.then === 'function', 'returns a promise')
  await assert.rejects(p, (e) => {
    assert.ok(e instanceof Error, 'an Error')
    assert.equal(e.code, code, `code of: ${e.message}`)
    if (messageRe) assert.match(e.message, messageRe)
    return true
  })
}
