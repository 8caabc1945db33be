// What every JS SDK suite script shares (runner.mjs: quickstart, probes.mjs: probes): loading the SDK
// under test, the step registry, the sandbox context and clean-up. The protocol (version 1) is the
// runner kit's, runkit.mjs.
//
// The SDK is loaded from the project whose node_modules is the first entry of NODE_PATH (falling back
// to a node_modules beside this file). The task carries the step ids (`steps`, in run order,
// prerequisites included) and their prerequisites (`depends`, id -> [ids]) from the suite's `ts` table
// of sandboxes/e2b/manifest.toml, and the sandbox `metadata` tagging the run; an id without a
// `step(...)` is an error. Option `crash_after: <id>` makes the runner SIGKILL itself after that step
// (and `hang_in: <id>` makes it go silent in that step, `leave_after: <id>` leaves a command running on the
// shared sandboxes after that step, `leave_in: <id>` in that step)
// (fault injection). Endpoint settings (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL) come from the
// process environment, plus the task's `env`, so the SDK configures itself exactly as for a user.
//
// A step records what it observed in `obs` and ends in one of these ways: it returns (`pass`), throws
// `Fail` (an assertion about E2B's documented behaviour did not hold: `fail`), `Deviation` (a probe
// observed behaviour that differs from E2B's: `deviation`), `Refused` (the endpoint refused the call;
// status, code and message are recorded for the declarations to match: `refused`) or `NotInSdk` (the
// pinned SDK lacks the API: `skip` with reason `sdk_gap`). Any other exception is an observed SDK
// failure (`fail`).

import { createRequire } from 'node:module'
import { delimiter, dirname } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

import { Hygiene, handedPids, reachable } from './hygiene.mjs'
import { Skip, emit, footer, hello, readStdin, readTask, runSteps } from './runkit.mjs'

export { Skip, emit, readStdin }

export const LANGUAGE = 'js'
export const RUN_TAG = 'e2b-bench-run'
const EXCERPT_CHARS = 2048

// --- the SDK under test ------------------------------------------------------------------------

function sdkRoots() {
  const fromPath = (process.env.NODE_PATH || '').split(delimiter).filter(Boolean)
  // `require.resolve(..., {paths})` looks in `<path>/node_modules`: hand it the project directory.
  const projects = fromPath.map((entry) => (entry.endsWith('node_modules') ? dirname(entry) : entry))
  return projects.length > 0 ? projects : [dirname(fileURLToPath(import.meta.url))]
}

export async function loadSdk(name = 'e2b') {
  const require = createRequire(import.meta.url)
  const paths = sdkRoots()
  const manifest = require(require.resolve(`${name}/package.json`, { paths }))
  const module = await import(pathToFileURL(require.resolve(name, { paths })).href)
  return { sdk: module, version: manifest.version }
}

// --- outcomes ----------------------------------------------------------------------------------

/** An assertion about the endpoint's observable behaviour did not hold. */
export class Fail extends Error {}

/** A probe observed behaviour that differs from E2B's. */
export class Deviation extends Error {}

/** The endpoint refused the call; `details` carries status_code, error_code and message. */
export class Refused extends Error {
  constructor(summary, details) {
    super(summary)
    this.details = Object.fromEntries(Object.entries(details).filter(([, value]) => value !== undefined && value !== null))
  }
}

/** The pinned SDK has no API for what the step exercises (a `Skip` with reason `sdk_gap`). */
export class NotInSdk extends Skip {}

export function expect(condition, message) {
  if (!condition) throw new Fail(message)
}

/** The SDK must offer `owner[name]` as a function, or the step is skipped for this pin. */
export function need(owner, name, what) {
  if (typeof owner?.[name] !== 'function') throw new NotInSdk(what)
}

export function show(value) {
  if (value instanceof Date) return value.toISOString()
  return JSON.stringify(value) ?? String(value)
}

export function excerpt(value) {
  if (typeof value === 'string' && value.length > EXCERPT_CHARS) {
    return `${value.slice(0, EXCERPT_CHARS)}... [${value.length - EXCERPT_CHARS} more chars]`
  }
  return value
}

export function oneLine(text) {
  const flat = String(text).trim().replaceAll('\r', '\\r').replaceAll('\n', '\\n')
  return flat.length <= 500 ? flat : `${flat.slice(0, 500)}...`
}

