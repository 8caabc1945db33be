// An agent's "computer" on an E2B sandbox: the binding an agent platform puts between its agents and the
// endpoint, written here from its documented contract (docs/suites.md, "The computer suite"). It talks to the API and
// envd through the unmodified SDK only, and never hands a credential to the sandbox.
//
// - one ephemeral sandbox per invocation (template `base`, 300 s), tagged with a receipt of the create, seeds
//   written before the session starts, whose first act is `python --version` (must exit 0);
// - an unprivileged agent user made with `useradd` (refused when it could `sudo -n`), root-owned read-only skills;
// - commands: each leads its own process group; a deadline (120 s) and a cancellation end the whole group
//   (SIGTERM, a grace, SIGKILL); output past 2 MiB is cut and flagged while the stream is drained to its end;
// - files: streamed writes use four upload slots, are staged beside their destination and published by one
//   rename (a parent that is a symlink, or a directory the user cannot write, is refused; a failed source
//   leaves nothing); renames and removals are refused where the user could not make them itself (envd makes
//   them as root); buffered reads stop at 16 MiB;
// - a create or mutation whose answer was lost is never replayed: its receipt (the create's tag, the staged
//   file's fate) says whether it happened;
// - close kills the sandbox and confirms it is gone; after a crash the sandbox's lifetime bounds it.

import { randomUUID } from 'node:crypto'

export const LIMITS = Object.freeze({
  sandboxTimeoutMs: 300_000,
  commandDeadlineMs: 120_000,
  outputBytes: 2 << 20,
  bufferedReadBytes: 16 << 20,
  uploadSlots: 4,
  cancelGraceMs: 2_000,
  closeConfirmMs: 10_000,
  streamEndMs: 5_000, // after a cancellation, for the command's stream to end before it is let go
})
export const INVOCATION_TAG = 'agent-computer-invocation'
export const SKILLS_DIR = '/opt/agent-skills'
const REQUIRED_TOOLS = ['bash', 'python3', 'timeout', 'useradd']
const STAGE_PREFIX = '.agent-stage-'

/** The computer refused an operation, or the endpoint broke its contract; the message says which, in one sentence. */
export class ComputerError extends Error {
  constructor(message) {
    super(message)
    this.name = 'ComputerError'
  }
}

export function quote(text) {
  return `'${String(text).replaceAll("'", "'\\''")}'`
}

// Makes the command the leader of its own process group (a new session; a process that leads a group
// already keeps it), then runs it with bash: its pid is its process group id.
const GROUP_LEADER = [
  'import os, sys',
  'try:',
  '    os.setsid()',
  'except OSError:',
  '    pass',
  "os.execvp('bash', ['bash', '-c', sys.argv[1]])",
].join('\n')

// Ends a process group: SIGTERM, up to a grace for it to empty, SIGKILL; prints the members left (none).
const END_GROUP = [
  'import os, signal, sys, time',
  'group, grace = int(sys.argv[1]), float(sys.argv[2])',
  'def members():',
  '    found = []',
  "    for pid in filter(str.isdigit, os.listdir('/proc')):",
  '        try:',
  "            state, _, pgrp = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[:3]",
  '        except (OSError, ValueError):',
  '            continue',
  "        if int(pgrp) == group and state not in 'ZX':",
  '            found.append(int(pid))',
  '    return found',
  'def send(signum):',
  '    try:',
  '        os.killpg(group, signum)',
  '    except ProcessLookupError:',
  '        pass',
  'def wait(seconds):',
  '    end = time.monotonic() + seconds',
  '    while members() and time.monotonic() < end:',
  '        time.sleep(0.02)',
  'send(signal.SIGTERM)',
  'wait(grace)',
  'send(signal.SIGKILL)',
  'wait(60)', // a process in uninterruptible sleep (a busy disk) dies only when it wakes
  "print(' '.join(map(str, members())))",
].join('\n')

// Run as the writing user: why a write of the path is refused, if it is. A parent that is a symlink (at any depth)
// would land the file elsewhere; a directory the user cannot write is refused here because envd opens uploads as
// root and hands them to the user, so its upload alone would not stop the write.
const WRITE_REFUSAL = [
  'import os, sys',
  "path = os.path.dirname(os.path.normpath(sys.argv[1])) or '/'",
  "walked = ''",
  "for part in filter(None, path.split('/')):",
  "    walked += '/' + part",
  '    if os.path.islink(walked):',
  "        sys.exit(print(f'its parent path {walked} is a symlink'))",
  'if os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK):',
  "    print(f'the user cannot write its directory {path}')",
].join('\n')

