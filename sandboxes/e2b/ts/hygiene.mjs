// Between the steps of a Node SDK runner: a step ends what it started, and a shared sandbox is checked (the
// Python kit's hygiene.py, the same rules and the same details). Node's standard library only: the kit drives
// envd's process RPCs itself (Connect, JSON), a second path beside whatever SDK call a step made.
//
// - A shared sandbox (one several steps use) is *watched* (`watch`): its processes are listed when it is made (its
//   baseline), before each step and after it. What a step started and left running on it is killed after the step
//   (`left_behind` in the step's details, confirmed by listing again). Before each step a watched sandbox that
//   holds processes beyond its baseline, whose envd does not answer within a bounded, slowness-scaled wait, or that
//   the control plane no longer knows (GET answers 404), is replaced: killed and dropped from the suite's state, so the next step that needs it makes a fresh one
//   (`replaced`, naming the step that left it so). One whose envd answers the list with an error is kept and its
//   processes go unchecked (`unlisted`, said once).
// - A command whose handle the context keeps for a later step (`handed`) is that step's to end.
// - A sandbox a step made for itself (not watched, not kept in the context) is killed when the step ends.
// - Steps that keep hitting the SDK's request timeout on one sandbox (CRAWL_IN_A_ROW in a row) make it `crawl`:
//   named in the details (which sandbox, since which step) and replaced.
// - With task option `census: true`, each step's details say how many processes each shared sandbox holds after it
//   (`census`): the kit's second path, for the harness's own tests.
// Everything observed goes into the step's `details.hygiene`; the harness prints a line for each event.

const ENVD_PORT = 49983
const CENSUS_WAIT_MS = 10_000 // a list of processes answers in milliseconds; this bounds one that does not
const GONE_WAIT_MS = 5_000 // for a killed process to leave the list (quiet host)
export const CRAWL_IN_A_ROW = 3
const REQUEST_TIMEOUT_MS = 60_000 // the SDKs' default request timeout: a failing step this long hit it
// What a timeout's error says: its class (TimeoutError) or its message.
const TIMEOUT_WORDS = /timed? out|deadline[ _]exceeded/i
const TIMEOUT_CLASS = /\b\w*Timeout(?:Exception|Error)?\b/
export const LEAVE_RUNNING = 'sleep 600' // what task options `leave_after`/`leave_in: <id>` leave running (own tests)

/** A step that failed on a timeout: the error's class or message says so, or it lasted the SDK's timeout. */
export function timedOut(outcome, error, details, durationMs) {
  if (outcome === 'pass' || outcome === 'skip') return false
  const raised = details?.raised ?? {}
  const words = [error, raised.exception, raised.message].filter(Boolean).join(' ')
  return TIMEOUT_WORDS.test(words) || TIMEOUT_CLASS.test(words) || durationMs >= REQUEST_TIMEOUT_MS
}

/** No process list: `answered` with an error (kept, unchecked), or no answer in time (replaced). */
class Census extends Error {
  constructor(message, answered = false) {
    super(message)
    this.answered = answered
  }
}

/** Pids of the command handles a value holds (an object with an integer `pid`, inside plain containers). */
export function handedPids(value, depth = 2, found = new Set()) {
  if (value === null || typeof value !== 'object') return found
  if (Number.isInteger(value.pid)) found.add(value.pid)
  else if (depth > 0) for (const item of Array.isArray(value) ? value : Object.values(value)) handedPids(item, depth - 1, found)
  return found
}