export const NOT_RECEIVED = 'not received by the client within'
const RECEIPT_WAIT_S = 5 // at most (on a quiet host) for a client to receive a line and answer it with a command
// However slow the host, within this: a command waits for two receipts at most, and both must end within the
// SDKs' default command timeout (60 s), or a held-back line would end the call by the client's deadline instead of
// being named by the command.
const RECEIPT_WAIT_MAX_S = 25

/**
 * Shell that waits (at most RECEIPT_WAIT_S, scaled) for the file `gate`, made by the client once it has received
 * `what`, and says on stderr when it did not come: so output that must be sent as it comes is written in lockstep
 * with its receipt, and a host's load never merges it, while an endpoint that holds output back is named.
 */
export function waitUntilSeen(ctx, gate, what) {
  const waitS = Math.min(Math.ceil(RECEIPT_WAIT_S * ctx.slowness), RECEIPT_WAIT_MAX_S)
  return (
    `{ timeout ${waitS} sh -c 'until [ -e "$0" ]; do sleep 0.02; done' ${gate} ` +
    `|| echo "${what} ${NOT_RECEIVED} ${waitS} s" >&2; }`
  )
}

export function errorDetails(err) {
  const details = { exception: err?.name ?? typeof err, message: excerpt(String(err?.message ?? err)) }
  for (const key of ['statusCode', 'exitCode', 'error', 'stdout', 'stderr']) {
    try {
      if (err?.[key] !== undefined) details[key] = excerpt(err[key])
    } catch {
      // A getter of a half-built error: the class and message are enough.
    }
  }
  return details
}

/** Await `promise`, which must reject with the SDK class `cls`; return the error. */
export async function expectRejects(promise, cls, what, obs, key) {
  let value
  try {
    value = await promise
  } catch (err) {
    obs[key] = errorDetails(err)
    expect(err instanceof cls && err.name === cls.name, `${what} raised ${err?.name}: ${oneLine(err?.message)}, expected ${cls.name}`)
    return err
  }
  obs[key] = { returned: excerpt(show(value)) }
  throw new Fail(`${what} returned ${oneLine(excerpt(show(value)))} instead of raising ${cls.name}`)
}

