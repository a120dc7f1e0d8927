// mlex/langchain: `ChatMlex`, a LangChain.js chat model (@langchain/core 1) over an mlex Session.
// It exists so LangChain chains, agents and structured-output helpers can run a local MLX model
// in-process, with no server in between: LangChain messages become mlex ChatMessages, mlex's typed
// tokens become AIMessageChunks (text, reasoning, tool calls, usage), tools and tool_choice map to
// mlex's own (a forced call is held to the tool's schema), and withStructuredOutput uses mlex's
// constrained decoding (`responseFormat`) instead of hoping the model writes valid JSON.
import { BaseChatModel } from '@langchain/core/language_models/chat_models'
import {
  assembleStructuredOutputPipeline,
  createContentParser,
  createFunctionCallingParser,
} from '@langchain/core/language_models/structured_output'
import { AIMessage, AIMessageChunk } from '@langchain/core/messages'
import { ChatGenerationChunk } from '@langchain/core/outputs'
import { OutputParserException } from '@langchain/core/output_parsers'
import { ModelAbortError } from '@langchain/core/errors'
import { RunnableLambda } from '@langchain/core/runnables'
import { convertToOpenAITool } from '@langchain/core/utils/function_calling'
import { toJsonSchema } from '@langchain/core/utils/json_schema'
import { isInteropZodSchema } from '@langchain/core/utils/types'
import { isSerializableSchema } from '@langchain/core/utils/standard_schema'
import { Session } from '../wrapper.mjs'

/** mlex generation options a ChatMlex takes as defaults and per call (camelCase, as in GenerateOptions). */
const GENERATION_OPTIONS = [
  'maxTokens', 'temperature', 'topP', 'topK', 'minP', 'repetitionPenalty', 'repetitionContextSize', 'seed',
  'stop', 'enableThinking', 'reasoningBudgetTokens', 'toolCallFormat', 'promptCache', 'prefillStepSize',
]

/** Content-block types of earlier AI turns that are not prompt text (they are carried separately or dropped). */
const NON_TEXT_AI_BLOCKS = new Set(['reasoning', 'thinking', 'tool_call', 'tool_call_chunk', 'invalid_tool_call', 'tool_use'])

/** An Error with a stable mlex `code`, like the ones the addon throws. */
function mlexError(code, message) {
  return Object.assign(new Error(message), { code })
}

/** A LangChain message content → mlex content: one string, or parts when images are involved. */
function toContent(content, role) {
  if (typeof content === 'string') return content
  if (content == null) return ''
  const parts = []
  for (const block of content) {
    if (typeof block === 'string') parts.push({ type: 'text', text: block })
    else if (block.type === 'text') parts.push({ type: 'text', text: block.text ?? '' })
    else if (block.type === 'image_url') {
      const url = typeof block.image_url === 'string' ? block.image_url : block.image_url?.url
      parts.push({ type: 'image_url', imageUrl: { url } })
    } else if (block.type === 'image' && (block.url || block.data)) {
      const mime = block.mimeType ?? block.mime_type ?? 'image/png'
      parts.push({ type: 'image_url', imageUrl: { url: block.url ?? `data:${mime};base64,${block.data}` } })
    } else if (role === 'assistant' && NON_TEXT_AI_BLOCKS.has(block.type)) continue
    else throw mlexError('INVALID_ARGUMENT', `ChatMlex: '${block.type}' content in a ${role} message is not supported`)
  }
  return parts.every((p) => p.type === 'text') ? parts.map((p) => p.text).join('') : parts
}

/** The reasoning an earlier AI turn carried (v0 additional_kwargs or v1 reasoning blocks). */
function reasoningOf(message) {
  const kw = message.additional_kwargs?.reasoning_content
  if (typeof kw === 'string' && kw) return kw
  if (!Array.isArray(message.content)) return undefined
  const text = message.content
    .filter((b) => typeof b === 'object' && (b.type === 'reasoning' || b.type === 'thinking'))
    .map((b) => b.reasoning ?? b.thinking ?? '')
    .join('')
  return text || undefined
}