// Run as the acting user: why a rename (two paths) or a removal (one) is refused, if it is. envd renames and
// removes as root (internal/services/filesystem/move.go, remove.go: the user only expands `~`), so the API alone
// would let the agent user rename or remove a root-owned skill; the adapter allows only what the user could do
// itself: write and enter each parent, the sticky bit's owner rule, and for a directory removed, every directory
// in it.
const CHANGE_REFUSAL = [
  'import os, stat, sys',
  'def parent_refusal(path):',
  "    parent = os.path.dirname(os.path.normpath(path)) or '/'",
  '    if not os.access(parent, os.W_OK | os.X_OK):',
  "        return f'the user cannot write its directory {parent}'",
  '    mode = os.stat(parent).st_mode',
  '    if mode & stat.S_ISVTX and os.path.lexists(path):',
  '        uid = os.getuid()',
  '        if uid not in (os.lstat(path).st_uid, os.stat(parent).st_uid):',
  "            return f'{path} is in a sticky directory and owned by another user'",
  "    return ''",
  'reasons = [parent_refusal(p) for p in sys.argv[1:]]',
  "if len(sys.argv) == 2 and os.path.isdir(sys.argv[1]) and not os.path.islink(sys.argv[1]):",
  '    for root, dirs, _ in os.walk(sys.argv[1]):',
  '        if not os.access(root, os.W_OK | os.X_OK):',
  "            reasons.append(f'the user cannot write the directory {root} it holds')",
  "print(next((r for r in reasons if r), ''))",
].join('\n')

/** A counting semaphore: at most `size` holders at once. */
class Slots {
  constructor(size) {
    this.free = size
    this.waiting = []
    this.busy = 0
    this.peak = 0
  }

  async hold(body) {
    if (this.free === 0) await new Promise((resolve) => this.waiting.push(resolve))
    else this.free -= 1
    this.busy += 1
    this.peak = Math.max(this.peak, this.busy)
    try {
      return await body()
    } finally {
      this.busy -= 1
      const next = this.waiting.shift()
      if (next) next()
      else this.free += 1
    }
  }
}

/** Did the endpoint answer with a definite refusal (so the call certainly did not happen)? */
function definite(err) {
  const status = err?.statusCode ?? Number(String(err?.message ?? '').match(/\bHTTP (\d{3})\b/)?.[1])
  if (status >= 400 && status < 500) return true
  const name = err?.name ?? ''
  return ['NotFoundError', 'FileNotFoundError', 'InvalidArgumentError', 'AuthenticationError', 'NotEnoughSpaceError'].includes(name) ||
    /\[(permission_denied|not_found|invalid_argument|already_exists|failed_precondition|unauthenticated)\]/.test(String(err?.message ?? ''))
}

export class AgentComputer {
  /**
   * Create the invocation's sandbox (its create leaves a receipt: a tag with the invocation id), write the seeds
   * as root, and run the session's first act. `connection` is the SDK's ConnectionOpts (apiUrl, sandboxUrl, ...).
   */
  static async open(sdk, { template = 'base', timeoutMs = LIMITS.sandboxTimeoutMs, metadata = {}, seeds = {}, connection = {} } = {}) {
    const invocation = randomUUID()
    const computer = new AgentComputer(sdk, invocation, connection)
    const tags = { ...metadata, [INVOCATION_TAG]: invocation }
    computer.sandbox = await computer.#create(template, { ...connection, timeoutMs, metadata: tags })
    for (const [path, content] of Object.entries(seeds)) await computer.sandbox.files.write(path, content, { user: 'root' })
    const first = await computer.exec('python --version')
    computer.pythonVersion = `${first.stdout}${first.stderr}`.trim()
    if (first.exitCode !== 0) throw new ComputerError(`the session's first act, python --version, exited with ${first.exitCode}`)
    return computer
  }

  constructor(sdk, invocation, connection) {
    this.sdk = sdk
    this.invocation = invocation
    this.connection = connection
    this.sandbox = null
    this.agentUser = null
    this.receipts = [] // {op, target, outcome}: every mutation, and how its outcome was learnt
    this.slots = new Slots(LIMITS.uploadSlots)
  }

  get sandboxId() {
    return this.sandbox?.sandboxId
  }

