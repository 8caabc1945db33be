// JavaScript benchmark runner: times the unmodified `e2b` npm SDK against the endpoint it is pointed at.
//
// One script serves every pinned Node project, like runner.mjs: the SDK is loaded from the project
// named by NODE_PATH. Protocol (JSON lines, docs/ARCHITECTURE.md): one task on stdin, then on stdout
// `hello`, one `sample` per timed operation as it ends, one `measure` when a measure ends, and a
// `footer` naming what happened to every sandbox. The task and the measure kinds are those of
// sandboxes/e2b/python/bench_runner.py (`tti` in three modes, `run_true`, `upload`, `download`);
// `tti_http` is the Python runner's alone. No new operation starts after `deadline_s`; every
// sandbox created is killed.

import { createHash, randomBytes } from 'node:crypto'
import { LANGUAGE, RUN_TAG, emit, loadSdk, readStdin, sleep } from './driver.mjs'

const SUITE = 'bench'
const TRANSFER_PATH = '/tmp/e2b-bench-transfer.bin'
const WARMUP = { run_true: 2, upload: 1, download: 1 }

const round = (ms) => Math.round(ms * 1000) / 1000
const msSince = (started) => round(performance.now() - started)

function describe(err) {
  const text = `${err?.name ?? 'Error'}: ${err?.message ?? err}`.trim().replaceAll('\n', '\\n')
  return text.length <= 300 ? text : `${text.slice(0, 300)}...`
}

/** A successful time-to-interactive sample: first command done now, the sandbox created after `createdMs`. */
function ready(started, createdMs) {
  const total = msSince(started)
  return { ok: true, ms: total, parts: { create_ms: createdMs, first_run_ms: round(total - createdMs) } }
}

class Bench {
  constructor(sdk, task) {
    this.sdk = sdk
    this.runId = String(task.run_id ?? 'unset')
    this.deadline = performance.now() + Number(task.deadline_s ?? 60) * 1000
    this.sandboxTimeoutMs = Number(task.sandbox_timeout_s ?? 300) * 1000
    this.created = []
    this.killed = new Set()
    this.work = null
    this.payload = null
    this.digest = ''
  }

  get metadata() {
    return { [RUN_TAG]: this.runId }
  }

  expired() {
    return performance.now() >= this.deadline
  }

  sample(measure, index, startMs, outcome) {
    emit({ type: 'sample', measure, index, start_ms: startMs, ...outcome })
  }

  async create() {
    const sandbox = await this.sdk.Sandbox.create({ timeoutMs: this.sandboxTimeoutMs, metadata: this.metadata })
    this.created.push(sandbox.sandboxId)
    return sandbox
  }

  // --- time to interactive --------------------------------------------------------------------
  async ttiSequential(measure) {
    const began = performance.now()
    let attempted = 0
    for (let index = 0; index < Number(measure.count); index++) {
      if (this.expired()) break
      attempted++
      const startMs = msSince(began)
      const started = performance.now()
      let sandbox = null
      let outcome
      try {
        sandbox = await this.create()
        const created = msSince(started)
        await sandbox.commands.run('true')
        outcome = ready(started, created)
      } catch (err) {
        outcome = { ok: false, ms: null, error: describe(err) }
      }
      if (sandbox !== null) {
        const killStarted = performance.now()
        try {
          await sandbox.kill()
          this.killed.add(sandbox.sandboxId)
          outcome.parts = { ...(outcome.parts ?? {}), kill_ms: msSince(killStarted) }
        } catch {
          // left to the final clean-up
        }
      }
      this.sample(measure.id, index, startMs, outcome)
    }
    return { attempted, wall_ms: msSince(began), client: 'Sandbox' }
  }

  /** Staggered (one launch every `interval_ms`) or burst (all at once); all stay alive until the last is ready. */
  async ttiConcurrent(measure) {
    const intervalMs = measure.mode === 'staggered' ? Number(measure.interval_ms ?? 0) : 0
    const began = performance.now()
    const alive = []
    const one = async (index) => {
      const startMs = msSince(began)
      const started = performance.now()
      let outcome
      try {
        const sandbox = await this.create()
        alive.push(sandbox)
        const created = msSince(started)
        await sandbox.commands.run('true')
        outcome = ready(started, created)
      } catch (err) {
        outcome = { ok: false, ms: null, error: describe(err) }
      }
      this.sample(measure.id, index, startMs, outcome)
    }
    const launched = []
    for (let index = 0; index < Number(measure.count); index++) {
      if (this.expired()) break
      launched.push(one(index))
      if (intervalMs) await sleep(intervalMs)
    }
    await Promise.all(launched)
    const wallMs = msSince(began)
    const kills = await Promise.allSettled(alive.map((sandbox) => sandbox.kill()))
    kills.forEach((result, i) => {
      if (result.status === 'fulfilled' && result.value === true) this.killed.add(alive[i].sandboxId)
    })
    return { attempted: launched.length, wall_ms: wallMs, client: 'Sandbox' }
  }

  // --- operations on a ready sandbox ------------------------------------------------------------
  async workSandbox() {
    if (this.work === null) this.work = await this.create()
    return this.work
  }

