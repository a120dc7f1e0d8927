// `mlex/ai-sdk`: a provider for the Vercel AI SDK (`ai` 7), so that `generateText`, `streamText`,
// `generateObject`, tool loops and agents run on a local model through mlex.
//
// Why this file exists: the AI SDK talks to models through its language-model specification
// (LanguageModelV4: `doGenerate` / `doStream` over a standard prompt, call options and stream
// parts). This adapter implements that specification over an mlex `Session`: it turns the AI
// SDK's prompt into mlex ChatMessages, its call options into mlex GenerateOptions (tools,
// toolChoice and JSON output are enforced by mlex's constraint engine), and mlex's typed tokens
// and replies back into the AI SDK's content and stream parts. Nothing goes over HTTP.
//
//   import { generateText } from 'ai'
//   import { mlex } from 'mlex/ai-sdk'
//   const { text } = await generateText({ model: mlex('models/Qwen3-0.6B-4bit'), prompt: 'Hi!' })
//
// Types: adapters/ai-sdk.d.ts. Tests: __test__/ai-sdk.test.mjs.
import { randomUUID } from 'node:crypto'
import { APICallError, InvalidPromptError, NoSuchModelError, UnsupportedFunctionalityError } from 'ai'
import { Session } from '../wrapper.mjs'

const PROVIDER = 'mlex'

// ---------------------------------------------------------------------------------------------
// Provider
// ---------------------------------------------------------------------------------------------

/**
 * Creates an mlex provider. With `session`, every model of the provider runs on that session
 * (its model id is only a label) and the caller keeps owning it. Without, `provider(id)` loads
 * the model `id` (a checkpoint directory, a Hugging Face cache entry or a repo id, as
 * `Session.load` takes) on first use, keeps one session per id, and `provider.close()` frees
 * them. `provider(session)` wraps a session you pass directly.
 */
export function createMlex(options = {}) {
  if (options === null || typeof options !== 'object') throw new TypeError('createMlex: options must be an object')
  const { session: sharedSession, model: defaultModel, loadOptions, settings: providerSettings } = options
  if (sharedSession !== undefined && !isSession(sharedSession)) {
    throw new TypeError('createMlex: session must be an mlex Session (await Session.load(dir))')
  }
  /** @type {Map<string, Promise<Session>>} sessions this provider loaded, by model id */
  const owned = new Map()

  const loaderFor = (modelId) => () => {
    let loading = owned.get(modelId)
    if (!loading) {
      loading = Session.load(modelId, loadOptions).catch((e) => {
        owned.delete(modelId)
        throw loadError(modelId, e)
      })
      owned.set(modelId, loading)
    }
    return loading
  }

  const languageModel = (model, settings) => {
    const merged = { ...providerSettings, ...settings }
    if (isSession(model)) return new MlexLanguageModel({ session: model, settings: merged })
    if (model !== undefined && (typeof model !== 'string' || model.length === 0)) {
      throw new TypeError('mlex: a model is a non-empty string (directory or repo id) or a Session')
    }
    if (sharedSession) return new MlexLanguageModel({ session: sharedSession, modelId: model, settings: merged })
    const modelId = model ?? defaultModel
    if (!modelId) {
      throw new NoSuchModelError({
        modelId: '',
        modelType: 'languageModel',
        message: 'mlex: name a model (a checkpoint directory or repo id), or create the provider with { session } or { model }',
      })
    }
    return new MlexLanguageModel({ modelId, loadSession: loaderFor(modelId), settings: merged })
  }

  const provider = (model, settings) => languageModel(model, settings)
  provider.specificationVersion = 'v4'
  provider.languageModel = languageModel
  provider.chat = languageModel
  for (const modelType of ['embeddingModel', 'imageModel', 'transcriptionModel', 'speechModel', 'rerankingModel']) {
    provider[modelType] = (modelId) => {
      throw new NoSuchModelError({ modelId: String(modelId), modelType, message: `mlex has no ${modelType}s (only language models)` })
    }
  }
  /** Frees the sessions this provider loaded (not a session passed in). A later call loads again. */
  provider.close = async () => {
    const loading = [...owned.values()]
    owned.clear()
    for (const p of loading) {
      const s = await p.catch(() => null)
      await s?.close()
    }
  }
  if (typeof Symbol.asyncDispose === 'symbol') provider[Symbol.asyncDispose] = provider.close
  return provider
}

