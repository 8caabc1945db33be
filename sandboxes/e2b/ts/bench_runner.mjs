// JavaScript benchmark runner: times the unmodified `e2b` npm SDK against the endpoint it is pointed at.
//
// One script serves every pinned Node project, like runner.mjs: the SDK is loaded from the project
// named by NODE_PATH. Protocol (JSON lines, docs/ARCHITECTURE.md): one task on stdin, then on stdout
// `hello`, one `sample` per timed operation as it ends, one `measure` when a measure ends, and a
// `footer` naming what happened to every sandbox. The task and the measure kinds are those of
// sandboxes/e2b/python/bench_runner.py (`tti` in three modes, `run_true`, `upload`, `download`, and
// their `_http` twins: the same requests with Node's core `http` client and no SDK at all, on sandboxes
// created and killed over the REST API, so the SDK's row minus its twin's is what the SDK adds; the
// twins also time the answer's first byte, `first_byte_ms`), and `upload_floor` / `download_floor`: the
// SDK's own call against the harness's floor server (bench/floor.py) through its `sandboxUrl` option;
// a transfer whose task names its floor in `alternate` takes its samples in turn with the floor's.
// No new operation starts after `deadline_s`; every sandbox created is killed. A measure with `settle` (the
// embedded endpoint) first asks the endpoint's `/e2b-bench/pool` to settle as it says, untimed, and reports how
// it was (`settle`) and how its creates were served, taken from the pool or made on demand (`served`).

import { createHash, randomBytes } from 'node:crypto'
import http from 'node:http'
import https from 'node:https'
import { emit, loadSdk, oneLine, sleep } from './driver.mjs'
import { footer, hello, readTask } from './runkit.mjs'

