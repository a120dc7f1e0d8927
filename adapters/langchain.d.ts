// Types of `mlex/langchain` (adapters/langchain.mjs): `ChatMlex`, a LangChain.js chat model
// (@langchain/core 1) that runs a local model through an mlex Session.
//
// This file sits in a package without `"type": "module"`, so TypeScript reads it as CommonJS;
// every @langchain/core import asks for the ESM ("import") types explicitly, so that `ChatMlex`
// extends the same `BaseChatModel` declaration an ESM program imports (the adapter is ESM-only).
import type { BaseChatModel, BaseChatModelCallOptions, BaseChatModelParams, BindToolsInput } from '@langchain/core/language_models/chat_models' with { 'resolution-mode': 'import' }
import type { BaseLanguageModelInput } from '@langchain/core/language_models/base' with { 'resolution-mode': 'import' }
import type { AIMessageChunk, BaseMessage, MessageContent } from '@langchain/core/messages' with { 'resolution-mode': 'import' }
import type { ChatGenerationChunk, ChatResult } from '@langchain/core/outputs' with { 'resolution-mode': 'import' }
import type { ChatModelStreamEvent } from '@langchain/core/language_models/event' with { 'resolution-mode': 'import' }
import type { CallbackManagerForLLMRun } from '@langchain/core/callbacks/manager' with { 'resolution-mode': 'import' }
import type { Runnable } from '@langchain/core/runnables' with { 'resolution-mode': 'import' }
import type { ChatMessage, GenerateOptions, LoadOptions, Session } from '../wrapper'

/** mlex generation options a ChatMlex takes as defaults and per call (see `GenerateOptions`). */
export type ChatMlexGenerationOptions = Pick<
  GenerateOptions,
  | 'maxTokens'
  | 'temperature'
  | 'topP'
  | 'topK'
  | 'minP'
  | 'repetitionPenalty'
  | 'repetitionContextSize'
  | 'seed'
  | 'stop'
  | 'enableThinking'
  | 'reasoningBudgetTokens'
  | 'toolCallFormat'
  | 'promptCache'
  | 'prefillStepSize'
>

/**
 * Which tool the model may or must call: `'auto'`, `'none'`, `'any'` / `'required'` (some tool),
 * a tool's name, or `{ type: 'function', function: { name } }`.
 */
export type ChatMlexToolChoice =
  | 'auto'
  | 'none'
  | 'any'
  | 'required'
  | (string & {})
  | { type: 'function'; function: { name: string } }
  | { name: string }

/** Options of one call (`invoke(input, options)`, `stream`, `bindTools`, `withConfig`). */
export interface ChatMlexCallOptions extends BaseChatModelCallOptions, ChatMlexGenerationOptions {
  /** Tools the model may call: LangChain tools (zod schemas) or OpenAI-format definitions. */
  tools?: BindToolsInput[]
  /** Whether and which tool the model must call; a forced call is held to the tool's schema. */
  tool_choice?: ChatMlexToolChoice
  /** mlex's constrained decoding (JSON Schema, any JSON object, regex, Lark grammar). */
  responseFormat?: GenerateOptions['responseFormat']
}

/** What a ChatMlex is built from: an mlex Session, or a model to load (exactly one), and default options. */
export interface ChatMlexInput extends BaseChatModelParams, ChatMlexGenerationOptions {
  /** A loaded Session. ChatMlex does not close it: its owner does. */
  session?: Session
  /** A model (directory, HF cache entry or repo id, as `Session.load` takes) that ChatMlex loads on first use and frees on `close()`. */
  model?: string
  /** Options of `Session.load` when `model` is given. */
  loadOptions?: LoadOptions
  /** The model name reported in `response_metadata.model_name` (default: the directory's name). */
  modelName?: string
}

/**
 * LangChain messages as the mlex ChatMessages ChatMlex sends: system, human, AI (with
 * `toolCalls`, and `reasoning` from an earlier turn) and tool messages (`toolCallId`), e.g. for
 * `session.applyChatTemplate(toMlexMessages(history))`.
 */
