// TanStack AI runner: chat() from @tanstack/ai with an OpenAI adapter and three tools (exec, write_file,
// read_file) over an E2B SandboxHandle for @tanstack/ai-sandbox (./e2b-sandbox.mjs, the project's own
// provider: TanStack's is not published). The same task, steps, pass rule and transcript as the Python
// framework runners (../proof.py). The protocol (version 1: one task on stdin, `hello`, `step`,
// `transcript` and `footer` events out) is the Node runner kit's (sandboxes/e2b/ts/runkit.mjs).
// Packages load from the Node project first on NODE_PATH.

import { existsSync, readFileSync } from 'node:fs'
import { delimiter, dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

import { emit, footer, hello, readTask, runSteps } from '../../sandboxes/e2b/ts/runkit.mjs'
import { e2bSandbox } from './e2b-sandbox.mjs'

const PROOF_PATH = '/home/user/proof.txt'
const EXPECTED_WORD = 'Linux'
const EXCERPT_CHARS = 2000
const PACKAGES = ['@tanstack/ai', '@tanstack/ai-openai', '@tanstack/ai-sandbox', 'e2b']
const PROBES = { fw02_exit_code: 'exit 5', fw03_late_output: 'sleep 1; echo late' }
const SPAWN_WAIT_MS = 15_000


function projectRoots() {
  const fromPath = (process.env.NODE_PATH || '').split(delimiter).filter(Boolean)
  const projects = fromPath.map((entry) => (entry.endsWith('node_modules') ? dirname(entry) : entry))
  return projects.length > 0 ? projects : [dirname(fileURLToPath(import.meta.url))]
}

/** The ESM entry file of a package, from its `exports` (import condition), `module` or `main`. */
function entryOf(manifest) {
  let target = manifest.exports?.['.'] ?? manifest.exports
  while (target && typeof target === 'object') target = target.import ?? target.default ?? target.node
  return target ?? manifest.module ?? manifest.main ?? 'index.js'
}

async function loadPackages() {
  const roots = projectRoots()
  const modules = {}
  const versions = {}
  for (const name of PACKAGES) {
    const directory = roots.map((root) => join(root, 'node_modules', name)).find((dir) => existsSync(join(dir, 'package.json')))
    if (!directory) throw new Error(`${name} is not installed in ${roots.join(', ')}`)
    const manifest = JSON.parse(readFileSync(join(directory, 'package.json'), 'utf8'))
    versions[name] = manifest.version
    modules[name] = await import(pathToFileURL(join(directory, entryOf(manifest))).href)
  }
  return { modules, versions }
}

// --- the pass rule (as in ../proof.py) -------------------------------------------------------------

const oneLine = (text, limit = 300) => {
  const flat = String(text ?? '').split(/\s+/).filter(Boolean).join(' ')
  return flat.length <= limit ? flat : `${flat.slice(0, limit - 1)}…`
}
const excerpt = (text) =>
  typeof text === 'string' && text.length > EXCERPT_CHARS
    ? `${text.slice(0, EXCERPT_CHARS)}... [${text.length - EXCERPT_CHARS} more chars]`
    : text
const errorText = (err) => oneLine(`${err?.name ?? 'Error'}: ${err?.message ?? err}`, 600)

function outputText(result) {
  try {
    const parsed = JSON.parse(result)
    if (parsed && typeof parsed === 'object') {
      for (const key of ['stdout', 'content', 'output', 'result']) if (typeof parsed[key] === 'string') return parsed[key]
    }
  } catch {
    // Not JSON: the result is the text itself.
  }
  return result
}

const unameLine = (text) =>
  String(text ?? '')
    .split('\n')
    .find((line) => line.includes(EXPECTED_WORD))
    ?.trim() ?? null

function judge(run, verify) {
  const problems = run.calls.filter((c) => c.error).map((c) => `${c.name} failed: ${oneLine(c.result)}`)
  const unameCalls = run.calls.filter((c) => JSON.stringify(c.arguments).includes('uname'))
  const line = unameCalls.map((c) => unameLine(outputText(c.result))).find((found) => found) ?? null
  if ('error' in verify) problems.push(`verify read of ${PROOF_PATH} failed: ${verify.error}`)
  else if (line !== null && !String(verify.content ?? '').includes(line)) {
    problems.push(`verify read of ${PROOF_PATH} lacks the uname output: ${JSON.stringify(oneLine(verify.content))}`)
  }
  if (unameCalls.length === 0) problems.push('the agent never ran uname')
  else if (line === null) {
    const shown = unameCalls.map((c) => JSON.stringify(oneLine(c.result, 120))).join('; ')
    problems.push(`no uname result shows '${EXPECTED_WORD}': ${shown}`)
  }
  const words = (run.answer ?? '').split(/\s+/).filter(Boolean)
  const answerWord = words.length > 0 ? words[0].replace(/^[.,:;!`'"]+|[.,:;!`'"]+$/g, '') : ''
  if (answerWord !== EXPECTED_WORD) {
    problems.push(`answer ${JSON.stringify(oneLine(run.answer ?? '', 120))} does not start with '${EXPECTED_WORD}'`)
  }
  return { passed: problems.length === 0, uname_output: line, answer_word: answerWord, problems }
}

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
      { metadata: { ...task.metadata }, timeoutMs: 600_000 },
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

// --- steps ---------------------------------------------------------------------------------------

async function proofTask(framework, transcript, details) {
  let error = null
  for (let number = 1; number <= framework.attempts; number += 1) {
    const run = { calls: [], answer: null }
    const record = { attempt: number }
    let verify = {}
    const started = performance.now()
    let handle = null
    try {
      handle = await framework.open()
      record.sandbox_id = handle.id
      try {
        await framework.ask(handle, run)
      } catch (err) {
        record.error = errorText(err)
      }
      try {
        verify = { content: excerpt(await handle.fs.read(PROOF_PATH)) }
      } catch (err) {
        verify = { error: errorText(err) }
      }
    } catch (err) {
      record.error ??= errorText(err)
      if (!('content' in verify) && !('error' in verify)) verify = { error: 'not read: the session failed' }
    } finally {
      if (handle) await handle.destroy().catch(() => {})
    }
    const verdict = judge(run, verify)
    if (record.error) {
      verdict.problems.unshift(`the agent run raised ${oneLine(record.error)}`)
      verdict.passed = false
    }
    transcript.attempts.push({
      ...record,
      tool_calls: run.calls.map((c) => ({ ...c, result: excerpt(c.result) })),
      answer: run.answer,
      verify_read: verify,
      verdict,
      duration_ms: Math.round((performance.now() - started) * 10) / 10,
    })
    emit({ type: 'transcript', transcript })
    Object.assign(details, { attempt: number, answer: run.answer, verify_read: verify, problems: verdict.problems })
    if (verdict.passed) return null
    error = `attempt ${number}/${framework.attempts}: ${verdict.problems.join('; ')}`
  }
  return error
}

async function probe(step, handle, details) {
  const command = PROBES[step]
  let result
  try {
    result = await handle.process.exec(command)
  } catch (err) {
    details.raised = errorText(err)
    return `\`${command}\` raised ${errorText(err)}`
  }
  Object.assign(details, { command, exit_code: result.exitCode, stdout: result.stdout, stderr: result.stderr })
  if (step === 'fw02_exit_code' && result.exitCode !== 5) {
    return `\`${command}\` reported as exit code ${result.exitCode} (expected 5)`
  }
  if (step === 'fw03_late_output' && result.stdout.trim() !== 'late') {
    return `no output from \`${command}\`: stdout ${JSON.stringify(result.stdout)} (expected 'late'), exit code ${result.exitCode}`
  }
  return null
}

async function spawnStdin(handle, details) {
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
  const timeout = new Promise((resolve) => setTimeout(() => resolve('timeout'), SPAWN_WAIT_MS))
  const exitCode = await Promise.race([spawned.wait(), timeout])
  if (exitCode === 'timeout') await spawned.kill().catch(() => {})
  const output = await Promise.race([stdout, new Promise((resolve) => setTimeout(() => resolve(''), 1000))])
  Object.assign(details, { command: 'cat', stdin: 'ping\n', exit_code: exitCode, stdout: output })
  if (exitCode === 'timeout') return `spawn('cat') did not exit within ${SPAWN_WAIT_MS / 1000}s after stdin.end()`
  if (output !== 'ping\n' || exitCode !== 0) {
    return `spawn('cat') echoed ${JSON.stringify(output)} with exit code ${exitCode} (expected "ping\\n", 0)`
  }
  return null
}

async function main() {
  process.on('SIGTERM', () => process.exit(143))
  const task = await readTask()
  const { modules, versions } = await loadPackages()
  const framework = new TanStack(modules, task)
  const backend = 'own: frameworks/tanstack-ai/e2b-sandbox.mjs (a SandboxHandle for @tanstack/ai-sandbox; @tanstack/ai-sandbox-e2b is not published)'
  hello(task.runner, versions, { framework: 'tanstack-ai', backend })
  const transcript = {
    framework: 'tanstack-ai',
    runner: task.runner,
    backend,
    sandbox_tagging: `metadata {'${Object.keys(task.metadata)[0]}': <run id>}`,
    model: { base_url: framework.model.base_url, name: framework.model.name, scripted: Boolean(framework.model.scripted) },
    task: framework.prompt,
    attempts: [],
    probes: {},
    sandboxes: framework.sandboxes,
  }
  let probeHandle = null
  const run = async (step) => {
    const details = {}
    let error
    try {
      if (step === 'fw01_proof_task') error = await proofTask(framework, transcript, details)
      else if (step in PROBES || step === 'fw04_spawn_stdin') {
        probeHandle ??= await framework.open()
        error = step in PROBES ? await probe(step, probeHandle, details) : await spawnStdin(probeHandle, details)
        transcript.probes[step] = details
      } else {
        return { outcome: 'error', error: `runner has no implementation of step ${step}`, details: {} }
      }
    } catch (err) {
      error = errorText(err)
    }
    return { outcome: error ? 'fail' : 'pass', error: error ?? null, details }
  }
  try {
    await runSteps(task, run, { after: () => emit({ type: 'transcript', transcript }) })
  } finally {
    if (probeHandle) await probeHandle.destroy().catch(() => {})
  }
  const cleanup = {}
  for (const id of framework.sandboxes) {
    try {
      cleanup[id] = (await modules.e2b.Sandbox.kill(id)) ? 'killed' : 'already gone'
    } catch (err) {
      cleanup[id] = errorText(err)
    }
  }
  transcript.cleanup = cleanup
  emit({ type: 'transcript', transcript })
  footer(true, { cleanup })
}

main().catch((err) => {
  console.error(err?.stack ?? String(err))
  process.exit(1)
})