const SUITE = 'bench'
const TRANSFER_PATH = '/tmp/e2b-bench-transfer.bin'
const WARMUP = { run_true: 2, run_true_http: 2 }
for (const way of ['upload', 'download']) for (const twin of ['', '_http', '_floor']) WARMUP[`${way}${twin}`] = 1
const CONNECT_END_STREAM = 0x02 // envelope flag of a Connect stream's last message (trailers or an error)

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
    this.runId = String(task.run_id)
    this.tags = { ...task.metadata } // the task's sandbox metadata: every sandbox of the run carries it
    this.deadline = performance.now() + Number(task.deadline_s ?? 60) * 1000
    this.sandboxTimeoutMs = Number(task.sandbox_timeout_s ?? 300) * 1000
    this.created = []
    this.killed = new Set()
    this.work = null
    this.floors = new Map() // floor URL -> the shared sandbox as the SDK sees it there
    this.http = new PlainHttp() // the client of the plain HTTP measures
    this.httpWork = null // the sandbox run_true_http/upload_http/download_http use
    this.payload = null
    this.digest = ''
  }

  get metadata() {
    return { ...this.tags }
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

  /** A sandbox made with a plain POST, in the bookkeeping the clean-up and the footer use. */
  async createHttp() {
    const sandbox = await this.http.create(this.sandboxTimeoutMs / 1000, this.metadata)
    this.created.push(sandbox.id)
    return sandbox
  }

  // --- the endpoint between measures -----------------------------------------------------------
  /** Ask the embedded endpoint to settle as `measure.settle` says (bounded by the deadline): how it was, and the
   * creates it had served so far. */
  async settle(measure) {
    const withinS = Math.min(Number(measure.settle.within_s), Math.max(1, (this.deadline - performance.now()) / 1000))
    const started = performance.now()
    try {
      const answer = await this.http.pool({ ...measure.settle, within_s: withinS })
      const settled = { settled: Boolean(answer.settled), waited_ms: msSince(started), prepared: answer.prepared }
      return [settled, answer.served]
    } catch (err) {
      // the measure is taken all the same, and says so
      return [{ settled: false, waited_ms: msSince(started), error: describe(err) }, null]
    }
  }

  /** The creates the endpoint served since `before`: taken from its pool or made on demand. */
  async servedSince(before) {
    if (before === null) return null
    try {
      const after = (await this.http.pool()).served
      return { prepared: after.prepared - before.prepared, on_demand: after.on_demand - before.on_demand }
    } catch {
      return null
    }
  }

  // --- time to interactive --------------------------------------------------------------------
  ttiSequential(measure) {
    const kill = async (sandbox) => {
      const started = performance.now()
      try {
        await sandbox.kill()
      } catch {
        return null // left to the final clean-up
      }
      this.killed.add(sandbox.sandboxId)
      return msSince(started)
    }
    return this.sequential(measure, () => this.create(), (sandbox) => sandbox.commands.run('true'), kill, 'Sandbox')
  }

  /** One sandbox at a time: create, first command (timed together), kill (timed apart). */
  async sequential(measure, create, firstCommand, kill, client) {
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
        sandbox = await create()
        const created = msSince(started)
        await firstCommand(sandbox)
        outcome = ready(started, created)
      } catch (err) {
        outcome = { ok: false, ms: null, error: describe(err) }
      }
      const killMs = sandbox === null ? null : await kill(sandbox)
      if (killMs !== null) outcome.parts = { ...(outcome.parts ?? {}), kill_ms: killMs }
      this.sample(measure.id, index, startMs, outcome)
    }
    return { attempted, wall_ms: msSince(began), client }
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

  /** Create + Start as the SDK sends them, over kept-alive connections of Node's core client. */
  ttiHttp(measure) {
    const kill = async (sandbox) => {
      const started = performance.now()
      if ((await this.http.kill(sandbox.id)) !== 'killed') return null // left to the final clean-up
      this.killed.add(sandbox.id)
      return msSince(started)
    }
    return this.sequential(measure, () => this.createHttp(), (sandbox) => this.http.start(sandbox, 'true'), kill, 'node:http')
  }

  // --- operations on a ready sandbox ------------------------------------------------------------
  async workSandbox() {
    if (this.work === null) this.work = await this.create()
    return this.work
  }

  async httpWorkSandbox() {
    if (this.httpWork === null) this.httpWork = await this.createHttp()
    return this.httpWork
  }

  payloadOf(size) {
    if (this.payload === null || this.payload.length !== size) {
      this.payload = randomBytes(size)
      this.digest = createHash('sha256').update(this.payload).digest('hex')
    }
    return this.payload.buffer.slice(this.payload.byteOffset, this.payload.byteOffset + this.payload.length)
  }

  expectDigest(found, what) {
    if (found !== this.digest) throw new Error(`sha256 of the ${what} is ${found}, expected ${this.digest}`)
  }

  /** Time `action` alone, then `verify` it (untimed); an action that returns `{ firstByte }` (a
   * performance.now() moment) has it reported as the part `first_byte_ms`. */
  async repeat(measure, action, verify = async () => {}, client = 'Sandbox') {
    return (await this.alternate([{ measure, action, verify, client }]))[0]
  }

  /** `repeat` of several measures (arms: `{ measure, action, verify, client }`), their samples taken in turn
   * (each index: every arm once, the first arm of the turn alternating), so what the host does meanwhile
   * weighs on each alike: their ratio is what a floor's target judges. Each arm's warm-up comes first. */
  repeatArm(arm) {
    return this.alternate([arm]).then((events) => events[0])
  }

  async alternate(arms) {
    for (const arm of arms) {
      for (let i = 0; i < WARMUP[arm.measure.kind]; i++) {
        await arm.action()
        await arm.verify()
      }
    }
    const began = performance.now()
    const attempted = arms.map(() => 0)
    const rounds = Math.max(...arms.map((arm) => Number(arm.measure.count)))
    for (let index = 0; index < rounds; index++) {
      const turn = arms.map((arm, position) => [arm, position])
      for (const [arm, position] of index % 2 === 0 ? turn : turn.reverse()) {
        if (index >= Number(arm.measure.count) || this.expired()) continue
        attempted[position]++
        const startMs = msSince(began)
        const started = performance.now()
        let outcome
        try {
          const marks = await arm.action()
          outcome = { ok: true, ms: msSince(started) }
          if (typeof marks?.firstByte === 'number') outcome.parts = { first_byte_ms: round(marks.firstByte - started) }
          await arm.verify() // untimed: a wrong digest fails the sample
        } catch (err) {
          outcome = { ok: false, ms: null, error: describe(err) }
        }
        this.sample(arm.measure.id, index, startMs, outcome)
      }
    }
    const wallMs = msSince(began)
    return arms.map((arm, position) => {
      const event = { attempted: attempted[position], wall_ms: wallMs, client: arm.client ?? 'Sandbox' }
      event.warmup = WARMUP[arm.measure.kind]
      if (arms.length > 1) event.alternated_with = arms.filter((other) => other !== arm).map((other) => other.measure.id)
      return event
    })
  }

  async runTrue(measure) {
    const sandbox = await this.workSandbox()
    return this.repeat(measure, () => sandbox.commands.run('true'))
  }

  async runTrueHttp(measure) {
    const sandbox = await this.httpWorkSandbox()
    return this.repeat(measure, () => this.http.start(sandbox, 'true'), undefined, 'node:http')
  }

  async upload(measure) {
    const sandbox = await this.workSandbox()
    const payload = this.payloadOf(Number(measure.bytes))
    const verify = async () => {
      const found = (await sandbox.commands.run(`sha256sum ${TRANSFER_PATH}`)).stdout.split(/\s+/)[0]
      this.expectDigest(found, 'uploaded file')
    }
    return { measure, action: () => sandbox.files.write(TRANSFER_PATH, payload), verify }
  }

  async uploadHttp(measure) {
    const sandbox = await this.httpWorkSandbox()
    const payload = this.payloadOf(Number(measure.bytes))
    const verify = async () => {
      this.expectDigest((await this.http.start(sandbox, `sha256sum ${TRANSFER_PATH}`)).split(/\s+/)[0], 'uploaded file')
    }
    return this.repeat(measure, () => this.http.write(sandbox, TRANSFER_PATH, payload), verify, 'node:http')
  }

  async download(measure) {
    const sandbox = await this.workSandbox()
    await sandbox.files.write(TRANSFER_PATH, this.payloadOf(Number(measure.bytes)))
    let received = null
    const fetch = async () => {
      received = await sandbox.files.read(TRANSFER_PATH, { format: 'bytes' })
    }
    const verify = async () =>
      this.expectDigest(createHash('sha256').update(received).digest('hex'), 'downloaded bytes')
    return { measure, action: fetch, verify }
  }

  /** The shared sandbox, connected through the SDK with the floor server as its envd URL. */
  async floorSandbox(floorUrl) {
    if (!this.floors.has(floorUrl)) {
      const work = await this.workSandbox()
      this.floors.set(floorUrl, await this.sdk.Sandbox.connect(work.sandboxId, { sandboxUrl: floorUrl }))
    }
    return this.floors.get(floorUrl)
  }

  async uploadFloor(measure) {
    const sandbox = await this.floorSandbox(measure.floor_url)
    const payload = this.payloadOf(Number(measure.bytes))
    const verify = async () => {
      // the floor server counts what it discarded: at least the payload, in its multipart
      const answer = await this.http.request(`${measure.floor_url}/floor/received`)
      const received = JSON.parse(Buffer.concat(expectOk(answer).chunks).toString('utf8')).bytes
      if (received < payload.byteLength) throw new Error(`the floor server received ${received} bytes, less than the ${payload.byteLength} sent`)
    }
    return { measure, action: () => sandbox.files.write(TRANSFER_PATH, payload), verify }
  }

  async downloadFloor(measure) {
    const sandbox = await this.floorSandbox(measure.floor_url)
    const size = Number(measure.bytes)
    let received = null
    const fetch = async () => {
      received = await sandbox.files.read(TRANSFER_PATH, { format: 'bytes' })
    }
    const verify = async () => {
      if (received.length !== size || received.some((byte) => byte !== 0))
        throw new Error(`the floor download is not ${size} zero bytes (${received.length} bytes)`)
    }
    return { measure, action: fetch, verify }
  }

  async downloadHttp(measure) {
    const sandbox = await this.httpWorkSandbox()
    await this.http.write(sandbox, TRANSFER_PATH, this.payloadOf(Number(measure.bytes)))
    let chunks = []
    const read = async () => {
      const answer = await this.http.read(sandbox, TRANSFER_PATH)
      chunks = answer.chunks
      return answer
    }
    const verify = async () =>
      this.expectDigest(createHash('sha256').update(Buffer.concat(chunks)).digest('hex'), 'downloaded bytes')
    return this.repeat(measure, read, verify, 'node:http')
  }

  // --- clean-up ---------------------------------------------------------------------------------
  /** Kill every sandbox this task created and did not see killed; the plain HTTP ones with a plain DELETE. */
  async cleanup() {
    const report = {}
    for (const id of this.http.made) {
      if (this.killed.has(id)) continue
      report[id] = await this.http.kill(id)
      this.killed.add(id)
    }
    for (const id of this.created) {
      if (this.killed.has(id)) continue
      try {
        report[id] = (await this.sdk.Sandbox.kill(id)) ? 'killed' : 'already gone'
      } catch (err) {
        report[id] = describe(err)
      }
      this.killed.add(id)
    }
    this.http.close()
    return report
  }
}

