// ESM entry of the `mlex` package: the same classes as the CommonJS entry (wrapper.js).
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const mlex = require('./wrapper.js')

export const Session = mlex.Session
export const ERROR_CODES = mlex.ERROR_CODES
export const parseToolCalls = mlex.parseToolCalls
export const memoryStats = mlex.memoryStats
export default mlex