/** Sandbox ids a value holds (an SDK object's `sandboxId`, ids as strings, inside plain containers). */
export function reachable(value, depth = 3, found = new Set()) {
  if (value === null || value === undefined) return found
  if (typeof value === 'string') found.add(value)
  else if (typeof value === 'object' && typeof value.sandboxId === 'string') found.add(value.sandboxId)
  else if (depth > 0 && (Array.isArray(value) || value instanceof Set || value instanceof Map)) {
    for (const item of value.values()) reachable(item, depth - 1, found)
  } else if (depth > 0 && typeof value === 'object') {
    for (const item of Object.values(value)) reachable(item, depth - 1, found)
  }
  return found
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

export class Hygiene {
  /** `kill(id)` kills one sandbox and says what happened; `killed` is the context's set of killed ids. */
  constructor(slowness, killed, kill, census = false) {
    this.slowness = slowness
    this.recordCensus = census // every step's details say how many processes each shared sandbox has after it
    this.killed = killed
    this.kill = kill
    this.watched = new Map()
    this.touched = new Set()
    this.createdBefore = 0
  }

  /** `current()` is the SDK object standing for it now (null once dropped); `replace()` drops it (null: kept). */
  async watch(sandboxId, current, replace = null) {
    const entry = { sandboxId, current, replace, baseline: new Set(), before: null, lastStep: null, timeouts: 0, since: null, unlisted: null, unlistedSaid: false }
    this.watched.set(sandboxId, entry)
    try {
      entry.baseline = new Set((await this.census(entry)).map(([pid]) => pid))
    } catch (err) {
      if (!(err instanceof Census)) throw err
      if (err.answered) entry.unlisted = err.message.slice(0, 300) // else not answering now: the next check says so
    }
    entry.before = new Set(entry.baseline)
    this.touched.add(sandboxId)
  }

  /** The bound of one envd or REST call: CENSUS_WAIT_MS scaled by the slowness (a whole number of ms). */
  waitMs() {
    return Math.ceil(CENSUS_WAIT_MS * this.slowness)
  }

  used(sandboxId) {
    this.touched.add(sandboxId)
  }

  envd(entry) {
    const sandbox = entry.current()
    const domain = process.env.E2B_DOMAIN ?? 'e2b.app'
    const url = sandbox?.envdApiUrl ?? process.env.E2B_SANDBOX_URL ?? `https://${ENVD_PORT}-${entry.sandboxId}.${domain}`
    const headers = { 'E2b-Sandbox-Id': entry.sandboxId, 'E2b-Sandbox-Port': String(ENVD_PORT), 'Connect-Protocol-Version': '1' }
    if (sandbox?.envdAccessToken) headers['X-Access-Token'] = sandbox.envdAccessToken
    return { url: String(url).replace(/\/+$/, ''), headers }
  }

  async call(entry, rpc, body) {
    const { url, headers } = this.envd(entry)
    let answer
    try {
      answer = await fetch(`${url}/process.Process/${rpc}`, {
        method: 'POST',
        headers: { ...headers, 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(this.waitMs()),
      })
    } catch (err) {
      // Only what the transport says is the sandbox's silence; any other error is the kit's own fault.
      const silent = ['TimeoutError', 'AbortError'].includes(err?.name) || (err?.name === 'TypeError' && err?.cause !== undefined)
      if (!silent) throw err
      throw new Census(`${rpc}: ${err?.name}: ${err?.cause?.message ?? err?.message}`)
    }
    const text = await answer.text().catch((err) => `(body: ${err?.name})`)
    if (answer.status !== 200) {
      throw new Census(`${rpc}: HTTP ${answer.status}: ${text.slice(0, 200)}`, true)
    }
    try {
      return JSON.parse(text)
    } catch {
      throw new Census(`${rpc}: not JSON: ${text.slice(0, 200)}`, true)
    }
  }

  /** Whether the control plane says the sandbox no longer exists (404 to its GET). */
  async gone(entry) {
    try {
      const answer = await fetch(`${String(process.env.E2B_API_URL).replace(/\/+$/, '')}/sandboxes/${entry.sandboxId}`, {
        headers: { 'X-API-KEY': process.env.E2B_API_KEY ?? '' },
        signal: AbortSignal.timeout(this.waitMs()),
      })
      await answer.arrayBuffer().catch(() => null)
      return answer.status === 404
    } catch {
      return false
    }
  }

  /** [pid, command line] of each process envd lists on the sandbox. */
  async census(entry) {
    const listed = (await this.call(entry, 'List', {})).processes ?? []
    return listed
      .filter((p) => Number.isInteger(Number(p?.pid)))
      .map((p) => [Number(p.pid), [p.config?.cmd ?? '', ...(p.config?.args ?? [])].join(' ').trim()])
  }

  /** SIGKILL each pid, then wait until none is listed; whether they are gone. */
  async endProcesses(entry, pids) {
    for (const pid of pids) await this.call(entry, 'SendSignal', { process: { pid }, signal: 'SIGNAL_SIGKILL' }).catch(() => null)
    const deadline = Date.now() + GONE_WAIT_MS * this.slowness
    for (;;) {
      let left
      try {
        left = (await this.census(entry)).filter(([pid]) => pids.has(pid))
      } catch {
        return false
      }
      if (left.length === 0 || Date.now() > deadline) return left.length === 0
      await sleep(50)
    }
  }

  /** Start LEAVE_RUNNING on every watched sandbox and leave it (task option `leave_after`, the kit's own tests). */
  async leaveRunning() {
    const frame = Buffer.from(JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', LEAVE_RUNNING] } }))
    const head = Buffer.alloc(5)
    head.writeUInt32BE(frame.length, 1)
    for (const entry of this.live()) {
      const { url, headers } = this.envd(entry)
      const aborting = new AbortController()
      const timer = setTimeout(() => aborting.abort(), this.waitMs())
      try {
        const answer = await fetch(`${url}/process.Process/Start`, {
          method: 'POST',
          headers: { ...headers, 'Content-Type': 'application/connect+json', Authorization: `Basic ${Buffer.from('user:').toString('base64')}` },
          body: Buffer.concat([head, frame]),
          signal: aborting.signal,
        })
        await answer.body?.getReader().read() // its start event: it runs; the stream is dropped, the process kept
      } catch {
        // the next check sees what it left, or not
      } finally {
        clearTimeout(timer)
        aborting.abort()
      }
    }
  }

  live() {
    for (const id of [...this.watched.keys()]) if (this.killed.has(id)) this.watched.delete(id)
    return [...this.watched.values()].filter((entry) => entry.current())
  }

  async drop(entry) {
    this.watched.delete(entry.sandboxId)
    entry.replace()
    const what = await this.kill(entry.sandboxId)
    this.killed.add(entry.sandboxId)
    return what
  }

  /** Check each watched sandbox; one holding leftovers or not answering is replaced. Details for the step. */
  async before(stepId, created, handed = new Set()) {
    this.touched = new Set()
    this.createdBefore = created
    const report = {}
    for (const entry of this.live()) {
      let problem = null
      if (this.unlisted(entry, report)) continue
      try {
        const listed = await this.census(entry)
        entry.before = new Set(listed.map(([pid]) => pid))
        const extra = listed.filter(([pid]) => !entry.baseline.has(pid) && !handed.has(pid))
        if (extra.length) problem = `left running: ${extra.map(([pid, command]) => `${command} (pid ${pid})`).join('; ')}`
      } catch (err) {
        if (!(err instanceof Census)) throw err
        if (err.answered && (await this.gone(entry))) problem = `gone: ${err.message}`
        else if (this.unlisted(entry, report, err)) continue
        else problem = `no answer: ${err.message}`
      }
      if (problem === null) continue
      const found = { sandbox: entry.sandboxId, reason: problem.slice(0, 300), left_by: entry.lastStep }
      if (entry.replace) {
        found.killed = await this.drop(entry)
        ;(report.replaced ??= []).push(found)
        continue
      }
      // Later steps need its state: what was left is ended instead; one that does not answer is left alone.
      if (problem.startsWith('left running')) {
        const extra = new Set([...(entry.before ?? [])].filter((pid) => !entry.baseline.has(pid) && !handed.has(pid)))
        found.ended = await this.endProcesses(entry, extra)
        entry.before = found.ended ? new Set([...entry.before].filter((pid) => !extra.has(pid))) : null
      } else {
        this.watched.delete(entry.sandboxId)
      }
      ;(report.kept ??= []).push(found)
    }
    return report
  }

  /** End what the step left running on the watched sandboxes and the sandboxes it made for itself; count timeouts. */
  async after(stepId, outcome, error, details, durationMs, created, keep, handed = new Set()) {
    const report = {}
    const slow = timedOut(outcome, error, details, durationMs)
    const census = {}
    for (const entry of this.live()) {
      entry.lastStep = stepId
      const used = this.touched.size === 0 || this.touched.has(entry.sandboxId)
      if (this.unlisted(entry, report)) {
        if (used) await this.count(entry, stepId, slow, report)
        continue
      }
      let listed
      try {
        listed = await this.census(entry)
      } catch (err) {
        if (!(err instanceof Census)) throw err
        census[entry.sandboxId] = err.message.slice(0, 200)
        if (!this.unlisted(entry, report, err)) await this.count(entry, stepId, true, report)
        continue
      }
      const known = entry.before ?? entry.baseline
      const fresh = listed.filter(([pid]) => !known.has(pid) && !handed.has(pid))
      census[entry.sandboxId] = listed.length
      if (fresh.length) {
        const ended = await this.endProcesses(entry, new Set(fresh.map(([pid]) => pid)))
        ;(report.left_behind ??= []).push(...fresh.map(([pid, command]) => ({ sandbox: entry.sandboxId, pid, command: command.slice(0, 200), ended })))
        census[entry.sandboxId] = await this.census(entry).then((now) => now.length, (err) => err.message.slice(0, 200))
      }
      if (used) await this.count(entry, stepId, slow, report)
    }
    if (Object.keys(census).length && this.recordCensus) report.census = census
    const mine = [...new Set(created.slice(this.createdBefore))].filter((id) => !this.killed.has(id) && !keep.has(id) && !this.watched.has(id))
    if (mine.length) {
      report.sandboxes_ended = {}
      for (const id of mine) {
        report.sandboxes_ended[id] = await this.kill(id)
        this.killed.add(id)
      }
    }
    return report
  }

  /** Whether the sandbox's envd gives no process list (said once in the details). */
  unlisted(entry, report, err = null) {
    if (err?.answered) entry.unlisted = err.message.slice(0, 300)
    if (entry.unlisted && !entry.unlistedSaid) {
      entry.unlistedSaid = true
      ;(report.unlisted ??= []).push({ sandbox: entry.sandboxId, reason: entry.unlisted })
    }
    return entry.unlisted !== null
  }

  async count(entry, stepId, slow, report) {
    if (!slow) {
      entry.timeouts = 0
      entry.since = null
      return
    }
    entry.timeouts += 1
    entry.since ??= stepId
    if (entry.timeouts < CRAWL_IN_A_ROW) return
    const crawl = { sandbox: entry.sandboxId, since: entry.since, in_a_row: entry.timeouts }
    if (entry.replace && this.watched.has(entry.sandboxId)) {
      crawl.replaced = true
      crawl.killed = await this.drop(entry)
    } else {
      crawl.replaced = false
      entry.timeouts = 0
      entry.since = null
    }
    ;(report.crawl ??= []).push(crawl)
  }
}
