// The proof task and symptom probes, shared by the Node framework runners (the counterpart of
// ./proof.py). A runner describes its framework as an object with
//   open() -> handle           a fresh backend and sandbox (handle.id: the sandbox id)
//   ask(handle, run)           the agent once; it pushes its tool calls ({name, arguments, result, error})
//                              into run.calls and sets run.answer
//   read(handle, path)         a file read through the framework's backend
//   exec(handle, command)      a shell command through the backend -> {exitCode, stdout, stderr}
//   close(handle)              kill the sandbox
//   sandboxes                  every sandbox id it opened (the clean-up kills whatever is left)
// and `runFramework` does the rest: the steps of frameworks/manifest.toml, up to `attempts` tries of the
// proof task, the pass rule (as in ./proof.py) and the transcript. The protocol (version 1) is the Node
// runner kit's (sandboxes/e2b/ts/runkit.mjs). Node's standard library only.

import { existsSync, readFileSync } from 'node:fs'
import { delimiter, dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

import { emit, footer, hello, readTask, runSteps } from '../sandboxes/e2b/ts/runkit.mjs'

export const PROOF_PATH = '/home/user/proof.txt'
export const EXPECTED_WORD = 'Linux'
export const PROBES = { fw02_exit_code: 'exit 5', fw03_late_output: 'sleep 1; echo late' }
const EXCERPT_CHARS = 2000

/** Where the runner's packages are: the Node projects on NODE_PATH, else the runner's own folder. */
function projectRoots(runnerUrl) {
  const fromPath = (process.env.NODE_PATH || '').split(delimiter).filter(Boolean)
  const projects = fromPath.map((entry) => (entry.endsWith('node_modules') ? dirname(entry) : entry))
  return projects.length > 0 ? projects : [dirname(fileURLToPath(runnerUrl))]
}

/** The ESM entry file of a package (or of one of its subpaths), from its `exports`, `module` or `main`. */
function entryOf(manifest, subpath = '.') {
  let target = manifest.exports?.[subpath] ?? (subpath === '.' ? manifest.exports : undefined)
  while (target && typeof target === 'object') target = target.import ?? target.default ?? target.node
  return target ?? (subpath === '.' ? (manifest.module ?? manifest.main ?? 'index.js') : subpath)
}

/**
 * Import `names` (package names, or `package/subpath`) from the runner's pinned Node project; returns
 * the modules by name and the installed version of each package.
 */
export async function loadPackages(names, runnerUrl) {
  const roots = projectRoots(runnerUrl)
  const modules = {}
  const versions = {}
  for (const name of names) {
    const parts = name.split('/')
    const packageName = parts.slice(0, name.startsWith('@') ? 2 : 1).join('/')
    const subpath = ['.', ...parts.slice(name.startsWith('@') ? 2 : 1)].join('/')
    const directory = roots
      .map((root) => join(root, 'node_modules', packageName))
      .find((dir) => existsSync(join(dir, 'package.json')))
    if (!directory) throw new Error(`${packageName} is not installed in ${roots.join(', ')}`)
    const manifest = JSON.parse(readFileSync(join(directory, 'package.json'), 'utf8'))
    versions[packageName] = manifest.version
    modules[name] = await import(pathToFileURL(join(directory, entryOf(manifest, subpath))).href)
  }
  return { modules, versions }
}

// --- the pass rule (as in ./proof.py) --------------------------------------------------------------

export const oneLine = (text, limit = 300) => {
  const flat = String(text ?? '').split(/\s+/).filter(Boolean).join(' ')
  return flat.length <= limit ? flat : `${flat.slice(0, limit - 1)}…`
}
export const excerpt = (text) =>
  typeof text === 'string' && text.length > EXCERPT_CHARS
    ? `${text.slice(0, EXCERPT_CHARS)}... [${text.length - EXCERPT_CHARS} more chars]`
    : text
export const errorText = (err) => oneLine(`${err?.name ?? 'Error'}: ${err?.message ?? err}`, 600)

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

export function judge(run, verify) {
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

// --- steps ---------------------------------------------------------------------------------------

const quoted = (text) => `'${String(text).replaceAll("'", "'\\''")}'`

/**
 * `e2b-bench repro`: recorded tool calls through the framework's backend, no model (as ./proof.py's `replay`):
 * a command (`command`/`cmd`, or `code` run by python3) with `exec`, a write (`path`/`file_path` + `content`)
 * as a shell redirect, a read with `read`. The recorded uname line in a later call becomes this sandbox's.
 */
async function replay(framework, handle, calls, run) {
  const recorded = calls.map((c) => unameLine(outputText(String(c.result ?? '')))).find((line) => line) ?? null
  let seen = null
  for (const call of calls) {
    const args = { ...(call.arguments ?? {}) }
    const text = {}
    for (const [key, value] of Object.entries(args)) {
      if (typeof value === 'string') text[key] = recorded && seen ? value.replaceAll(recorded, seen) : value
    }
    let command = text.command ?? text.cmd ?? (text.code !== undefined ? `python3 -c ${quoted(text.code)}` : null)
    const path = text.path ?? text.file_path ?? null
    if (command === null && path !== null && text.content !== undefined) {
      command = `printf '%s\\n' ${quoted(text.content)} > ${quoted(path)}`
    }
    let result
    let error = false
    if (command !== null) {
      const done = await framework.exec(handle, command)
      result = `${done.stdout ?? ''}${done.stderr ?? ''}`
      error = done.exitCode !== 0 && done.exitCode !== null && done.exitCode !== undefined
    } else if (path !== null) {
      result = await framework.read(handle, path)
    } else {
      continue
    }
    seen ??= unameLine(result)
    run.calls.push({ name: String(call.name), arguments: args, result, error })
  }
  run.answer = seen ? seen.split(/\s+/)[0] : null
}

async function proofTask(framework, transcript, details, calls = null) {
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
        if (calls !== null) await replay(framework, handle, calls, run)
        else await framework.ask(handle, run)
      } catch (err) {
        record.error = errorText(err)
      }
      try {
        verify = { content: excerpt(await framework.read(handle, PROOF_PATH)) }
      } catch (err) {
        verify = { error: errorText(err) }
      }
    } catch (err) {
      record.error ??= errorText(err)
      if (!('content' in verify) && !('error' in verify)) verify = { error: 'not read: the session failed' }
    } finally {
      if (handle) await framework.close(handle).catch(() => {})
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

async function probe(step, framework, handle, details) {
  const command = PROBES[step]
  let result
  try {
    result = await framework.exec(handle, command)
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

/**
 * A framework runner's main: read the task, load `packages`, make the framework with
 * `make(modules, task)`, say hello, run the steps and report clean-up. `extraSteps` maps further step ids
 * to `(framework, handle, details) -> error | null`, run on the probes' handle. `killSandbox(modules, id)`
 * kills what a session left (true: killed, false: already gone).
 */
// The task's sandbox lifetime in ms (bench/remote/lifetimes.py: longer than any step of the task may run on this
// host); a framework gives its sandboxes this when longer than its own choice.
let taskLifetimeMs = 0

/** The lifetime (ms) a framework's sandboxes are created with: its own, or the task's when longer. */
export const lifetimeMs = (ownMs) => Math.max(ownMs, taskLifetimeMs)

export async function runFramework({ name, packages, runnerUrl, backend, tagging, make, killSandbox, extraSteps = {} }) {
  process.on('SIGTERM', () => process.exit(143))
  const task = await readTask()
  taskLifetimeMs = Number(task.options?.sandbox_timeout_s ?? 0) * 1000
  const { modules, versions } = await loadPackages(packages, runnerUrl)
  const framework = await make(modules, task)
  hello(task.runner, versions, { framework: name, backend })
  const model = task.options?.model ?? {}
  const transcript = {
    framework: name,
    runner: task.runner,
    backend,
    sandbox_tagging: tagging ?? `metadata {'${Object.keys(task.metadata)[0]}': <run id>}`,
    model: { base_url: model.base_url, name: model.name, scripted: Boolean(model.scripted) },
    task: String(task.options?.prompt ?? ''),
    attempts: [],
    probes: {},
    sandboxes: framework.sandboxes,
  }
  let probeHandle = null
  const run = async (step) => {
    const details = {}
    let error
    try {
      if (step === 'fw01_proof_task') error = await proofTask(framework, transcript, details, task.options?.replay ?? null)
      else if (step in PROBES || step in extraSteps) {
        probeHandle ??= await framework.open()
        error = step in PROBES ? await probe(step, framework, probeHandle, details) : await extraSteps[step](framework, probeHandle, details)
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
    if (probeHandle) await framework.close(probeHandle).catch(() => {})
  }
  const cleanup = {}
  for (const id of framework.sandboxes) {
    try {
      cleanup[id] = (await killSandbox(modules, id)) ? 'killed' : 'already gone'
    } catch (err) {
      cleanup[id] = errorText(err)
    }
  }
  transcript.cleanup = cleanup
  emit({ type: 'transcript', transcript })
  footer(true, { cleanup })
}

/** Run `main` and end the process with 1 (stack on stderr) if it throws. */
export function start(main) {
  main().catch((err) => {
    console.error(err?.stack ?? String(err))
    process.exit(1)
  })
}
