// The Node runner kit: the JSON-lines protocol (version 1) every Node runner speaks: the SDK suites
// (driver.mjs: quickstart, probes), the benchmark (bench_runner.mjs) and the TanStack AI runner.
// Node's standard library only. Protocol (docs/ARCHITECTURE.md, schemas in bench/schemas/
// task.schema.json and event.schema.json): one task object on stdin; on stdout `hello`, the suite's
// events and a `footer` last. The task is the single source of what to run: `steps` (prerequisites
// included, in run order), `depends`, the sandbox `metadata` that tags the run, `env` and `options`.

import { AsyncLocalStorage } from 'node:async_hooks'
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
  const late = strays.take()
  emit({ type: 'footer', completed, ...extra, ...(late.length > 0 ? { late_errors: late } : {}) })
  // A step ended by an error it did not await may have left work pending (a timer, a stream) that would keep
  // Node from exiting: the footer is the last word, so the runner ends once the script has set its exit code.
  if (strays.abandoned > 0) setTimeout(() => process.exit(), 0)
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

/** What a runner says of an error its step raised that the step did not handle: its class and message. */
export function raisedText(err) {
  return oneLine(`${err?.name ?? 'Error'}: ${err?.message ?? err}`)
}

function oneLine(text) {
  const flat = String(text).trim().replaceAll('\r', '\\r').replaceAll('\n', '\\n')
  return flat.length <= 500 ? flat : `${flat.slice(0, 500)}...`
}

/** A step's error nobody awaited: the kind (`unhandledRejection`, `uncaughtException`) and the error. */
export class Stray extends Error {
  constructor(kind, reason) {
    super(reason?.message ?? String(reason))
    this.name = reason?.name ?? 'Error'
    this.kind = kind
    this.reason = reason
  }
}

/**
 * Errors no step awaited (an unhandled promise rejection, an exception thrown from a callback) never end the
 * runner: each belongs to the step whose code made it (async context), else to the step running, else to the
 * last one started. One that arrives while its step runs ends that step with the error; one whose step has
 * already ended is listed (`late_errors`) on the next step's event, or on the footer when no step follows.
 */
class Strays {
  constructor() {
    this.context = new AsyncLocalStorage()
    this.running = null // {id, fail}
    this.last = null
    this.active = false // the steps are running (runSteps)
    this.abandoned = 0 // steps ended by such an error while their own code still ran
    this.late = []
    this.installed = false
  }

  install() {
    if (this.installed) return
    this.installed = true
    process.on('unhandledRejection', (reason) => this.arrived('unhandledRejection', reason))
    process.on('uncaughtException', (err) => this.arrived('uncaughtException', err))
  }

  arrived(kind, reason) {
    const owner = this.context.getStore() ?? (this.active ? this.running?.id ?? this.last : null)
    if (owner === null) {
      // Not a step's: the runner's own code failed (loading the SDK, its clean-up), which ends it as Node would.
      console.error(`runner: ${kind} outside any step: ${reason?.stack ?? reason}`)
      process.exit(1)
    }
    console.error(`runner: ${kind} in step ${owner}: ${reason?.stack ?? reason}`)
    if (this.running !== null && owner === this.running.id) {
      this.abandoned += 1
      this.running.fail(new Stray(kind, reason))
    }
    else this.late.push({ step: owner, kind, error: raisedText(reason) })
  }

  /** Run `fn` as step `id`: its result, or the first error of its own it did not handle. */
  during(id, fn) {
    this.last = id
    return new Promise((resolve, reject) => {
      this.running = { id, fail: reject }
      this.context.run(id, () => Promise.resolve().then(fn)).then(resolve, reject)
    }).finally(() => {
      this.running = null
    })
  }

  /** The late errors not said yet, said now. */
  take() {
    return this.late.splice(0)
  }
}

const strays = new Strays()

/** A step's exception the runner's own `run` did not classify: an observed failure, with its message. */
function unclassified(err) {
  const details = { raised: { exception: err?.name ?? typeof err, message: String(err?.message ?? err).slice(0, 2048) } }
  if (err?.stack) details.stack = String(err.stack).split('\n').slice(0, 6).join('\n')
  return { outcome: 'fail', error: raisedText(err), details }
}

/** The first prerequisite of `id` that did not pass, if any. */
export function blocker(id, depends, outcomes) {
  return (depends[id] ?? []).find((dep) => outcomes.get(dep) !== 'pass')
}

/**
 * Run the task's steps in order with `run(id) -> {outcome, error, details}`; a step whose prerequisite
 * did not pass is `error` without running, a thrown `Skip` is `skip`. Any other error of a step (thrown,
 * or one of its promises rejected with nobody awaiting it) fails that step, never the runner: `failed(err)`
 * says how (the runner's own classification, as for an error `run` caught). `after(id, event)` runs after
 * each step's event is out; `stopped()` ends the loop early. Returns the outcome of each step.
 */
export async function runSteps(task, run, { after = () => {}, stopped = () => false, failed = unclassified } = {}) {
  strays.install()
  strays.active = true
  try {
    return await runEach(task, run, after, stopped, failed)
  } finally {
    strays.active = false
  }
}

async function runEach(task, run, after, stopped, failed) {
  const depends = task.depends ?? {}
  const outcomes = new Map()
  for (const id of task.steps ?? []) {
    const blocked = blocker(id, depends, outcomes)
    const started = performance.now()
    const took = () => Math.round((performance.now() - started) * 1000) / 1000
    let event
    if (blocked !== undefined) {
      event = stepEvent(id, 'error', 0, `depends on ${blocked}`, {})
    } else {
      // the harness times the step's deadline from here; `at` places its exchanges on the wire log's clock
      emit({ type: 'start', id, at: Date.now() / 1000 })
      try {
        const { outcome, error, details } = await strays.during(id, () => run(id))
        event = stepEvent(id, outcome, took(), error, details)
      } catch (err) {
        if (err instanceof Skip) event = stepEvent(id, 'skip', took(), null, {}, err)
        else event = failedStep(id, took(), err, failed)
      }
    }
    if (stopped()) break
    const late = strays.take()
    if (late.length > 0) event.details = { ...event.details, late_errors: late }
    outcomes.set(id, event.outcome)
    emit(event)
    after(id, event)
  }
  return outcomes
}

function failedStep(id, durationMs, err, failed) {
  const stray = err instanceof Stray ? err : null
  let judged
  try {
    judged = failed(stray?.reason ?? err)
  } catch (thrown) {
    if (thrown instanceof Skip) return stepEvent(id, 'skip', durationMs, null, {}, thrown)
    judged = unclassified(stray?.reason ?? err)
  }
  const details = { ...(judged.details ?? {}) }
  if (stray !== null) details.unawaited = stray.kind // nobody awaited it: the step ended at once with it
  return stepEvent(id, judged.outcome, durationMs, judged.error, details)
}