/** One LangChain BaseMessage → one mlex ChatMessage (OpenAI shape, as mlex's chat templates take it). */
function toChatMessage(message) {
  const type = message.getType()
  switch (type) {
    case 'system':
      return { role: 'system', content: toContent(message.content, 'system') }
    case 'human':
      return { role: 'user', content: toContent(message.content, 'user'), ...(message.name ? { name: message.name } : {}) }
    case 'ai': {
      const out = { role: 'assistant', content: toContent(message.content, 'assistant') }
      const calls = message.tool_calls ?? []
      if (calls.length) {
        out.toolCalls = calls.map((c, i) => ({
          id: c.id ?? `call_${i}`,
          type: 'function',
          function: { name: c.name, arguments: JSON.stringify(c.args ?? {}) },
        }))
      }
      const reasoning = reasoningOf(message)
      if (reasoning) out.reasoning = reasoning
      return out
    }
    case 'tool':
      return {
        role: 'tool',
        toolCallId: message.tool_call_id,
        content: toContent(message.content, 'tool'),
        ...(message.name ? { name: message.name } : {}),
      }
    case 'generic': {
      const role = { human: 'user', ai: 'assistant' }[message.role] ?? message.role
      return { role, content: toContent(message.content, role) }
    }
    default:
      throw mlexError('INVALID_ARGUMENT', `ChatMlex: '${type}' messages are not supported`)
  }
}

/** LangChain messages → the mlex ChatMessages ChatMlex sends (e.g. for `session.applyChatTemplate`). */
export function toMlexMessages(messages) {
  return messages.map(toChatMessage)
}

/** LangChain tool_choice → mlex toolChoice. */
function toToolChoice(choice) {
  if (choice == null) return undefined
  if (choice === 'any' || choice === 'required') return 'required'
  if (choice === 'auto' || choice === 'none') return choice
  if (typeof choice === 'string') return { name: choice }
  if (typeof choice === 'object') {
    if (choice.type === 'function' && typeof choice.function?.name === 'string') return { name: choice.function.name }
    if (typeof choice.name === 'string') return { name: choice.name }
    if (['any', 'required', 'auto', 'none'].includes(choice.type)) return toToolChoice(choice.type)
  }
  throw mlexError('INVALID_ARGUMENT', `ChatMlex: unsupported tool_choice ${JSON.stringify(choice)}`)
}

/** mlex tool calls → LangChain tool_calls / invalid_tool_calls. */
function toolCallsOf(reply) {
  const toolCalls = []
  const invalid = []
  for (const c of reply.toolCalls) {
    try {
      const args = JSON.parse(c.function.arguments)
      toolCalls.push({ type: 'tool_call', id: c.id, name: c.function.name, args })
    } catch (e) {
      invalid.push({ type: 'invalid_tool_call', id: c.id, name: c.function.name, args: c.function.arguments, error: String(e) })
    }
  }
  return { toolCalls, invalid }
}

function usageOf(reply, reasoningTokens) {
  const { promptTokens, completionTokens, cachedTokens } = reply.usage
  return {
    input_tokens: promptTokens,
    output_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
    input_token_details: { cache_read: cachedTokens },
    ...(reasoningTokens ? { output_token_details: { reasoning: reasoningTokens } } : {}),
  }
}

/** mlex finish reasons → the event protocol's. */
const FINISH_REASONS = { stop: 'stop', length: 'length', tool_calls: 'tool_use' }

/**
 * A LangChain chat model that runs a local model with mlex. Give it an mlex `Session`, or a model
 * (`{ model: dir }`) that it loads on first use and frees on `close()`.
 */
export class ChatMlex extends BaseChatModel {
  static lc_name() {
    return 'ChatMlex'
  }

  #session
  #loading
  #model
  #loadOptions
  #owned
  #closed = false

  /** Default generation options (mlex's names): a call's own options win. */
  defaults

  /** The model name reported in response_metadata and traces. */
  modelName

  constructor(fields = {}) {
    const { session, model, loadOptions, modelName, ...rest } = fields
    super(rest)
    if ((session == null) === (model == null)) throw mlexError('INVALID_ARGUMENT', 'ChatMlex: pass either { session } or { model }')
    if (session != null && typeof session.stream !== 'function') throw mlexError('INVALID_ARGUMENT', 'ChatMlex: session must be an mlex Session')
    if (model != null && typeof model !== 'string') throw mlexError('INVALID_ARGUMENT', 'ChatMlex: model must be a string')
    this.#session = session
    this.#model = model
    this.#loadOptions = loadOptions
    this.#owned = session == null
    this.defaults = {}
    for (const key of GENERATION_OPTIONS) if (rest[key] !== undefined) this.defaults[key] = rest[key]
    this.modelName = modelName ?? (model ?? session.info.path).split(/[\\/]/).filter(Boolean).pop()
  }

