// A tour of the Node API, type-checked by `npm test` (tsc --noEmit) against the package's types.
// Run: node --experimental-strip-types examples/basic.ts MODEL_DIR   (Node >= 22.6), or compile with tsc.
import { Session, type GenerateReply, type GeneratedToken, type MlexError } from 'mlex'

async function main(model: string): Promise<void> {
  const session = await Session.load(model, {
    device: 'cpu',
    promptCache: { maxEntries: 4, ttlMs: 60_000 },
    onProgress: ({ stage, done, total }) => console.error(`${stage} ${done}/${total}`),
  })
  try {
    const { modelType, numLayers, contextLength, device } = session.info
    console.log(`${modelType}, ${numLayers} layers, context ${contextLength ?? '?'}, on ${device}`)

    // One reply, with a callback per token.
    const reply: GenerateReply = await session.generate(
      [
        { role: 'system', content: 'You are terse.' },
        { role: 'user', content: 'What is MLX?' },
      ],
      { maxTokens: 64, temperature: 0.7, seed: 1, onToken: (t: GeneratedToken) => t.text !== '.' },
    )
    console.log(reply.text, reply.finishReason, reply.usage.decodeTokensPerSecond.toFixed(1), 'tok/s')

    // Streaming, with a time limit.
    const signal = AbortSignal.timeout(10_000)
    for await (const token of session.stream([{ role: 'user', content: 'Count to ten.' }], { maxTokens: 128, signal })) {
      if (token.kind === 'text') process.stdout.write(token.text)
    }

    // Tokens and templates.
    const ids: number[] = session.tokenize('Hello')
    const text: string = session.detokenize(ids)
    const prompt: string = session.applyChatTemplate([{ role: 'user', content: text }], { addGenerationPrompt: true })
    console.log(ids.length, prompt.length)
  } catch (e) {
    const err = e as MlexError
    if (err.code === 'ABORTED') console.error('timed out')
    else throw err
  } finally {
    await session.close()
  }
}

main(process.argv[2] ?? 'mlx-community/SmolLM2-135M-Instruct-4bit').catch((e: unknown) => {
  console.error(e)
  process.exitCode = 1
})
