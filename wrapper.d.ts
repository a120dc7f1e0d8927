// Types of the public `mlex` API. The object shapes (options, messages, replies) are generated
// from the Rust sources into index.d.ts with their docs; this file declares the `Session` class
// that wrapper.js builds over the native addon.
import type {
  ChatMessage,
  ChatTemplateOptions,
  GenerateOptions,
  GenerateReply,
  GeneratedToken,
  LoadOptions,
  ModelInfo,
  ParsedToolCalls,
  TokenizeOptions,
} from './index'

export type {
  ChatMessage,
  ChatTemplateOptions,
  ContentPart,
  FunctionDefinition,
  GenerateOptions,
  GenerateReply,
  GeneratedToken,
  LoadOptions,
  LoadProgress,
  ModelInfo,
  ParsedToolCalls,
  PromptCacheOptions,
  TokenizeOptions,
  Tool,
  ToolCall,
  ToolCallFunction,
  TopLogprob,
  Usage,
} from './index'

/** The stable `code` of every error mlex rejects or throws with. */
export type ErrorCode =
  | 'MODEL_NOT_FOUND'
  | 'INVALID_CHECKPOINT'
  | 'INVALID_ARGUMENT'
  | 'MLX_ERROR'
  | 'OUT_OF_MEMORY'
  | 'ABORTED'
  | 'SESSION_CLOSED'

/** An `Error` from mlex: `code` says what kind, `message` names the cause. */
export interface MlexError extends Error {
  code: ErrorCode
}

/** How a model writes its tool calls (`GenerateOptions.toolCallFormat`, `parseToolCalls`). */
export type ToolCallFormat = 'hermes' | 'qwen3_coder' | 'gemma4' | 'gemma_tool_code' | 'llama3_json' | 'mistral'

/**
 * Parses the tool calls out of a model's reply text: Hermes `<tool_call>{json}</tool_call>`
 * (Qwen2.5/3), Qwen3-Coder/Qwen3.5 XML, Gemma 4 `<|tool_call>call:…<tool_call|>`, Gemma 3
 * `tool_code` blocks, Llama 3 JSON, Mistral `[TOOL_CALLS]`. Without `format`, every format is
 * tried. Malformed calls stay in `text` as written; model output never makes it throw.
 *
 * ```ts
 * const { text, toolCalls } = parseToolCalls(reply, 'hermes')
 * ```
 */
export declare function parseToolCalls(text: string, format?: ToolCallFormat): ParsedToolCalls

/** MLX's memory in this process (all sessions together), in bytes. */
export interface MemoryStats {
  /** In live arrays: weights, KV caches, pooled prompt caches, arrays in flight. */
  activeBytes: number
  /** The most `activeBytes` has been (a high-water mark). */
  peakBytes: number
  /** Freed buffers MLX keeps for reuse. */
  cacheBytes: number
  /** MLX's memory limit: allocations beyond it fail. */
  limitBytes: number
}

/** MLX's memory figures of this process (to watch for growth: a soak, a long-running server). */
export declare function memoryStats(): MemoryStats

/** Every error code, for exhaustive handling. */
export declare const ERROR_CODES: readonly ErrorCode[]

/**
 * A loaded model. All slow work runs off the JS thread; concurrent calls on one session are
 * served in order (FIFO) and give the same results as when made one by one.
 *
 * ```ts
 * import { Session } from 'mlex'
 * await using session = await Session.load('mlx-community/Qwen3-0.6B-4bit')
 * for await (const token of session.stream([{ role: 'user', content: 'Hi!' }])) {
 *   process.stdout.write(token.text)
 * }
 * ```
 */
export declare class Session implements AsyncDisposable {
  private constructor()

  /**
   * Loads a model off the JS thread.
   * @param model A checkpoint directory, a Hugging Face cache entry, or a repo id looked up
   *   under `MLEX_MODELS_DIR` and the Hugging Face cache.
   * @throws {MlexError} `MODEL_NOT_FOUND`, `INVALID_CHECKPOINT`, `INVALID_ARGUMENT`, `ABORTED`,
   *   `OUT_OF_MEMORY`, `MLX_ERROR` (as a rejection).
   */
  static load(model: string, options?: LoadOptions): Promise<Session>

  /**
   * Generates a reply to `messages`. With `signal` aborted before the start it rejects with
   * `ABORTED`; aborted while running it resolves with `finishReason: 'abort'` and the partial text.
   */
  generate(messages: ChatMessage[], options?: GenerateOptions): Promise<GenerateReply>

  /**
   * Streams the reply token by token:
   * `for await (const t of session.stream(messages)) process.stdout.write(t.text)`.
   * Leaving the loop early (break / return / throw) stops the generation. The iterator's last
   * result (`done: true`) carries the `GenerateReply` as its `value`.
   */
  stream(messages: ChatMessage[], options?: GenerateOptions): AsyncIterableIterator<GeneratedToken>

  /** Token ids of `text` (special tokens added only with `addSpecialTokens: true`). */
  tokenize(text: string, options?: TokenizeOptions): number[]

  /** Text of token ids (special tokens kept). */
  detokenize(ids: number[]): string

  /** The prompt text the model's chat template makes of `messages`. */
  applyChatTemplate(messages: ChatMessage[], options?: ChatTemplateOptions): string

  /** What the loaded model is. */
  readonly info: ModelInfo

  /** Whether `close()` has been called. */
  readonly closed: boolean

  /**
   * Frees the model. Running generations end with `finishReason: 'abort'`; later calls reject
   * (or throw, for the synchronous methods) with code `SESSION_CLOSED`. Idempotent.
   */
  close(): Promise<void>

  /** `await using session = await Session.load(…)` closes it at the end of the scope. */
  [Symbol.asyncDispose](): Promise<void>
}