/** The default provider: `mlex('path/to/model')` loads that model, `mlex(session)` wraps a session. */
export const mlex = createMlex()

// ---------------------------------------------------------------------------------------------
// Language model
// ---------------------------------------------------------------------------------------------

/** One mlex model as an AI SDK language model (specification v4). */
export class MlexLanguageModel {
  specificationVersion = 'v4'
  provider = PROVIDER
  /** mlex takes no URLs: files must come inline. */
  supportedUrls = {}
  #modelId
  #session
  #loadSession
  #settings

  /**
   * @param {{ session?: Session, loadSession?: () => Promise<Session>, modelId?: string, settings?: object }} init
   *   `session` (used as is, not closed here) or `loadSession` (called on each call; cache it).
   */
  constructor({ session, loadSession, modelId, settings } = {}) {
    if (!session && !loadSession) throw new TypeError('MlexLanguageModel: pass a session or loadSession')
    this.#session = session
    this.#loadSession = loadSession
    this.#modelId = modelId ?? session?.info?.path ?? 'mlex'
    this.#settings = settings ?? {}
  }

  get modelId() {
    return this.#modelId
  }

  /** The session the model runs on (loads it when the provider owns it). */
  async getSession() {
    return this.#session ?? (await this.#loadSession())
  }

  async doGenerate(options) {
    const call = this.#prepare(options)
    const signal = options.abortSignal
    const session = await this.getSession()
    let reasoningTokens = 0
    let reply
    try {
      reply = await session.generate(call.messages, {
        ...call.options,
        signal,
        onToken: (t) => {
          if (t.kind === 'reasoning') reasoningTokens++
        },
      })
    } catch (e) {
      throw this.#callError(e, call, signal)
    }
    if (reply.finishReason === 'abort' && signal?.aborted) throw abortReason(signal)

    const content = []
    if (reply.reasoning) content.push({ type: 'reasoning', text: reply.reasoning })
    if (reply.text) content.push({ type: 'text', text: reply.text })
    for (const toolCall of reply.toolCalls) content.push(toolCallContent(toolCall))
    return {
      content,
      finishReason: finishReason(reply.finishReason),
      usage: usage(reply.usage, reasoningTokens),
      warnings: call.warnings,
      request: { body: call.body },
      response: { id: `mlex-${randomUUID()}`, timestamp: new Date(), modelId: this.#modelId },
    }
  }

  async doStream(options) {
    const call = this.#prepare(options)
    const signal = options.abortSignal
    const session = await this.getSession()
    const timestamp = new Date()
    const tokens = session.stream(call.messages, { ...call.options, signal })
    // Wait for the first tokens: a request mlex refuses (bad options, closed session) rejects
    // here, as an HTTP provider's call rejects on an error status, instead of mid-stream.
    let first
    try {
      first = await tokens.next()
    } catch (e) {
      throw this.#callError(e, call, signal)
    }
    const parts = this.#streamParts(tokens, first, call, options, timestamp)
    const stream = new ReadableStream({
      async pull(controller) {
        try {
          const { value, done } = await parts.next()
          if (done) controller.close()
          else controller.enqueue(value)
        } catch (e) {
          controller.error(e) // an abort: the stream fails with the signal's reason, as fetch's body does
        }
      },
      async cancel() {
        await parts.return(undefined) // leaves the token loop: mlex stops the generation
      },
    })
    return { stream, request: { body: call.body } }
  }

  /** Stream parts of one generation, from mlex's typed tokens and final reply. */
  async *#streamParts(tokens, first, call, options, timestamp) {
    const signal = options.abortSignal
    yield { type: 'stream-start', warnings: call.warnings }
    yield { type: 'response-metadata', id: `mlex-${randomUUID()}`, timestamp, modelId: this.#modelId }

    let block = null // the open text or reasoning block: { kind, id }
    let blocks = 0
    let streamedText = ''
    let reasoningTokens = 0
    const end = () => {
      const part = { type: `${block.kind}-end`, id: block.id }
      block = null
      return part
    }
    let result = first
    try {
      while (!result.done) {
        const token = result.value
        if (options.includeRawChunks) yield { type: 'raw', rawValue: token }
        if (token.kind === 'reasoning') reasoningTokens++
        if (token.kind === 'toolCall') {
          // A call's markup is not text: its parsed form comes with the reply.
          if (block) yield end()
        } else if (token.text) {
          if (block && block.kind !== token.kind) yield end()
          if (!block) {
            block = { kind: token.kind, id: `${token.kind}-${blocks++}` }
            yield { type: `${block.kind}-start`, id: block.id }
          }
          yield { type: `${block.kind}-delta`, id: block.id, delta: token.text }
          if (token.kind === 'text') streamedText += token.text
        }
        result = await tokens.next()
      }
    } catch (e) {
      if (signal?.aborted) throw abortReason(signal)
      // mlex failed mid-generation: report it in the stream and finish with 'error'.
      if (block) yield end()
      yield { type: 'error', error: this.#callError(e, call, signal) }
      yield { type: 'finish', usage: usage(undefined, reasoningTokens), finishReason: { unified: 'error', raw: e?.code } }
      return
    } finally {
      if (!result.done) await tokens.return(undefined) // stopped early: abort the generation
    }

    const reply = result.value
    if (reply.finishReason === 'abort' && signal?.aborted) throw abortReason(signal)
    // A tool call that did not parse stays in reply.text as written, though its tokens were typed
    // as a call: send it as text so that the streamed text matches the reply's.
    if (reply.text.length > streamedText.length && reply.text.startsWith(streamedText)) {
      if (block && block.kind !== 'text') yield end()
      if (!block) {
        block = { kind: 'text', id: `text-${blocks++}` }
        yield { type: 'text-start', id: block.id }
      }
      yield { type: 'text-delta', id: block.id, delta: reply.text.slice(streamedText.length) }
    }
    if (block) yield end()
    for (const toolCall of reply.toolCalls) {
      const part = toolCallContent(toolCall)
      // mlex parses a call once it is complete, so its input arrives as one delta.
      yield { type: 'tool-input-start', id: part.toolCallId, toolName: part.toolName }
      yield { type: 'tool-input-delta', id: part.toolCallId, delta: part.input }
      yield { type: 'tool-input-end', id: part.toolCallId }
      yield part
    }
    yield { type: 'finish', usage: usage(reply.usage, reasoningTokens), finishReason: finishReason(reply.finishReason) }
  }

  /** mlex messages and options for one call, with the warnings the AI SDK expects. */
  #prepare(options) {
    const warnings = []
    const messages = convertPrompt(options.prompt)
    const gen = { ...this.#settings }
    if (options.maxOutputTokens != null) gen.maxTokens = options.maxOutputTokens
    if (options.temperature != null) gen.temperature = options.temperature
    if (options.topP != null) gen.topP = options.topP
    if (options.topK != null) gen.topK = options.topK
    if (options.seed != null) gen.seed = options.seed
    if (options.stopSequences?.length) gen.stop = options.stopSequences
    for (const name of ['presencePenalty', 'frequencyPenalty']) {
      if (options[name] != null) {
        warnings.push({
          type: 'unsupported',
          feature: name,
          details: 'mlex has a repetition penalty instead: providerOptions.mlex.repetitionPenalty',
        })
      }
    }

    const reasoning = options.reasoning
    if (reasoning === 'none') gen.enableThinking = false
    else if (reasoning != null && reasoning !== 'provider-default') {
      gen.enableThinking = true
      warnings.push({
        type: 'compatibility',
        feature: 'reasoning',
        details: `mlex has no effort levels: "${reasoning}" turns thinking on; bound it with providerOptions.mlex.reasoningBudgetTokens`,
      })
    }

    const tools = []
    for (const tool of options.tools ?? []) {
      if (tool.type === 'function') {
        tools.push({
          type: 'function',
          function: { name: tool.name, ...(tool.description ? { description: tool.description } : {}), parameters: tool.inputSchema },
        })
      } else {
        warnings.push({ type: 'unsupported', feature: `provider-defined tool ${tool.id ?? tool.name}` })
      }
    }
    if (tools.length > 0) {
      gen.tools = tools
      const choice = options.toolChoice
      if (choice?.type === 'tool') gen.toolChoice = { type: 'function', function: { name: choice.toolName } }
      else if (choice && choice.type !== 'auto') gen.toolChoice = choice.type // 'none' | 'required'
    }

    const format = options.responseFormat
    if (format?.type === 'json') {
      gen.responseFormat = format.schema ? { type: 'json_schema', schema: format.schema } : { type: 'json_object' }
    }

    // Provider options come last: anything of mlex's GenerateOptions (minP, repetitionPenalty,
    // reasoningBudgetTokens, toolCallFormat, promptCache…); mlex refuses unknown names.
    const extra = options.providerOptions?.[PROVIDER]
    if (extra != null) {
      if (typeof extra !== 'object' || Array.isArray(extra)) {
        throw new InvalidPromptError({ prompt: options.prompt, message: 'providerOptions.mlex must be an object of mlex GenerateOptions' })
      }
      const { signal: _signal, onToken: _onToken, ...rest } = extra
      Object.assign(gen, rest)
    }
    return { messages, options: gen, warnings, body: { messages, options: gen } }
  }

  /** An mlex error as the AI SDK's: an abort as the signal's reason, the rest as APICallError. */
  #callError(e, call, signal) {
    if (e?.code === 'ABORTED' || (signal?.aborted && e?.code === undefined)) return abortReason(signal)
    if (!(e instanceof Error) || typeof e.code !== 'string') return e
    const err = new APICallError({
      message: e.message,
      url: `mlex:${this.#modelId}`,
      requestBodyValues: call.body,
      cause: e,
      isRetryable: false, // a local call fails the same way again
      data: { code: e.code },
    })
    err.code = e.code
    return err
  }
}

// ---------------------------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------------------------

function isSession(value) {
  return value instanceof Session || (value !== null && typeof value === 'object' && typeof value.generate === 'function' && typeof value.stream === 'function')
}

/** What an aborted call rejects with: the signal's reason (an AbortError by default), like fetch. */
function abortReason(signal) {
  return signal?.reason ?? new DOMException('The operation was aborted.', 'AbortError')
}

function loadError(modelId, e) {
  if (e?.code === 'MODEL_NOT_FOUND') {
    const err = new NoSuchModelError({ modelId, modelType: 'languageModel', message: e.message })
    err.code = e.code
    return err
  }
  if (!(e instanceof Error) || typeof e.code !== 'string' || e.code === 'ABORTED') return e
  const err = new APICallError({
    message: e.message,
    url: `mlex:${modelId}`,
    requestBodyValues: { load: modelId },
    cause: e,
    isRetryable: false,
    data: { code: e.code },
  })
  err.code = e.code
  return err
}

/** The AI SDK's prompt as mlex ChatMessages (OpenAI shape). */
function convertPrompt(prompt) {
  if (!Array.isArray(prompt)) throw new InvalidPromptError({ prompt, message: 'the prompt must be an array of messages' })
  const messages = []
  for (const message of prompt) {
    switch (message.role) {
      case 'system':
        messages.push({ role: 'system', content: message.content })
        break
      case 'user': {
        // Text (text files inline), and images as mlex image parts (for models whose
        // session.info.supportsImages; others refuse them with INVALID_ARGUMENT).
        const parts = message.content.map((part) => userImage(part) ?? { type: 'text', text: userPartText(part, prompt) })
        const plain = parts.every((p) => p.type === 'text')
        messages.push({ role: 'user', content: plain ? parts.map((p) => p.text).join('') : parts })
        break
      }
      case 'assistant': {
        let text = ''
        let reasoning = ''
        const toolCalls = []
        const results = []
        for (const part of message.content) {
          if (part.type === 'text') text += part.text
          else if (part.type === 'reasoning') reasoning += part.text
          else if (part.type === 'tool-call') {
            toolCalls.push({
              id: part.toolCallId,
              type: 'function',
              function: { name: part.toolName, arguments: JSON.stringify(part.input ?? {}) },
            })
          } else if (part.type === 'tool-result') results.push(toolMessage(part))
          else if (part.type === 'file' || part.type === 'reasoning-file') {
            throw new UnsupportedFunctionalityError({ functionality: `${part.type} parts in assistant messages` })
          }
          // 'custom' parts carry provider options only: nothing to render.
        }
        const m = { role: 'assistant', content: text }
        if (reasoning) m.reasoning = reasoning
        if (toolCalls.length > 0) m.toolCalls = toolCalls
        messages.push(m, ...results)
        break
      }
      case 'tool':
        for (const part of message.content) {
          // Approval responses are for provider-executed tools, which mlex has none of.
          if (part.type === 'tool-result') messages.push(toolMessage(part))
        }
        break
      default:
        throw new InvalidPromptError({ prompt, message: `unsupported message role: ${message.role}` })
    }
  }
  return messages
}

/** An image file part as an mlex image part (bytes or a data: URL); undefined for other parts. */
function userImage(part) {
  const type = part.mediaType ?? ''
  if (part.type !== 'file' || !(type === 'image' || type.startsWith('image/'))) return undefined
  const data = part.data
  let image
  if (data instanceof Uint8Array) image = data
  else if (typeof data === 'string') image = data.startsWith('data:') ? data : `data:${type};base64,${data}`
  else if (data?.type === 'data') image = typeof data.data === 'string' ? `data:${type};base64,${data.data}` : data.data
  else if (data instanceof URL || data?.type === 'url') {
    const url = String(data instanceof URL ? data : data.url)
    if (!url.startsWith('data:')) {
      throw new UnsupportedFunctionalityError({ functionality: `image URLs (${url.slice(0, 40)}): mlex fetches nothing, pass the bytes` })
    }
    image = url
  } else throw new UnsupportedFunctionalityError({ functionality: `image parts of this shape (${type})` })
  return { type: 'image', image }
}

/** Text of a user message part: text, or a text file given inline. */
function userPartText(part, prompt) {
  if (part.type === 'text') return part.text
  if (part.type === 'file') {
    const text = inlineTextFile(part)
    if (text !== undefined) return text
    throw new UnsupportedFunctionalityError({
      functionality: `file parts of type ${part.mediaType} (mlex models take text; text files must be inline)`,
    })
  }
  throw new InvalidPromptError({ prompt, message: `unsupported user content part: ${part.type}` })
}

/** The text of a text file (text/*, JSON) given as inline text or bytes; undefined otherwise. */
function inlineTextFile(part) {
  const type = part.mediaType ?? ''
  if (!(type === 'text' || type.startsWith('text/') || type === 'application/json')) return undefined
  const data = part.data
  if (data?.type === 'text') return data.text
  if (data?.type === 'data') {
    return typeof data.data === 'string' ? Buffer.from(data.data, 'base64').toString('utf8') : Buffer.from(data.data).toString('utf8')
  }
  return undefined
}

/** A tool result as an mlex `role: 'tool'` message answering `toolCallId`. */
function toolMessage(part) {
  return { role: 'tool', toolCallId: part.toolCallId, name: part.toolName, content: toolOutputText(part.output) }
}

function toolOutputText(output) {
  switch (output?.type) {
    case 'text':
    case 'error-text':
      return output.value
    case 'json':
    case 'error-json':
      return JSON.stringify(output.value)
    case 'execution-denied':
      return `Tool execution denied${output.reason ? `: ${output.reason}` : '.'}`
    case 'content':
      return output.value
        .map((part) => {
          if (part.type === 'text') return part.text
          const text = part.type === 'file' ? inlineTextFile(part) : undefined
          if (text !== undefined) return text
          throw new UnsupportedFunctionalityError({ functionality: `${part.type} parts in tool results` })
        })
        .join('')
    default:
      return JSON.stringify(output ?? null)
  }
}

/** An mlex tool call as the AI SDK's `tool-call` content (input as JSON text). */
function toolCallContent(call) {
  const args = call.function.arguments
  return {
    type: 'tool-call',
    toolCallId: call.id,
    toolName: call.function.name,
    input: typeof args === 'string' ? args : JSON.stringify(args ?? {}),
  }
}

/** mlex's finish reasons in the AI SDK's terms (the raw one kept). */
function finishReason(raw) {
  const unified = { stop: 'stop', length: 'length', tool_calls: 'tool-calls', abort: 'interrupted' }[raw] ?? 'other'
  return { unified, raw }
}

/** mlex usage in the AI SDK's v4 shape; `raw` keeps mlex's counts and speeds. */
function usage(u, reasoningTokens) {
  if (!u) {
    return {
      inputTokens: { total: undefined, noCache: undefined, cacheRead: undefined, cacheWrite: undefined },
      outputTokens: { total: undefined, text: undefined, reasoning: reasoningTokens },
    }
  }
  return {
    inputTokens: {
      total: u.promptTokens,
      noCache: u.promptTokens - u.cachedTokens,
      cacheRead: u.cachedTokens,
      cacheWrite: undefined,
    },
    outputTokens: {
      total: u.completionTokens,
      text: u.completionTokens - reasoningTokens,
      reasoning: reasoningTokens,
    },
    raw: { ...u },
  }
}