  payloadOf(size) {
    if (this.payload === null || this.payload.length !== size) {
      this.payload = randomBytes(size)
      this.digest = createHash('sha256').update(this.payload).digest('hex')
    }
    return this.payload.buffer.slice(this.payload.byteOffset, this.payload.byteOffset + this.payload.length)
  }

  async repeat(measure, action, verify = async () => {}) {
    const warmup = WARMUP[measure.kind]
    for (let i = 0; i < warmup; i++) {
      await action()
      await verify()
    }
    const began = performance.now()
    let attempted = 0
    for (let index = 0; index < Number(measure.count); index++) {
      if (this.expired()) break
      attempted++
      const startMs = msSince(began)
      const started = performance.now()
      let outcome
      try {
        await action()
        outcome = { ok: true, ms: msSince(started) }
        await verify() // untimed: a wrong digest fails the sample
      } catch (err) {
        outcome = { ok: false, ms: null, error: describe(err) }
      }
      this.sample(measure.id, index, startMs, outcome)
    }
    return { attempted, wall_ms: msSince(began), client: 'Sandbox', warmup }
  }

  async runTrue(measure) {
    const sandbox = await this.workSandbox()
    return this.repeat(measure, () => sandbox.commands.run('true'))
  }

  async upload(measure) {
    const sandbox = await this.workSandbox()
    const payload = this.payloadOf(Number(measure.bytes))
    const verify = async () => {
      const found = (await sandbox.commands.run(`sha256sum ${TRANSFER_PATH}`)).stdout.split(/\s+/)[0]
      if (found !== this.digest) throw new Error(`sha256 of the uploaded file is ${found}, expected ${this.digest}`)
    }
    return this.repeat(measure, () => sandbox.files.write(TRANSFER_PATH, payload), verify)
  }

  async download(measure) {
    const sandbox = await this.workSandbox()
    await sandbox.files.write(TRANSFER_PATH, this.payloadOf(Number(measure.bytes)))
    let received = null
    const fetch = async () => {
      received = await sandbox.files.read(TRANSFER_PATH, { format: 'bytes' })
    }
    const verify = async () => {
      const found = createHash('sha256').update(received).digest('hex')
      if (found !== this.digest) throw new Error(`sha256 of the downloaded bytes is ${found}, expected ${this.digest}`)
    }
    return this.repeat(measure, fetch, verify)
  }

  // --- clean-up ---------------------------------------------------------------------------------
  async cleanup() {
    const report = {}
    for (const id of this.created) {
      if (this.killed.has(id)) continue
      try {
        report[id] = (await this.sdk.Sandbox.kill(id)) ? 'killed' : 'already gone'
      } catch (err) {
        report[id] = describe(err)
      }
      this.killed.add(id)
    }
    return report
  }
}

async function main() {
  // The SDK or a dependency must never write on the protocol stream.
  for (const level of ['log', 'info', 'debug', 'warn']) console[level] = console.error
  const task = JSON.parse(await readStdin())
  for (const [key, value] of Object.entries(task.env ?? {})) process.env[key] = String(value)
  const { sdk, version } = await loadSdk()
  emit({ type: 'hello', runner: task.runner ?? `js-e2b-${version}`, pins: { e2b: version }, language: LANGUAGE })
  if ((task.suite ?? SUITE) !== SUITE) {
    emit({ type: 'footer', completed: false, reason: `unknown suite ${task.suite}` })
    return 2
  }
  const bench = new Bench(sdk, task)
  const kinds = {
    tti: (m) => (m.mode === 'sequential' ? bench.ttiSequential(m) : bench.ttiConcurrent(m)),
    run_true: (m) => bench.runTrue(m),
    upload: (m) => bench.upload(m),
    download: (m) => bench.download(m),
  }
  // A harness that stops the run sends SIGTERM: kill the sandboxes, report nothing more.
  let terminating = false
  process.once('SIGTERM', () => {
    terminating = true
    bench.cleanup().finally(() => process.exit(143))
  })
  let cleaned = {}
  try {
    for (const measure of task.measures ?? []) {
      if (terminating) break
      const event = { type: 'measure', id: measure.id, planned: Number(measure.count) }
      if (!(measure.kind in kinds)) {
        Object.assign(event, { attempted: 0, error: `this runner has no measure of kind ${measure.kind}` })
      } else if (bench.expired()) {
        Object.assign(event, { attempted: 0, stopped: 'deadline' })
      } else {
        try {
          Object.assign(event, await kinds[measure.kind](measure))
        } catch (err) {
          // e.g. the shared sandbox could not be created
          Object.assign(event, { attempted: event.attempted ?? 0, error: describe(err) })
        }
        if (bench.expired() && event.attempted < event.planned) event.stopped = 'deadline'
      }
      emit(event)
    }
  } finally {
    if (!terminating) cleaned = await bench.cleanup()
  }
  if (terminating) return 143
  emit({ type: 'footer', completed: true, cleanup: cleaned })
  return 0
}

process.exitCode = await main()