/** The REST API and envd through Node's own `http`/`https` modules and no SDK: the reference measures.
 *
 * Each call sends what the SDK sends for the same operation. Node's core client is used rather than
 * `fetch` (which the SDK uses) because it is the cheapest client Node has: what it takes is as close
 * to the endpoint's own share as a Node process can measure.
 */
class PlainHttp {
  constructor() {
    this.apiUrl = process.env.E2B_API_URL || `https://api.${process.env.E2B_DOMAIN || 'e2b.app'}`
    this.apiHeaders = { 'X-API-KEY': process.env.E2B_API_KEY ?? '' }
    this.agents = { 'http:': new http.Agent({ keepAlive: true }), 'https:': new https.Agent({ keepAlive: true }) }
    this.made = [] // sandboxes created, for the clean-up to kill the same way
  }

  close() {
    for (const agent of Object.values(this.agents)) agent.destroy()
  }

  /** One request on a kept-alive connection (the body: buffers sent one after another): its status, body
   * chunks and the moment its first byte arrived (the status line; a body's first chunk when `firstChunk`). */
  request(url, { method = 'GET', headers = {}, body = [], firstChunk = false } = {}) {
    const target = new URL(url)
    const module = target.protocol === 'https:' ? https : http
    const sized = body.length ? { ...headers, 'Content-Length': body.reduce((n, part) => n + part.length, 0) } : headers
    return new Promise((resolve, reject) => {
      const request = module.request(target, { method, headers: sized, agent: this.agents[target.protocol] }, (response) => {
        const chunks = []
        let firstByte = firstChunk ? null : performance.now()
        response.on('data', (chunk) => {
          firstByte ??= performance.now()
          chunks.push(chunk)
        })
        response.on('end', () => resolve({ status: response.statusCode, chunks, firstByte }))
        response.on('error', reject)
      })
      request.on('error', reject)
      for (const part of body) request.write(part)
      request.end()
    })
  }

