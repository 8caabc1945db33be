// The Node runner kit: the JSON-lines protocol (version 1) every Node runner speaks: the SDK suites
// (driver.mjs: quickstart, probes), the benchmark (bench_runner.mjs) and the TanStack AI runner.
// Node's standard library only. Protocol (docs/ARCHITECTURE.md, schemas in bench/schemas/
// task.schema.json and event.schema.json): one task object on stdin; on stdout `hello`, the suite's
// events and a `footer` last. The task is the single source of what to run: `steps` (prerequisites
// included, in run order), `depends`, the sandbox `metadata` that tags the run, `env` and `options`.

import { writeSync } from 'node:fs'

export const PROTOCOL = 1
export const SDK_GAP = 'sdk_gap' // skip reason: the pinned SDK has no API for what the step exercises

/** The step cannot run on this runner; `reason` says why in a word the harness judges (`sdk_gap`). */
export class Skip extends Error {
  constructor(message, reason = SDK_GAP) {
    super(message)
    this.reason = reason
  }

  get error() {
    return this.reason === SDK_GAP ? `not in this SDK: ${this.message}` : this.message
  }
}

export function emit(event) {
  // Synchronous write: an event is on the pipe before the next step starts (or the process dies).
  writeSync(1, `${JSON.stringify(event)}\n`)
}

export function hello(runner, pins, extra = {}) {
  emit({ type: 'hello', protocol: PROTOCOL, runner, pins, language: 'js', ...extra })
}

export function footer(completed, extra = {}) {
  emit({ type: 'footer', completed, ...extra })
}

/** A step event; a `Skip` makes it `skip` with its structured reason. */
export function stepEvent(id, outcome, durationMs, error, details, skip = null) {
  const event = { type: 'step', id, outcome, duration_ms: durationMs, error, details }
  if (skip !== null) Object.assign(event, { outcome: 'skip', error: skip.error, skip: { reason: skip.reason, message: skip.message } })
  return event
}

export function readStdin() {
  return new Promise((resolve, reject) => {
    const chunks = []
    process.stdin.on('data', (chunk) => chunks.push(chunk))
    process.stdin.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')))
    process.stdin.on('error', reject)
  })
}

/** The task from stdin, with its `env` applied to this process; a task of another protocol ends the runner. */
export async function readTask() {
  // The SDK or a dependency must never write on the protocol stream.
  for (const level of ['log', 'info', 'debug', 'warn']) console[level] = console.error
  const task = JSON.parse(await readStdin())
  if (task?.protocol !== PROTOCOL) {
    console.error(`runner: task is not protocol ${PROTOCOL}: ${JSON.stringify(task).slice(0, 200)}`)
    footer(false, { reason: `task is not protocol ${PROTOCOL}` })
    process.exit(2)
  }
  for (const [key, value] of Object.entries(task.env ?? {})) process.env[key] = String(value)
  return task
}

/** The first prerequisite of `id` that did not pass, if any. */
export function blocker(id, depends, outcomes) {
  return (depends[id] ?? []).find((dep) => outcomes.get(dep) !== 'pass')
}

/**
 * Run the task's steps in order with `run(id) -> {outcome, error, details}`; a step whose prerequisite
 * did not pass is `error` without running, a thrown `Skip` is `skip`. `after(id, event)` runs after
 * each step's event is out; `stopped()` ends the loop early. Returns the outcome of each step.
 */
export async function runSteps(task, run, { after = () => {}, stopped = () => false } = {}) {
  const depends = task.depends ?? {}
  const outcomes = new Map()
  for (const id of task.steps ?? []) {
    const blocked = blocker(id, depends, outcomes)
    const started = performance.now()
    let event
    if (blocked !== undefined) {
      event = stepEvent(id, 'error', 0, `depends on ${blocked}`, {})
    } else {
      // the harness times the step's deadline from here; `at` places its exchanges on the wire log's clock
      emit({ type: 'start', id, at: Date.now() / 1000 })
      try {
        const { outcome, error, details } = await run(id)
        event = stepEvent(id, outcome, Math.round((performance.now() - started) * 1000) / 1000, error, details)
      } catch (err) {
        if (!(err instanceof Skip)) throw err
        event = stepEvent(id, 'skip', Math.round((performance.now() - started) * 1000) / 1000, null, {}, err)
      }
    }
    if (stopped()) break
    outcomes.set(id, event.outcome)
    emit(event)
    after(id, event)
  }
  return outcomes
}