  /** Mutations whose answer was lost and whose outcome came from their receipt instead. */
  get lostAnswers() {
    return this.receipts.filter((r) => r.outcome.includes('answer lost'))
  }

  #receipt(op, target, outcome) {
    this.receipts.push({ op, target, outcome })
  }

  async #create(template, opts) {
    try {
      const made = await this.sdk.Sandbox.create(template, opts)
      this.#receipt('create', made.sandboxId, 'applied')
      return made
    } catch (err) {
      if (definite(err)) throw err
      // The answer was lost: the tag says whether the create happened. Never create a second sandbox.
      const found = await this.#tagged()
      if (found.length > 1) throw new ComputerError(`${found.length} sandboxes carry this invocation's receipt: ${found.join(', ')}`)
      if (found.length === 1) {
        this.#receipt('create', found[0], 'applied (answer lost; found by its receipt)')
        return this.sdk.Sandbox.connect(found[0], this.connection)
      }
      this.#receipt('create', null, 'not applied (answer lost; no receipt): created once more')
      return this.sdk.Sandbox.create(template, opts)
    }
  }

  async #tagged() {
    const pages = this.sdk.Sandbox.list({ ...this.connection, query: { metadata: { [INVOCATION_TAG]: this.invocation } } })
    const ids = []
    // Each listed sandbox's own metadata decides, whatever the list's filter did.
    while (pages.hasNext) ids.push(...(await pages.nextItems()).filter((info) => info.metadata?.[INVOCATION_TAG] === this.invocation).map((info) => info.sandboxId))
    return ids
  }

  /** A short command of the computer's own, as root (or `user`), with its exit code whatever it is. */
  async exec(command, { user = 'root', timeoutMs = 60_000 } = {}) {
    try {
      const result = await this.sandbox.commands.run(command, { user, timeoutMs })
      return { exitCode: result.exitCode, stdout: result.stdout, stderr: result.stderr }
    } catch (err) {
      if (!(err instanceof this.sdk.CommandExitError)) throw err
      return { exitCode: err.exitCode, stdout: err.stdout, stderr: err.stderr }
    }
  }

  // --- users and skills --------------------------------------------------------------------------

  /** The template's required tools, then the agent user (made with useradd), which must not sudo without a password. */
  async ensureAgentUser(name = 'agent') {
    const tools = await this.exec(`for t in ${REQUIRED_TOOLS.join(' ')}; do command -v "$t" >/dev/null || echo "$t"; done`)
    const missing = tools.stdout.split('\n').filter(Boolean)
    if (missing.length > 0) throw new ComputerError(`the template lacks ${missing.join(', ')}, which the agent computer needs`)
    const made = await this.exec(`id -u ${quote(name)} 2>/dev/null || useradd --create-home --shell /bin/bash --user-group ${quote(name)}`)
    if (made.exitCode !== 0) throw new ComputerError(`useradd ${name} failed with ${made.exitCode}: ${made.stderr.trim()}`)
    const sudo = await this.exec('sudo -n true', { user: name })
    if (sudo.exitCode === 0) throw new ComputerError(`the agent user ${name} can sudo without a password`)
    this.agentUser = name
    return name
  }

  /** Skills: root-owned files the agent user can read and not change, rename or remove. */
  async installSkills(files) {
    for (const [name, content] of Object.entries(files)) await this.sandbox.files.write(`${SKILLS_DIR}/${name}`, content, { user: 'root' })
    const locked = await this.exec(`chown -R root:root ${SKILLS_DIR} && chmod -R u=rwX,go=rX ${SKILLS_DIR}`)
    if (locked.exitCode !== 0) throw new ComputerError(`the skills could not be made read-only: ${locked.stderr.trim()}`)
    this.#receipt('install_skills', SKILLS_DIR, 'applied')
    return Object.keys(files).map((name) => `${SKILLS_DIR}/${name}`)
  }

  // --- commands ----------------------------------------------------------------------------------

  /**
   * Start `command` as the agent user (or `user`) in a process group of its own. The deadline (120 s) ends the
   * group; past `outputBytes` the output is cut and flagged, and the rest of the stream is drained.
   */
  async start(command, { user = this.agentUser ?? 'root', deadlineMs = LIMITS.commandDeadlineMs, outputBytes = LIMITS.outputBytes } = {}) {
    const output = { chunks: [], kept: 0, streamed: 0, truncated: false }
    const take = (stream) => (text) => {
      const data = Buffer.from(text, 'utf8')
      output.streamed += data.length
      const room = outputBytes - output.kept
      if (data.length > room) output.truncated = true
      if (room > 0) {
        const part = data.subarray(0, room)
        output.chunks.push([stream, part])
        output.kept += part.length
      }
    }
    const handle = await this.sandbox.commands.run(`exec python3 -I -c ${quote(GROUP_LEADER)} ${quote(command)}`, {
      user,
      background: true,
      timeoutMs: 0,
      onStdout: take('stdout'),
      onStderr: take('stderr'),
    })
    const running = new RunningCommand(this, handle, output)
    running.deadline = setTimeout(() => {
      running.timedOut = true
      running.cancel().catch(() => {})
    }, deadlineMs)
    return running
  }

  /** `start` and wait for the end. */
  async run(command, options = {}) {
    return (await this.start(command, options)).wait()
  }

  /** End a process group (SIGTERM, grace, SIGKILL) from a root command; returns the members still there. */
  async endGroup(group, graceMs = LIMITS.cancelGraceMs) {
    const ended = await this.exec(`python3 -I -c ${quote(END_GROUP)} ${group} ${graceMs / 1000}`)
    if (ended.exitCode !== 0) throw new ComputerError(`ending process group ${group} failed: ${ended.stderr.trim()}`)
    return ended.stdout.split(/\s+/).filter(Boolean).map(Number)
  }

  // --- files -------------------------------------------------------------------------------------

  async #refuseWrite(path, user) {
    const reason = (await this.exec(`python3 -I -c ${quote(WRITE_REFUSAL)} ${quote(path)}`, { user })).stdout.trim()
    if (reason) throw new ComputerError(`refused to write ${path}: ${reason}`)
  }

  /**
   * Write `source` (a ReadableStream or async iterable of bytes) to `path` as the agent user: staged beside the
   * destination (one file system), published by one rename. A source that fails leaves neither file.
   */
  async writeStream(path, source, { user = this.agentUser ?? 'root' } = {}) {
    await this.#refuseWrite(path, user)
    const slash = path.lastIndexOf('/')
    const staged = `${path.slice(0, slash + 1)}${STAGE_PREFIX}${randomUUID()}`
    let size = 0
    await this.slots.hold(async () => {
      const counted = toStream(source, (n) => (size += n))
      try {
        await this.sandbox.files.write(staged, counted, { user })
      } catch (err) {
        await this.sandbox.files.remove(staged, { user }).catch(() => {})
        throw new ComputerError(`the upload of ${path} failed, nothing was published: ${err?.message ?? err}`)
      }
    })
    await this.#publish(staged, path, size, user)
    return { path, size }
  }

  async #publish(staged, path, size, user) {
    try {
      await this.sandbox.files.rename(staged, path, { user })
      this.#receipt('publish', path, 'applied')
    } catch (err) {
      if (definite(err)) {
        await this.sandbox.files.remove(staged, { user }).catch(() => {})
        throw err
      }
      // The answer was lost. The receipt is the staged file's fate: gone, with the destination of its size,
      // means the rename happened; still there means it did not, and only then is it done once more.
      if (await this.sandbox.files.exists(staged, { user })) {
        await this.sandbox.files.rename(staged, path, { user })
        this.#receipt('publish', path, 'applied on the second attempt (answer lost; the staged file was still there)')
        return
      }
      const info = await this.sandbox.files.getInfo(path, { user })
      if (info.size !== size) throw new ComputerError(`the rename of ${staged} lost its answer and ${path} has ${info.size} bytes, not ${size}`)
      this.#receipt('publish', path, 'applied (answer lost; found by its receipt)')
    }
  }

  /** Why `user` could not itself rename or remove `paths` (one path: a removal), if it could not. */
  async #refuseChange(paths, user) {
    const reason = (await this.exec(`python3 -I -c ${quote(CHANGE_REFUSAL)} ${paths.map(quote).join(' ')}`, { user })).stdout.trim()
    if (reason) throw new ComputerError(`refused to ${paths.length === 1 ? 'remove' : 'rename'} ${paths[0]}: ${reason}`)
  }

  /** Rename `from` to `to` as the agent user: refused where the user could not rename it itself (envd renames as root). */
  async rename(from, to, { user = this.agentUser ?? 'root' } = {}) {
    await this.#refuseChange([from, to], user)
    return this.sandbox.files.rename(from, to, { user })
  }

  /** Remove `path` as the agent user: refused where the user could not remove it itself (envd removes as root). */
  async remove(path, { user = this.agentUser ?? 'root' } = {}) {
    await this.#refuseChange([path], user)
    return this.sandbox.files.remove(path, { user })
  }

  /** A streamed read (any size). */
  async readStream(path, { user = this.agentUser ?? 'root' } = {}) {
    return this.sandbox.files.read(path, { format: 'stream', user })
  }

  /** A buffered read, refused past 16 MiB before anything is transferred. */
  async readBytes(path, { user = this.agentUser ?? 'root' } = {}) {
    const info = await this.sandbox.files.getInfo(path, { user })
    if (info.size > LIMITS.bufferedReadBytes) {
      throw new ComputerError(`refused a buffered read of ${path}: ${info.size} bytes is over the 16 MiB limit, read it as a stream`)
    }
    return new Uint8Array(await this.sandbox.files.read(path, { format: 'bytes', user }))
  }

  // --- release -----------------------------------------------------------------------------------

  /** Kill the sandbox and confirm it is gone (get: not found); a kill that cannot be confirmed is an error. */
  async close() {
    const id = this.sandboxId
    await this.sdk.Sandbox.kill(id, this.connection)
    const deadline = Date.now() + LIMITS.closeConfirmMs
    for (;;) {
      try {
        const info = await this.sdk.Sandbox.getInfo(id, this.connection)
        if (Date.now() > deadline) throw new ComputerError(`the sandbox ${id} was killed but is still reported ${info.state} after ${LIMITS.closeConfirmMs / 1000} s`)
      } catch (err) {
        if (err instanceof this.sdk.NotFoundError || err?.name === 'SandboxNotFoundError') return
        throw err
      }
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
}

class RunningCommand {
  constructor(computer, handle, output) {
    this.computer = computer
    this.handle = handle
    this.output = output
    this.pid = handle.pid // the command's process group: it leads one
    this.timedOut = false
    this.cancelled = false
    this.survivors = []
    this.deadline = null
    this.streamHeld = false // the stream outlived the cancellation: something still holds its output open
    this.letGo = new Promise((resolve) => (this.release = resolve))
  }

  /** What the command has printed on stdout so far (within the output limit). */
  get stdoutSoFar() {
    return Buffer.concat(this.output.chunks.filter(([s]) => s === 'stdout').map(([, b]) => b)).toString('utf8')
  }

  /** End the command's process group, descendants included; returns the members that survived (none). */
  async cancel(graceMs = LIMITS.cancelGraceMs) {
    this.cancelled = true
    this.survivors = await this.computer.endGroup(this.pid, graceMs)
    await this.computer.sandbox.commands.kill(this.pid).catch(() => false)
    setTimeout(() => this.release(), LIMITS.streamEndMs).unref()
    return this.survivors
  }

  async wait() {
    let exitCode
    let error = null
    try {
      const ended = await Promise.race([this.handle.wait(), this.letGo.then(() => null)])
      if (ended === null) {
        this.streamHeld = true
        await this.handle.disconnect()
      }
      exitCode = ended?.exitCode ?? null
    } catch (err) {
      if (!(err instanceof this.computer.sdk.CommandExitError)) throw err
      exitCode = err.exitCode
      error = err.error ?? null
    } finally {
      clearTimeout(this.deadline)
    }
    const text = (stream) => Buffer.concat(this.output.chunks.filter(([s]) => s === stream).map(([, b]) => b)).toString('utf8')
    return {
      exitCode,
      error,
      stdout: text('stdout'),
      stderr: text('stderr'),
      truncated: this.output.truncated,
      keptBytes: this.output.kept,
      streamedBytes: this.output.streamed,
      timedOut: this.timedOut,
      cancelled: this.cancelled,
      survivors: this.survivors,
      streamHeld: this.streamHeld,
    }
  }
}

/** A byte ReadableStream from `source` that reports every chunk's size. */
function toStream(source, counted) {
  const reader = typeof source.getReader === 'function' ? source.getReader() : null
  const iterator = reader ? null : (source[Symbol.asyncIterator]?.() ?? source[Symbol.iterator]())
  const next = reader ? () => reader.read() : () => iterator.next()
  return new ReadableStream({
    async pull(controller) {
      const { value, done } = await next()
      if (done) return controller.close()
      const chunk = value instanceof Uint8Array ? value : new Uint8Array(value)
      counted(chunk.length)
      controller.enqueue(chunk)
    },
  })
}
