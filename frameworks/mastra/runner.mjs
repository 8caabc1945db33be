// Mastra runner: a Mastra `Agent` (@mastra/core) whose `Workspace` sandbox is @mastra/e2b's `E2BSandbox`,
// talking to the model through the AI SDK's OpenAI-compatible provider. The agent's tools are the ones
// Mastra's workspace makes for an E2B sandbox (mastra_workspace_execute_command, get_process_output,
// kill_process); with no workspace filesystem there are no file tools, so the agent writes and reads
// /home/user/proof.txt through the shell. The verify read and the probes go through the same
// `E2BSandbox` (its executeCommand and the E2B sandbox it exposes). Task, steps, pass rule and
// transcript: ../proof.mjs.

import { lifetimeMs, runFramework, start } from '../proof.mjs'

// Mastra's telemetry stays off; nothing here may reach the network.
process.env.MASTRA_TELEMETRY_DISABLED = '1'

const PACKAGES = ['@mastra/e2b', '@mastra/core/agent', '@mastra/core/workspace', '@ai-sdk/openai-compatible', 'e2b']
const INSTRUCTIONS = 'You operate a Linux sandbox through your tools. Do exactly what the user asks.'
const MAX_STEPS = 8
const SANDBOX_TIMEOUT_MS = 600_000

/** A tool result as the transcript shows it: text as is, anything else as JSON. */
const resultText = (value) => (typeof value === 'string' ? value : JSON.stringify(value ?? null))

class Mastra {
  constructor(modules, task) {
    this.e2b = modules['@mastra/e2b']
    this.Agent = modules['@mastra/core/agent'].Agent
    this.Workspace = modules['@mastra/core/workspace'].Workspace
    this.provider = modules['@ai-sdk/openai-compatible']
    const options = task.options ?? {}
    this.model = options.model ?? {}
    this.prompt = String(options.prompt ?? '')
    this.attempts = Math.max(1, Number(options.attempts ?? 2))
    this.metadata = { ...task.metadata }
    this.sandboxes = []
  }

  async open() {
    // `template: 'base'`: without one, E2BSandbox builds its own FUSE-mount template first.
    const sandbox = new this.e2b.E2BSandbox({ template: 'base', metadata: this.metadata, timeout: lifetimeMs(SANDBOX_TIMEOUT_MS) })
    const workspace = new this.Workspace({ sandbox })
    await workspace.init()
    const id = sandbox.e2b.sandboxId
    this.sandboxes.push(id)
    return { id, sandbox, workspace }
  }

  async ask(handle, run) {
    const key = process.env[this.model.key_env ?? ''] ?? ''
    const openai = this.provider.createOpenAICompatible({ name: 'openai-compatible', baseURL: this.model.base_url, apiKey: key })
    const agent = new this.Agent({
      id: 'e2b-bench-proof',
      name: 'e2b-bench proof agent',
      instructions: INSTRUCTIONS,
      model: openai.chatModel(this.model.name),
      workspace: handle.workspace,
    })
    const calls = new Map()
    const result = await agent.generate(this.prompt, {
      maxSteps: MAX_STEPS,
      onStepFinish: ({ toolCalls = [], toolResults = [] }) => {
        for (const { payload } of toolCalls) {
          const record = { name: payload.toolName, arguments: payload.args ?? {}, result: '', error: false }
          calls.set(payload.toolCallId, record)
          run.calls.push(record)
        }
        for (const { payload } of toolResults) {
          const record = calls.get(payload.toolCallId)
          if (!record) continue
          record.result = resultText(payload.result)
          record.error = Boolean(payload.isError)
        }
      },
    })
    run.answer = result.text
  }

  async read(handle, path) {
    return handle.sandbox.e2b.files.read(path)
  }

  async exec(handle, command) {
    const { exitCode, stdout, stderr } = await handle.sandbox.executeCommand(command)
    return { exitCode, stdout, stderr }
  }

  close(handle) {
    return handle.workspace.destroy()
  }
}

start(() =>
  runFramework({
    name: 'mastra',
    packages: PACKAGES,
    runnerUrl: import.meta.url,
    backend: 'upstream: @mastra/e2b E2BSandbox (a @mastra/core Workspace sandbox)',
    make: (modules, task) => new Mastra(modules, task),
    killSandbox: (modules, id) => modules.e2b.Sandbox.kill(id),
  }),
)