  async create(timeoutS, metadata) {
    const answer = expectOk(
      await this.request(`${this.apiUrl}/v2/sandboxes`, {
        method: 'POST',
        headers: { ...this.apiHeaders, 'Content-Type': 'application/json' },
        body: [Buffer.from(JSON.stringify({ templateID: 'base', timeout: timeoutS, metadata }))],
      }),
    )
    const created = JSON.parse(Buffer.concat(answer.chunks).toString('utf8'))
    const id = String(created.sandboxID)
    this.made.push(id)
    const token = created.envdAccessToken
    const headers = { 'E2b-Sandbox-Id': id, ...(token ? { 'X-Access-Token': token } : {}) }
    return { id, envdUrl: envdUrl(created), headers }
  }

  /** The embedded endpoint's pool (`/e2b-bench/pool`, not an E2B route); with `settle`, once it settled so. */
  async pool(settle = null) {
    const url = `${this.apiUrl}/e2b-bench/pool`
    const answer = expectOk(
      settle === null
        ? await this.request(url, { headers: this.apiHeaders })
        : await this.request(url, {
            method: 'POST',
            headers: { ...this.apiHeaders, 'Content-Type': 'application/json' },
            body: [Buffer.from(JSON.stringify(settle))],
          }),
    )
    return JSON.parse(Buffer.concat(answer.chunks).toString('utf8'))
  }