  get callKeys() {
    return [...super.callKeys, 'tools', 'tool_choice', 'responseFormat', ...GENERATION_OPTIONS]
  }

  _llmType() {
    return 'mlex'
  }

  _identifyingParams() {
    return { model_name: this.modelName, ...this.defaults }
  }

  getLsParams(options) {
    const params = this.invocationParams(options)
    return {
      ls_provider: 'mlex',
      ls_model_name: this.modelName,
      ls_model_type: 'chat',
      ls_temperature: params.temperature,
      ls_max_tokens: params.maxTokens,
      ls_stop: params.stop,
    }
  }

  /** The mlex GenerateOptions of a call (without its signal): defaults, then the call's options. */
  invocationParams(options = {}) {
    const params = { ...this.defaults }
    for (const key of GENERATION_OPTIONS) if (options[key] !== undefined) params[key] = options[key]
    if (options.tools?.length) params.tools = options.tools.map((t) => convertToOpenAITool(t))
    const toolChoice = toToolChoice(options.tool_choice)
    if (toolChoice !== undefined) params.toolChoice = toolChoice
    if (options.responseFormat !== undefined) params.responseFormat = options.responseFormat
    return params
  }

  /** The Session this model runs on (loading it first when the model was given by directory). */
  async getSession() {
    if (this.#closed) throw mlexError('SESSION_CLOSED', 'ChatMlex: closed')
    if (this.#session) return this.#session
    this.#loading ??= Session.load(this.#model, this.#loadOptions).then(
      (session) => {
        this.#session = session
        return session
      },
      (e) => {
        this.#loading = undefined
        throw e
      },
    )
    return this.#loading
  }

  /** Frees the model when this ChatMlex loaded it; a Session passed in stays open (its owner closes it). */
  async close() {
    if (this.#closed) return
    this.#closed = true
    if (!this.#owned) return
    const session = this.#session ?? (await this.#loading?.catch(() => undefined))
    await session?.close()
  }

  async [Symbol.asyncDispose]() {
    await this.close()
  }

  /** Token count of `content` with the model's own tokenizer. */
  async getNumTokens(content) {
    const session = await this.getSession()
    const text = typeof content === 'string' ? content : content.map((b) => (typeof b === 'string' ? b : b.text ?? '')).join('')
    return session.tokenize(text).length
  }

  bindTools(tools, kwargs) {
    return this.withConfig({ tools: tools.map((t) => convertToOpenAITool(t)), ...kwargs })
  }

  #outputV1(options) {
    return (options.outputVersion ?? this.outputVersion) === 'v1'
  }

  #metadata(reply, v1) {
    return {
      model_provider: 'mlex',
      model_name: this.modelName,
      finish_reason: reply.finishReason,
      usage: reply.usage,
      ...(v1 ? { output_version: 'v1' } : {}),
    }
  }

  /**
   * Runs one generation: yields `{ type: 'text' | 'reasoning', text }` as tokens arrive, then
   * `{ type: 'end', reply, reasoningTokens }`. Tool-call markup is not yielded (the parsed calls
   * are in the reply). Leaving early stops the generation.
   */
  async *#run(messages, options) {
    const session = await this.getSession()
    const params = { ...this.invocationParams(options), signal: options.signal }
    const tokens = session.stream(toMlexMessages(messages), params)
    let done = false
    let reasoningTokens = 0
    try {
      for (;;) {
        let step
        try {
          step = await tokens.next()
        } catch (e) {
          done = true
          if (e?.code === 'ABORTED') throw Object.assign(new ModelAbortError('ChatMlex: the generation was aborted'), { cause: e })
          throw e
        }
        if (step.done) {
          done = true
          yield { type: 'end', reply: step.value, reasoningTokens }
          return
        }
        const token = step.value
        if (token.kind === 'reasoning') reasoningTokens++
        if (token.kind !== 'toolCall' && token.text) yield { type: token.kind, text: token.text }
      }
    } finally {
      if (!done) await tokens.return?.()
    }
  }

