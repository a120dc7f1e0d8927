// Types of `mlex/ai-sdk` (adapters/ai-sdk.mjs): an AI SDK (`ai` 7) provider over an mlex Session.
// The specification types are taken from `ai` itself (the optional peer dependency this entry
// needs), so that nothing else has to be installed for them to resolve.
import type { APICallError, LanguageModel, NoSuchModelError } from 'ai'
import type { ErrorCode, GenerateOptions, LoadOptions, Session } from '../wrapper'

/** The AI SDK's language-model specification, version 4 (what `ai` 7 calls). */
export type LanguageModelV4 = Extract<LanguageModel, { readonly specificationVersion: 'v4' }>
/** Options of one `doGenerate` / `doStream` call. */
export type LanguageModelV4CallOptions = Parameters<LanguageModelV4['doGenerate']>[0]
/** What `doGenerate` resolves with. */
export type LanguageModelV4GenerateResult = Awaited<ReturnType<LanguageModelV4['doGenerate']>>
/** What `doStream` resolves with. */
export type LanguageModelV4StreamResult = Awaited<ReturnType<LanguageModelV4['doStream']>>

/**
 * mlex's own generation options, as model settings (`mlex(id, settings)`) or per call under
 * `providerOptions: { mlex: { … } }` (those win). The AI SDK's standard settings
 * (`maxOutputTokens`, `temperature`, `tools`, `output`…) are mapped by the adapter and are set
 * the AI SDK's way; unknown names are refused by mlex (`INVALID_ARGUMENT`).
 */
export type MlexModelSettings = Omit<GenerateOptions, 'signal' | 'onToken' | 'tools' | 'toolChoice' | 'responseFormat'>

/** Options of `createMlex`. */
export interface MlexProviderOptions {
  /**
   * Run every model of the provider on this session (its model ids are labels only). The
   * caller keeps owning it: `provider.close()` does not close it.
   */
  session?: Session
  /** The model `provider()` loads when called without an id (a directory or repo id). */
  model?: string
  /** Options of the sessions the provider loads itself (`Session.load`). */
  loadOptions?: Omit<LoadOptions, 'signal' | 'onProgress'> & Pick<LoadOptions, 'onProgress'>
  /** Default mlex settings of every model of the provider. */
  settings?: MlexModelSettings
}

/** An mlex model as an AI SDK language model (`specificationVersion: 'v4'`). */
export declare class MlexLanguageModel implements LanguageModelV4 {
  /**
   * `session`: used as is (not closed by the model); or `loadSession`: called on every call, so
   * it should cache its session.
   */
  constructor(init: { session: Session; modelId?: string; settings?: MlexModelSettings } | { loadSession: () => Promise<Session>; modelId: string; settings?: MlexModelSettings })
  readonly specificationVersion: 'v4'
  readonly provider: 'mlex'
  /** The model's id: the directory or repo id it loads, a label, or the session's path. */
  readonly modelId: string
  /** Empty: mlex takes no URLs (text files must come inline; images are not supported yet). */
  readonly supportedUrls: Record<string, RegExp[]>
  /** The session the model runs on (loaded on first use when the provider owns it). */
  getSession(): Promise<Session>
  doGenerate(options: LanguageModelV4CallOptions): Promise<LanguageModelV4GenerateResult>
  doStream(options: LanguageModelV4CallOptions): Promise<LanguageModelV4StreamResult>
}

/** An mlex provider: call it (or `.languageModel`) with a model id or a Session. */
export interface MlexProvider {
  (model?: string | Session, settings?: MlexModelSettings): MlexLanguageModel
  readonly specificationVersion: 'v4'
  languageModel(model?: string | Session, settings?: MlexModelSettings): MlexLanguageModel
  /** Same as `languageModel`. */
  chat(model?: string | Session, settings?: MlexModelSettings): MlexLanguageModel
  /** mlex serves language models only: these throw `NoSuchModelError`. */
  embeddingModel(modelId: string): never
  imageModel(modelId: string): never
  transcriptionModel(modelId: string): never
  speechModel(modelId: string): never
  rerankingModel(modelId: string): never
  /** Frees the sessions the provider loaded itself (a later call loads again). */
  close(): Promise<void>
  /** `await using provider = createMlex()` closes them at the end of the scope. */
  [Symbol.asyncDispose](): Promise<void>
}

/**
 * Creates a provider. `createMlex({ session })`: every model runs on your session.
 * `createMlex()` / `createMlex({ model, loadOptions })`: `provider(dir)` loads `dir` on first use
 * (one session per id) and `provider.close()` frees them.
 *
 * ```ts
 * import { generateText } from 'ai'
 * import { createMlex } from 'mlex/ai-sdk'
 * const provider = createMlex({ session: await Session.load(dir) })
 * const { text } = await generateText({ model: provider(), prompt: 'Hi!', maxOutputTokens: 64 })
 * ```
 */
export declare function createMlex(options?: MlexProviderOptions): MlexProvider

/** The default provider: `mlex('path/or/repo-id')` loads that model; `mlex(session)` wraps a session. */
export declare const mlex: MlexProvider

/**
 * What a call that mlex refuses or fails rejects with (or sends as a stream `error` part): an
 * `APICallError` (never retryable) whose `code` and `data.code` are mlex's, `cause` the mlex
 * error. An aborted call rejects with the signal's reason (an `AbortError`), as fetch does; a
 * model that is not found, with `NoSuchModelError` (`code: 'MODEL_NOT_FOUND'`).
 */
export type MlexCallError = APICallError & { readonly code: ErrorCode; readonly data: { code: ErrorCode } }
export type MlexNoSuchModelError = NoSuchModelError & { readonly code: 'MODEL_NOT_FOUND' }