export function sameList(actual, wanted) {
  return Array.isArray(actual) && actual.length === wanted.length && actual.every((item, i) => item === wanted[i])
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

export async function until(predicate, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  while (!predicate()) {
    if (Date.now() > deadline) return false
    await sleep(20)
  }
  return true
}

// --- steps -------------------------------------------------------------------------------------

const STEPS = new Map()

export function step(id, run) {
  STEPS.set(id, run)
}

// A sandbox several steps share outlives the run however slow the endpoint (a case's own timeout never cuts
// it short): it lives at least twice the task's lifetime, and before a step it is given that lifetime again once
// a third of it has passed or less than the task's lifetime is left (which outlasts any step's deadline: the
// harness chose it so, bench/remote/lifetimes.py).
export const SHARED_LIFETIME_S = 900

export class Context {
  constructor(sdk, task) {
    const options = task.options ?? {}
    this.sdk = sdk
    this.runId = String(task.run_id)
    this.tags = { ...task.metadata }
    this.template = options.template
    this.sandboxTimeoutMs = Number(options.sandbox_timeout_s ?? 120) * 1000
    this.sharedTimeoutMs = Math.max(2 * this.sandboxTimeoutMs, SHARED_LIFETIME_S * 1000)
    this.sharedRefreshMs = Math.min(this.sharedTimeoutMs / 3, this.sharedTimeoutMs - this.sandboxTimeoutMs)
    this.measuredSlowness = Number(options.slowness) || Math.max(1, this.sandboxTimeoutMs / 120_000)
    this.refreshed = new Map() // shared sandbox id -> when its lifetime was last given again (ms)
    this.sandbox = null
    this.sandboxId = null
    this.created = []
    this.killed = new Set()
    this.state = {}
    this.leaveIn = options.leave_in
    this.hygiene = new Hygiene(this.slowness, this.killed, (id) => killOne(this, id), Boolean(options.census))
  }

  /**
   * `sandboxId` is shared by later steps: each step's leftovers on it are ended, and it is checked before each step
   * (hygiene.mjs). `current()` is the SDK object standing for it now (null once dropped); `replace()` drops it so
   * the next step that needs it makes a fresh one (null: later steps need this one's state).
   */
  async watch(sandboxId, current, replace = null) {
    await this.hygiene.watch(sandboxId, current, replace)
  }

  /** The running step uses this watched sandbox (so its timeouts are counted against that sandbox). */
  uses(sandboxId) {
    this.hygiene.used(sandboxId)
  }

  /** The sandboxes the context keeps for later steps: a step's other sandboxes are killed when it ends. */
  kept() {
    const kept = reachable(this.state, 3, reachable(this.sandbox))
    if (this.sandboxId) kept.add(this.sandboxId)
    return kept
  }

  /** Pids of the command handles the context keeps for a later step (that step ends them). */
  handed() {
    const own = Object.entries(this).filter(([key]) => !['sdk', 'hygiene', 'sandbox', 'killed', 'created'].includes(key))
    return handedPids(Object.fromEntries(own))
  }

  /** How much slower than a quiet host this run is, as the harness measured it for the task. */
  get slowness() {
    return Math.max(1, this.measuredSlowness)
  }

  /** The task's sandbox metadata: every sandbox of the run carries it. */
  get metadata() {
    return { ...this.tags }
  }

  /** A sandbox tagged with the run (killed when the step ends, unless the context keeps it for later steps). */
  async newSandbox(options = {}) {
    const opts = { timeoutMs: this.sandboxTimeoutMs, metadata: this.metadata, ...options }
    const sandbox = this.template
      ? await this.sdk.Sandbox.create(this.template, opts)
      : await this.sdk.Sandbox.create(opts)
    this.created.push(sandbox.sandboxId)
    return sandbox
  }

  /** `sandboxId` (created with `sharedTimeoutMs`) is shared by later steps: keep it alive for them. */
  sharedCreated(sandboxId) {
    this.refreshed.set(sandboxId, Date.now())
  }

  /** A step gave a shared sandbox another lifetime (a resume's default): give it back before the next. */
  lifetimeChanged(sandboxId) {
    this.refreshed.set(sandboxId, -Infinity)
  }

  /** Give each shared sandbox its whole lifetime again once a third of it has passed or less than a step's worth
   * is left, through the REST API (not an SDK call a case would be credited with); one that is gone is the next
   * step's to see. */
  async keepAlive() {
    for (const [id, last] of this.refreshed) {
      if (Date.now() - last < this.sharedRefreshMs) continue
      if (!this.killed.has(id)) {
        await fetch(`${process.env.E2B_API_URL}/sandboxes/${id}/timeout`, {
          method: 'POST',
          headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
          body: JSON.stringify({ timeout: this.sharedTimeoutMs / 1000 }),
        }).catch(() => null)
      }
      this.refreshed.set(id, Date.now())
    }
  }

  /** A create that is expected to fail: if it succeeds anyway, its sandbox is killed when the step ends. */
  async adopt(creating) {
    const stray = await creating
    this.created.push(stray.sandboxId)
    return stray
  }
}

/** Run one registered step: its outcome, error line and observations (a `Skip` propagates). */
async function runStep(ctx, id) {
  const run = STEPS.get(id)
  if (run === undefined) return { outcome: 'error', error: `no implementation for step ${id}`, details: {} }
  await ctx.keepAlive()
  const hygiene = await guarded(() => ctx.hygiene.before(id, ctx.created.length, ctx.handed()))
  const started = performance.now()
  let result
  let skip = null
  try {
    result = await judged(ctx, run)
  } catch (err) {
    if (!(err instanceof Skip)) throw err
    skip = err
    result = { outcome: 'skip', error: null, details: {} }
  }
  const { outcome, error, details } = result
  const durationMs = performance.now() - started
  // Fault injection for the kit's own tests: the step leaves a command running (`leave_in: <id>`).
  if (id === ctx.leaveIn) await ctx.hygiene.leaveRunning()
  const after = await guarded(() => ctx.hygiene.after(id, outcome, error, details, durationMs, ctx.created, ctx.kept(), ctx.handed()))
  for (const [key, value] of Object.entries(after)) hygiene[key] = Array.isArray(value) ? [...(hygiene[key] ?? []), ...value] : value
  if (skip !== null) throw skip
  return Object.keys(hygiene).length ? { outcome, error, details: { ...details, hygiene } } : result
}

/** What a check between steps found; a fault of the check itself is noted, never the step's outcome. */
async function guarded(check) {
  try {
    return await check()
  } catch (err) {
    return { fault: oneLine(`${err?.name}: ${err?.message}`) }
  }
}

/** Run a step body: its outcome, error line and observations (a `Skip` propagates). */
async function judged(ctx, run) {
  const obs = {}
  try {
    await run(ctx, obs)
    return { outcome: 'pass', error: null, details: obs }
  } catch (err) {
    return classify(err, obs)
  }
}

/** What a step's error says of the endpoint: its outcome, error line and observations (a `Skip` propagates). */
function classify(err, obs = {}) {
  if (err instanceof Skip) throw err
  if (err instanceof Fail) return { outcome: 'fail', error: oneLine(err.message), details: obs }
  if (err instanceof Deviation) return { outcome: 'deviation', error: oneLine(err.message), details: obs }
  if (err instanceof Refused) return { outcome: 'refused', error: oneLine(err.message), details: { ...obs, ...err.details } }
  // Any SDK exception is an observed behaviour of the endpoint.
  obs.raised = errorDetails(err)
  obs.stack = excerpt(String(err?.stack ?? '').split('\n').slice(0, 6).join('\n'))
  return { outcome: 'fail', error: oneLine(`${err?.name ?? 'Error'}: ${err?.message ?? err}`), details: obs }
}

/** Kill one sandbox now: what happened, in the footer's words. */
async function killOne(ctx, id) {
  try {
    return (await ctx.sdk.Sandbox.kill(id)) ? 'killed' : 'already gone'
  } catch (err) {
    return oneLine(`${err?.name}: ${err?.message}`)
  }
}

async function cleanup(ctx) {
  const report = {}
  for (const id of ctx.created) {
    if (ctx.killed.has(id)) continue
    try {
      report[id] = (await ctx.sdk.Sandbox.kill(id)) ? 'killed' : 'already gone'
    } catch (err) {
      report[id] = oneLine(`${err?.name}: ${err?.message}`)
    }
    ctx.killed.add(id)
  }
  return report
}

/**
 * Run the task's suite (`suite`) with the steps the calling script registered; returns the exit code.
 * `packages` are the SDKs the script drives: the first is the one steps get as `ctx.sdk`, and the hello
 * event names the installed version of each.
 */
export async function main(suite, packages = ['e2b']) {
  const task = await readTask()
  const loaded = await Promise.all(packages.map((name) => loadSdk(name)))
  const { sdk, version } = loaded[0]
  const pins = Object.fromEntries(packages.map((name, i) => [name, loaded[i].version]))
  hello(task.runner ?? `js-${packages[0]}-${version}`, pins)
  if (task.suite !== suite) {
    console.error(`runner: unknown suite ${show(task.suite)}, this runner runs ${show(suite)}`)
    footer(false, { reason: `unknown suite ${task.suite}` })
    return 2
  }
  const ctx = new Context(sdk, task)
  const crashAfter = task.options?.crash_after
  const leaveAfter = task.options?.leave_after
  const started = performance.now()
  // A harness that gives up on a hung step sends SIGTERM: kill the sandboxes, report nothing more.
  let terminating = false
  process.once('SIGTERM', () => {
    terminating = true
    cleanup(ctx).finally(() => process.exit(143))
  })
  let cleaned = {}
  try {
    // Fault injection for the harness's own tests: go silent for good in this step (`hang_in: <id>`).
    const hangIn = task.options?.hang_in
    const hang = () => new Promise(() => setInterval(() => {}, 1 << 30))
    const runOne = async (id) => {
      const result = await runStep(ctx, id)
      // Fault injection for the kit's own tests: a step that leaves a command running on the shared sandboxes.
      if (id === leaveAfter) await ctx.hygiene.leaveRunning()
      return result
    }
    await runSteps(task, (id) => (id === hangIn ? hang() : runOne(id)), {
      stopped: () => terminating,
      failed: (err) => classify(err), // an error the step did not await: judged as one it raised
      // Fault injection for the harness's own tests: die the hardest way right after this step.
      after: (id) => id === crashAfter && process.kill(process.pid, 'SIGKILL'),
    })
  } finally {
    if (!terminating) cleaned = await cleanup(ctx)
  }
  if (terminating) return 143
  const duration_ms = Math.round((performance.now() - started) * 1000) / 1000
  footer(true, { duration_ms, cleanup: cleaned })
  return 0
}