  #aborted(reply, v1) {
    const partial = this.#message(reply, 0, v1)
    return new ModelAbortError('ChatMlex: the generation was aborted', partial)
  }

  /** The whole reply as one AIMessage. */
  #message(reply, reasoningTokens, v1) {
    const { toolCalls, invalid } = toolCallsOf(reply)
    const fields = {
      tool_calls: toolCalls,
      invalid_tool_calls: invalid,
      usage_metadata: usageOf(reply, reasoningTokens),
      response_metadata: this.#metadata(reply, v1),
    }
    if (v1) {
      const content = []
      if (reply.reasoning) content.push({ type: 'reasoning', reasoning: reply.reasoning })
      if (reply.text) content.push({ type: 'text', text: reply.text })
      for (const c of toolCalls) content.push(c)
      return new AIMessage({ ...fields, content })
    }
    const additional = reply.reasoning ? { reasoning_content: reply.reasoning } : {}
    return new AIMessage({ ...fields, content: reply.text, additional_kwargs: additional })
  }

  async _generate(messages, options) {
    const v1 = this.#outputV1(options)
    let end
    for await (const part of this.#run(messages, options)) if (part.type === 'end') end = part
    const { reply, reasoningTokens } = end
    if (reply.finishReason === 'abort') throw this.#aborted(reply, v1)
    const { usage } = reply
    return {
      generations: [{ text: reply.text, message: this.#message(reply, reasoningTokens, v1) }],
      llmOutput: {
        tokenUsage: {
          promptTokens: usage.promptTokens,
          completionTokens: usage.completionTokens,
          totalTokens: usage.promptTokens + usage.completionTokens,
        },
      },
    }
  }

  async *_streamResponseChunks(messages, options, runManager) {
    const v1 = this.#outputV1(options)
    // v1 content blocks merge by index: a new block each time the kind (reasoning / text) changes.
    let index = -1
    let kind
    let text = ''
    for await (const part of this.#run(messages, options)) {
      if (part.type === 'end') {
        const { reply, reasoningTokens } = part
        if (reply.finishReason === 'abort') throw this.#aborted(reply, v1)
        yield this.#lastChunk(reply, reasoningTokens, text, index, v1)
        return
      }
      if (part.type === 'text') text += part.text
      let message
      if (v1) {
        if (part.type !== kind) index++
        const block = part.type === 'text' ? { type: 'text', text: part.text, index } : { type: 'reasoning', reasoning: part.text, index }
        message = new AIMessageChunk({ content: [block], response_metadata: { output_version: 'v1' } })
      } else if (part.type === 'text') {
        message = new AIMessageChunk({ content: part.text })
      } else {
        message = new AIMessageChunk({ content: '', additional_kwargs: { reasoning_content: part.text } })
      }
      kind = part.type
      const chunk = new ChatGenerationChunk({ text: part.type === 'text' ? part.text : '', message })
      yield chunk
      await runManager?.handleLLMNewToken(chunk.text, undefined, undefined, undefined, undefined, { chunk })
    }
  }

  /** The final chunk: any text the stream did not carry (a botched tool call left as text), the tool calls, usage, metadata. */
  #lastChunk(reply, reasoningTokens, streamed, index, v1) {
    const rest = reply.text.startsWith(streamed) ? reply.text.slice(streamed.length) : ''
    const { toolCalls } = toolCallsOf(reply)
    const toolCallChunks = reply.toolCalls.map((c, i) => ({
      type: 'tool_call_chunk',
      id: c.id,
      name: c.function.name,
      args: c.function.arguments,
      index: i,
    }))
    let content = rest
    if (v1) {
      content = []
      if (rest) content.push({ type: 'text', text: rest, index: ++index })
      for (const c of toolCalls) content.push({ ...c, index: ++index })
    }
    const message = new AIMessageChunk({
      content,
      tool_call_chunks: toolCallChunks,
      usage_metadata: usageOf(reply, reasoningTokens),
      response_metadata: this.#metadata(reply, v1),
    })
    return new ChatGenerationChunk({ text: rest, message, generationInfo: { finish_reason: reply.finishReason } })
  }

  /** Native events of the content-block protocol (`streamEvents()`): reasoning, text and tool-call blocks, the real finish reason. */
  async *_streamChatModelEvents(messages, options) {
    yield { event: 'message-start' }
    let index = -1
    let open
    const close = () => {
      if (!open) return undefined
      const event = { event: 'content-block-finish', index, content: open }
      open = undefined
      return event
    }
    let text = ''
    for await (const part of this.#run(messages, options)) {
      if (part.type === 'end') {
        const { reply, reasoningTokens } = part
        if (reply.finishReason === 'abort') throw this.#aborted(reply, false)
        const rest = reply.text.startsWith(text) ? reply.text.slice(text.length) : ''
        if (rest && open?.type !== 'text') {
          const finished = close()
          if (finished) yield finished
          open = { type: 'text', text: '' }
          yield { event: 'content-block-start', index: ++index, content: open }
        }
        if (rest) {
          open = { ...open, text: open.text + rest }
          yield { event: 'content-block-delta', index, delta: { type: 'text-delta', text: rest } }
        }
        const finished = close()
        if (finished) yield finished
        for (const c of reply.toolCalls) {
          const start = { type: 'tool_call_chunk', id: c.id, name: c.function.name, args: '' }
          yield { event: 'content-block-start', index: ++index, content: start }
          yield { event: 'content-block-delta', index, delta: { type: 'tool-call-delta', args: c.function.arguments } }
          let content
          try {
            content = { type: 'tool_call', id: c.id, name: c.function.name, args: JSON.parse(c.function.arguments) }
          } catch (e) {
            content = { type: 'invalid_tool_call', id: c.id, name: c.function.name, args: c.function.arguments, error: String(e) }
          }
          yield { event: 'content-block-finish', index, content }
        }
        yield {
          event: 'message-finish',
          reason: FINISH_REASONS[reply.finishReason] ?? 'stop',
          usage: usageOf(reply, reasoningTokens),
          responseMetadata: this.#metadata(reply, false),
        }
        return
      }
      if (open?.type !== part.type) {
        const finished = close()
        if (finished) yield finished
        open = part.type === 'text' ? { type: 'text', text: '' } : { type: 'reasoning', reasoning: '' }
        yield { event: 'content-block-start', index: ++index, content: open }
      }
      if (part.type === 'text') {
        text += part.text
        open = { ...open, text: open.text + part.text }
        yield { event: 'content-block-delta', index, delta: { type: 'text-delta', text: part.text } }
      } else {
        open = { ...open, reasoning: open.reasoning + part.text }
        yield { event: 'content-block-delta', index, delta: { type: 'reasoning-delta', reasoning: part.text } }
      }
    }
  }

  /**
   * A runnable that returns objects of `outputSchema` (a zod schema, a Standard Schema or a JSON
   * Schema). `method`: `'jsonSchema'` (default; mlex holds the reply to the schema token by token),
   * `'functionCalling'` (a forced call of a tool with that schema, equally enforced) or
   * `'jsonMode'` (any JSON object, validated afterwards). `includeRaw` returns `{ raw, parsed }`.
   */
  withStructuredOutput(outputSchema, config = {}) {
    const { method = 'jsonSchema', includeRaw = false } = config
    const jsonSchema = isInteropZodSchema(outputSchema) || isSerializableSchema(outputSchema) ? toJsonSchema(outputSchema) : outputSchema
    const name = config.name ?? (typeof jsonSchema.title === 'string' ? jsonSchema.title : 'extract')
    let llm
    let parser
    if (method === 'functionCalling') {
      const description = jsonSchema.description ?? `Return the answer as ${name}'s arguments.`
      llm = this.bindTools([{ type: 'function', function: { name, description, parameters: jsonSchema } }], { tool_choice: name })
      parser = createFunctionCallingParser(outputSchema, name)
    } else if (method === 'jsonSchema' || method === 'jsonMode') {
      const responseFormat =
        method === 'jsonMode' ? { type: 'json_object' } : { type: 'json_schema', json_schema: { name, strict: true, schema: jsonSchema } }
      llm = this.withConfig({ responseFormat })
      parser = createContentParser(outputSchema)
    } else {
      throw mlexError('INVALID_ARGUMENT', `ChatMlex: unknown structured output method '${method}'`)
    }
    // A reply cut off by maxTokens is never valid, even where a lenient parser would accept a prefix.
    const complete = RunnableLambda.from((message, runConfig) => {
      if (message.response_metadata?.finish_reason === 'length') {
        throw new OutputParserException('ChatMlex: the reply ran out of maxTokens before the structured output was complete', message.text)
      }
      return parser.invoke(message, runConfig)
    })
    return assembleStructuredOutputPipeline(llm, complete, includeRaw, includeRaw ? 'StructuredOutputRunnable' : 'StructuredOutput')
  }
}

export default ChatMlex
