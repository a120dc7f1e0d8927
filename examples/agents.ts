// The agent-framework adapters in use, type-checked by `npm test` (tsc --noEmit) against the
// package's types and the frameworks' own: a tool loop and a structured object with the AI SDK,
// then the same with LangChain.js.
// Run: node --experimental-strip-types examples/agents.ts MODEL_DIR   (Node >= 22.6)
import { generateText, generateObject, stepCountIs, tool } from 'ai'
import { z } from 'zod'
import { createMlex } from 'mlex/ai-sdk'
import { ChatMlex } from 'mlex/langchain'
import { Session } from 'mlex'

async function main(dir: string): Promise<void> {
  const session = await Session.load(dir)
  try {
    const mlex = createMlex({ session })
    const weather = tool({
      description: 'The weather in a city',
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => ({ city, celsius: 21 }),
    })
    const { text, steps } = await generateText({
      model: mlex('local'),
      tools: { weather },
      prompt: 'What is the weather in Paris?',
      stopWhen: stepCountIs(2),
      maxOutputTokens: 128,
    })
    console.log(`AI SDK: ${steps.length} steps: ${text}`)
    const { object } = await generateObject({
      model: mlex('local'),
      schema: z.object({ name: z.string(), age: z.number().int() }),
      prompt: 'Invent a person.',
    })
    console.log('AI SDK object:', object.name, object.age)

    const chat = new ChatMlex({ session, maxTokens: 128 })
    const person = await chat
      .withStructuredOutput(z.object({ name: z.string(), age: z.number().int() }))
      .invoke('Invent a person.')
    console.log('LangChain object:', person.name, person.age)
    const reply = await chat.invoke('Say hello.')
    console.log('LangChain:', reply.content, reply.usage_metadata?.output_tokens)
  } finally {
    await session.close()
  }
}

main(process.argv[2] ?? '.').catch((e) => {
  console.error(e)
  process.exitCode = 1
})