  /** What happened, in the footer's words: `killed`, `already gone` or the error. */
  async kill(id) {
    try {
      const answer = await this.request(`${this.apiUrl}/sandboxes/${id}`, { method: 'DELETE', headers: this.apiHeaders })
      if (answer.status === 404) return 'already gone'
      const ok = answer.status >= 200 && answer.status < 300
      return ok ? 'killed' : oneLine(`HTTP ${answer.status}: ${Buffer.concat(answer.chunks).toString('utf8')}`)
    } catch (err) {
      return describe(err)
    }
  }

  /** `commands.run(command)` as the SDK sends it: a Connect server stream, read to its end; its stdout. */
  async start(sandbox, command) {
    const request = { process: { cmd: '/bin/bash', args: ['-l', '-c', command] }, stdin: false }
    const body = Buffer.from(JSON.stringify(request))
    const envelope = Buffer.alloc(5 + body.length) // flag byte 0, big-endian length, the message
    envelope.writeUInt32BE(body.length, 1)
    body.copy(envelope, 5)
    const answer = await this.request(`${sandbox.envdUrl}/process.Process/Start`, {
      method: 'POST',
      headers: { ...sandbox.headers, 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1' },
      body: [envelope],
    })
    return processStdout(Buffer.concat(expectOk(answer).chunks))
  }

  /** `files.write` as the SDK sends it by default (and any envd takes it): one multipart `file` part. */
  async write(sandbox, path, data) {
    const boundary = `e2b-bench-${randomBytes(12).toString('hex')}`
    const disposition = `form-data; name="file"; filename="${path.replaceAll('"', '%22')}"`
    const head = `--${boundary}\r\nContent-Disposition: ${disposition}\r\nContent-Type: application/octet-stream\r\n\r\n`
    const body = [Buffer.from(head), Buffer.from(data), Buffer.from(`\r\n--${boundary}--\r\n`)] // data: not copied
    const headers = { ...sandbox.headers, 'Content-Type': `multipart/form-data; boundary=${boundary}` }
    return expectOk(await this.request(filesUrl(sandbox, path), { method: 'POST', headers, body }))
  }

  /** `files.read`, the body read as a stream: the chunks as they arrived. */
  async read(sandbox, path) {
    return expectOk(await this.request(filesUrl(sandbox, path), { headers: sandbox.headers, firstChunk: true }))
  }
}

/** The response if it is a success; else its status and body as an error. */
function expectOk(response) {
  if (response.status >= 200 && response.status < 300) return response
  throw new Error(`HTTP ${response.status}: ${Buffer.concat(response.chunks).toString('utf8').slice(0, 300)}`)
}

function envdUrl(created) {
  const configured = process.env.E2B_SANDBOX_URL
  if (configured) return configured.replace(/\/+$/, '')
  const domain = created.domain || process.env.E2B_DOMAIN || 'e2b.app'
  return `https://49983-${created.sandboxID}.${domain}`
}

function filesUrl(sandbox, path) {
  return `${sandbox.envdUrl}/files?${new URLSearchParams({ path, username: 'user' })}`
}

/**
 * The JSON messages of a Connect stream body: each behind a flag byte and a big-endian uint32 length.
 * The end-of-stream message carries the RPC's error, if any: thrown here, as the SDK does.
 */
function* connectMessages(stream) {
  let offset = 0
  while (offset < stream.length) {
    if (offset + 5 > stream.length) throw new Error(`Connect stream cut inside an envelope header at byte ${offset}`)
    const flags = stream[offset]
    const size = stream.readUInt32BE(offset + 1)
    const text = stream.subarray(offset + 5, offset + 5 + size).toString('utf8')
    const message = JSON.parse(text || '{}')
    offset += 5 + size
    if (flags & CONNECT_END_STREAM) {
      if (message.error) throw new Error(`Start stream ended with an error: ${JSON.stringify(message.error)}`)
      return
    }
    yield message
  }
}

/** The stdout of a Start stream (data events carry it base64-encoded); it must reach its end event. */
function processStdout(stream) {
  const stdout = []
  let end = null
  for (const message of connectMessages(stream)) {
    const event = message.event ?? {}
    if (event.data) stdout.push(Buffer.from(event.data.stdout ?? '', 'base64'))
    if (event.end) end = event.end
  }
  if (end === null) throw new Error(`Start stream has no end event: ${stream.subarray(-300).toString('utf8')}`)
  // proto3 JSON leaves a zero exit code out
  if (end.exitCode) throw new Error(`the command exited with ${end.exitCode}: ${JSON.stringify(end)}`)
  return Buffer.concat(stdout).toString('utf8')
}

async function main() {
  const task = await readTask()
  const { sdk, version } = await loadSdk()
  hello(task.runner ?? `js-e2b-${version}`, { e2b: version })
  if (task.suite !== SUITE) {
    footer(false, { reason: `unknown suite ${task.suite}` })
    return 2
  }
  const bench = new Bench(sdk, task)
  const arms = {
    upload: (m) => bench.upload(m),
    download: (m) => bench.download(m),
    upload_floor: (m) => bench.uploadFloor(m),
    download_floor: (m) => bench.downloadFloor(m),
  }
  const measures = task.measures ?? []
  const byId = new Map(measures.map((measure) => [measure.id, measure]))
  const alternated = new Map() // a measure taken in turn with an earlier one: its event, kept until its turn
  // A measure's event: taken in turn with the measure it names in `alternate`, if planned, else alone.
  const taken = async (measure) => {
    const partner = byId.get(measure.alternate)
    if (partner === undefined || !(partner.kind in arms)) return bench.repeatArm(await arms[measure.kind](measure))
    const [other, own] = await bench.alternate([await arms[partner.kind](partner), await arms[measure.kind](measure)])
    alternated.set(partner.id, other)
    return own
  }
  const kinds = {
    tti: (m) => (m.mode === 'sequential' ? bench.ttiSequential(m) : bench.ttiConcurrent(m)),
    tti_http: (m) => bench.ttiHttp(m),
    run_true: (m) => bench.runTrue(m),
    run_true_http: (m) => bench.runTrueHttp(m),
    ...Object.fromEntries(Object.keys(arms).map((kind) => [kind, taken])),
    upload_http: (m) => bench.uploadHttp(m),
    download_http: (m) => bench.downloadHttp(m),
  }
  // A harness that stops the run sends SIGTERM: kill the sandboxes, report nothing more.
  let terminating = false
  process.once('SIGTERM', () => {
    terminating = true
    bench.cleanup().finally(() => process.exit(143))
  })
  let cleaned = {}
  try {
    for (const measure of measures) {
      if (terminating) break
      const event = { type: 'measure', id: measure.id, planned: Number(measure.count) }
      if (alternated.has(measure.id)) {
        // taken already, in turn with the measure that named it
        emit({ ...event, ...alternated.get(measure.id) })
        alternated.delete(measure.id)
        continue
      }
      if (!(measure.kind in kinds)) {
        Object.assign(event, { attempted: 0, error: `this runner has no measure of kind ${measure.kind}` })
      } else if (bench.expired()) {
        Object.assign(event, { attempted: 0, stopped: 'deadline' })
      } else {
        let served = null
        if (measure.settle) [event.settle, served] = await bench.settle(measure)
        try {
          Object.assign(event, await kinds[measure.kind](measure))
        } catch (err) {
          // e.g. the shared sandbox could not be created
          Object.assign(event, { attempted: event.attempted ?? 0, error: describe(err) })
        }
        if (measure.settle) event.served = await bench.servedSince(served)
        if (bench.expired() && event.attempted < event.planned) event.stopped = 'deadline'
        for (const other of event.alternated_with ?? []) {
          // its partner's event: the same settle, served and end
          const partnerEvent = alternated.get(other)
          for (const key of ['settle', 'served']) if (key in event) partnerEvent[key] = event[key]
          if (bench.expired() && partnerEvent.attempted < Number(byId.get(other).count)) partnerEvent.stopped = 'deadline'
        }
      }
      emit(event)
    }
  } finally {
    if (!terminating) cleaned = await bench.cleanup()
  }
  if (terminating) return 143
  footer(true, { cleanup: cleaned })
  return 0
}

process.exitCode = await main()