export declare function toMlexMessages(messages: BaseMessage[]): ChatMessage[]

/**
 * A LangChain chat model over mlex.
 *
 * Replies: `content` is the answer's text; reasoning models' thinking is in
 * `additional_kwargs.reasoning_content` (or a `reasoning` content block with `outputVersion: 'v1'`,
 * and a reasoning stream in `streamEvents()`); tool calls are in `tool_calls` with ids;
 * `usage_metadata` counts tokens (`input_token_details.cache_read`: prompt tokens from mlex's
 * prompt cache); `response_metadata` has `finish_reason` (`'stop' | 'length' | 'tool_calls'`),
 * `model_name`, `model_provider: 'mlex'` and mlex's own `usage` (speeds, batch).
 *
 * `withStructuredOutput(schema, { method, includeRaw, name })` takes a zod schema, a Standard
 * Schema or a JSON Schema; `method: 'jsonSchema'` (default) holds the reply to the schema with
 * mlex's constrained decoding, `'functionCalling'` forces a call of a tool with that schema,
 * `'jsonMode'` asks for any JSON object and validates it afterwards. A reply cut off by
 * `maxTokens` throws an `OutputParserException`.
 *
 * Aborting (`signal`, `timeout`) throws a `ModelAbortError` (its `partialOutput` holds the
 * reply so far; a stream may throw the signal's reason first, as LangChain checks it between
 * chunks). mlex errors keep their `code` (`INVALID_ARGUMENT`, `SESSION_CLOSED`, …).
 *
 * ```ts
 * import { ChatMlex } from 'mlex/langchain'
 * const model = new ChatMlex({ model: 'models/Qwen3-0.6B-4bit', maxTokens: 256 })
 * const reply = await model.invoke('What is MLX?')
 * await model.close()
 * ```
 */
export declare class ChatMlex extends BaseChatModel<ChatMlexCallOptions, AIMessageChunk> {
  static lc_name(): string
  constructor(fields: ChatMlexInput)

  /** Default generation options (mlex's names): a call's own options win. */
  defaults: ChatMlexGenerationOptions
  /** The model name reported in response_metadata and traces. */
  modelName: string

  get callKeys(): string[]
  _llmType(): string
  _identifyingParams(): Record<string, unknown>
  /** The mlex GenerateOptions of a call (without its signal): the defaults, then the call's options. */
  invocationParams(options?: this['ParsedCallOptions']): Omit<GenerateOptions, 'signal' | 'onToken'>

  /** The Session this model runs on (loading it first when the model was given as `model`). */
  getSession(): Promise<Session>
  /** Frees the model when this ChatMlex loaded it (a Session passed in stays open). Idempotent. */
  close(): Promise<void>
  [Symbol.asyncDispose](): Promise<void>

  /** Token count of `content` with the model's own tokenizer. */
  getNumTokens(content: MessageContent): Promise<number>

  /** This model with `tools` bound (and `tool_choice`, or other call options, in `kwargs`). */
  bindTools(
    tools: BindToolsInput[],
    kwargs?: Partial<ChatMlexCallOptions>,
  ): Runnable<BaseLanguageModelInput, AIMessageChunk, ChatMlexCallOptions>

  _generate(messages: BaseMessage[], options: this['ParsedCallOptions'], runManager?: CallbackManagerForLLMRun): Promise<ChatResult>
  _streamResponseChunks(
    messages: BaseMessage[],
    options: this['ParsedCallOptions'],
    runManager?: CallbackManagerForLLMRun,
  ): AsyncGenerator<ChatGenerationChunk>
  _streamChatModelEvents(
    messages: BaseMessage[],
    options: this['ParsedCallOptions'],
    runManager?: CallbackManagerForLLMRun,
  ): AsyncGenerator<ChatModelStreamEvent>
}

export default ChatMlex
