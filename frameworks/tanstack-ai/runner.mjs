// TanStack AI runner: chat() from @tanstack/ai with an OpenAI adapter and three tools (exec, write_file,
// read_file) over an E2B SandboxHandle for @tanstack/ai-sandbox (./e2b-sandbox.mjs, the project's own
// provider: TanStack's is not published). The same task, steps, pass rule and transcript as the Python
// framework runners (../proof.py), by ../proof.mjs; fw04 is this runner's own. Packages load from the
// Node project first on NODE_PATH.

import { errorText, lifetimeMs, runFramework, start } from '../proof.mjs'
import { e2bSandbox } from './e2b-sandbox.mjs'

const PACKAGES = ['@tanstack/ai', '@tanstack/ai-openai', '@tanstack/ai-sandbox', 'e2b']
const SPAWN_WAIT_MS = 15_000

// --- the framework -------------------------------------------------------------------------------

const INSTRUCTIONS = 'You operate a Linux sandbox through your tools. Do exactly what the user asks.'

class TanStack {
  constructor(modules, task) {
    this.ai = modules['@tanstack/ai']
    this.openai = modules['@tanstack/ai-openai']
    const options = task.options ?? {}
    this.model = options.model ?? {}
    this.prompt = String(options.prompt ?? '')
    this.attempts = Math.max(1, Number(options.attempts ?? 2))
    this.provider = e2bSandbox(
      { e2b: modules.e2b, aiSandbox: modules['@tanstack/ai-sandbox'] },
      { metadata: { ...task.metadata }, timeoutMs: lifetimeMs(600_000) },
    )
    this.sandboxes = []
  }

  async open() {
    const handle = await this.provider.create({})
    this.sandboxes.push(handle.id)
    return handle
  }

  tools(handle, run) {
    const { toolDefinition } = this.ai
    const tool = (name, description, properties, perform) =>
      toolDefinition({
        name,
        description,
        inputSchema: { type: 'object', properties, required: Object.keys(properties) },
      }).server(async (args) => {
        const record = { name, arguments: args, result: '', error: false }
        run.calls.push(record)
        try {
          const output = await perform(args)
          record.result = typeof output === 'string' ? output : JSON.stringify(output)
          return output
        } catch (err) {
          record.error = true
          record.result = errorText(err)
          return { error: record.result }
        }
      })
    const text = { type: 'string' }
    return [
      tool('exec', 'Run a shell command in the sandbox; returns stdout, stderr and exitCode.', { command: text }, ({ command }) =>
        handle.process.exec(command),
      ),
      tool('write_file', 'Write text content to a file in the sandbox.', { path: text, content: text }, async ({ path, content }) => {
        await handle.fs.write(path, content)
        return `wrote ${content.length} characters to ${path}`
      }),
      tool('read_file', 'Read a text file from the sandbox.', { path: text }, ({ path }) => handle.fs.read(path)),
    ]
  }

  read(handle, path) {
    return handle.fs.read(path)
  }

  exec(handle, command) {
    return handle.process.exec(command)
  }

  close(handle) {
    return handle.destroy()
  }

  async ask(handle, run) {
    const { chat, maxIterations, streamToText } = this.ai
    const key = process.env[this.model.key_env ?? ''] ?? ''
    const adapter = this.openai.createOpenaiChatCompletions(this.model.name, key, { baseURL: this.model.base_url })
    run.answer = await streamToText(
      chat({
        adapter,
        systemPrompts: [INSTRUCTIONS],
        messages: [{ role: 'user', content: this.prompt }],
        tools: this.tools(handle, run),
        agentLoopStrategy: maxIterations(8),
      }),
    )
  }
}

// --- the spawn probe ---------------------------------------------------------------------------

async function spawnStdin(framework, handle, details) {
  let spawned
  try {
    spawned = await handle.process.spawn('cat')
  } catch (err) {
    details.raised = errorText(err)
    return `spawn('cat') refused: ${errorText(err)}`
  }
  const collect = async (stream) => {
    let text = ''
    for await (const chunk of stream) text += chunk
    return text
  }
  const stdout = collect(spawned.stdout)
  try {
    await spawned.stdin.write('ping\n')
    await spawned.stdin.end()
  } catch (err) {
    details.raised = errorText(err)
    await spawned.kill().catch(() => {})
    return `spawn('cat') stdin failed: ${errorText(err)}`
  }
  const exitCode = await within(spawned.wait(), SPAWN_WAIT_MS, 'timeout')
  if (exitCode === 'timeout') await spawned.kill().catch(() => {})
  const output = await within(stdout, 1000, '')
  Object.assign(details, { command: 'cat', stdin: 'ping\n', exit_code: exitCode, stdout: output })
  if (exitCode === 'timeout') return `spawn('cat') did not exit within ${SPAWN_WAIT_MS / 1000}s after stdin.end()`
  if (output !== 'ping\n' || exitCode !== 0) {
    return `spawn('cat') echoed ${JSON.stringify(output)} with exit code ${exitCode} (expected "ping\\n", 0)`
  }
  return null
}

start(() =>
  runFramework({
    name: 'tanstack-ai',
    packages: PACKAGES,
    runnerUrl: import.meta.url,
    backend:
      'own: frameworks/tanstack-ai/e2b-sandbox.mjs (a SandboxHandle for @tanstack/ai-sandbox; @tanstack/ai-sandbox-e2b is not published)',
    make: (modules, task) => new TanStack(modules, task),
    killSandbox: (modules, id) => modules.e2b.Sandbox.kill(id),
    extraSteps: { fw04_spawn_stdin: spawnStdin },
  }),
)

/** `promise`, or `fallback` if it has not settled within `ms`; the timer is cleared either way (a pending one
 * keeps the runner from exiting until it fires). */
async function within(promise, ms, fallback) {
  let timer
  const late = new Promise((resolve) => (timer = setTimeout(() => resolve(fallback), ms)))
  try {
    return await Promise.race([promise, late])
  } finally {
    clearTimeout(timer)
  }
}
