// An E2B provider for @tanstack/ai-sandbox: `e2bSandbox(options).create()` returns a SandboxHandle.
//
// TanStack's own E2B provider (@tanstack/ai-sandbox-e2b) is not published on npm, so this is the
// project's implementation of the published SandboxHandle contract, behaving as the upstream provider
// is documented to:
// - create: Sandbox.create({template, timeoutMs, metadata, envs, lifecycle: {onTimeout}}), then
//   files.makeDir(workdir) (default /home/user/workspace; the virtual root /workspace maps onto it);
// - every command: commands.run("exec setsid bash -c '<cmd>'", {background: true, cwd, envs,
//   stdin: false for exec and true for spawn, timeoutMs: 0}), then handle.wait();
// - kill: commands.run('kill -KILL -- -<pid>') for the process group, then handle.kill().
// The packages (`e2b` and `@tanstack/ai-sandbox`) are passed in as loaded modules, so the caller decides
// which pinned copy runs (the runner loads them from its Node project).

const VIRTUAL_ROOT = '/workspace'

/** Single-quote `text` for bash. */
export function shellQuote(text) {
  return `'${String(text).replaceAll("'", "'\\''")}'`
}

/** An async-iterable queue of decoded chunks, ended once. */
function chunkStream() {
  const items = []
  const waiting = []
  let ended = false
  return {
    push(item) {
      if (ended) return
      const next = waiting.shift()
      if (next) next({ value: item, done: false })
      else items.push(item)
    },
    end() {
      ended = true
      for (const next of waiting.splice(0)) next({ value: undefined, done: true })
    },
    [Symbol.asyncIterator]() {
      return {
        next: () => {
          if (items.length > 0) return Promise.resolve({ value: items.shift(), done: false })
          if (ended) return Promise.resolve({ value: undefined, done: true })
          return new Promise((resolve) => waiting.push(resolve))
        },
      }
    },
  }
}

export const E2B_CAPABILITIES = Object.freeze({
  fs: true,
  exec: true,
  env: true,
  ports: true,
  backgroundProcesses: true,
  writableStdin: true,
  snapshots: false,
  networkPolicy: false,
  durableFilesystem: true,
  fork: false,
})

/** The SandboxHandle of one live E2B sandbox. */
function handleFor(modules, sandbox, workdir) {
  const { CommandExitError } = modules.e2b
  const envs = {}
  const mapPath = (path) => {
    const text = String(path ?? VIRTUAL_ROOT)
    if (text === VIRTUAL_ROOT) return workdir
    if (text.startsWith(`${VIRTUAL_ROOT}/`)) return `${workdir}${text.slice(VIRTUAL_ROOT.length)}`
    return text.startsWith('/') ? text : `${workdir}/${text}`
  }
  const start = (command, options = {}, { stdin, onStdout, onStderr }) =>
    sandbox.commands.run(`exec setsid bash -c ${shellQuote(command)}`, {
      background: true,
      cwd: mapPath(options.cwd),
      envs: { ...envs, ...(options.env ?? {}) },
      stdin,
      timeoutMs: 0,
      onStdout,
      onStderr,
    })
  const killGroup = async (handle) => {
    try {
      await sandbox.commands.run(`kill -KILL -- -${handle.pid}`)
    } catch {
      // The group is already gone: kill exits non-zero, which the SDK raises.
    }
    await handle.kill()
  }
  const settle = async (handle) => {
    try {
      return await handle.wait()
    } catch (err) {
      if (err instanceof CommandExitError) return err
      throw err
    }
  }

  const process = {
    async exec(command, options = {}) {
      const handle = await start(command, options, { stdin: false })
      const abort = () => void killGroup(handle).catch(() => {})
      options.signal?.addEventListener('abort', abort, { once: true })
      try {
        const result = await settle(handle)
        return { stdout: result.stdout, stderr: result.stderr, exitCode: result.exitCode }
      } finally {
        options.signal?.removeEventListener('abort', abort)
      }
    },
    async spawn(command, options = {}) {
      const stdout = chunkStream()
      const stderr = chunkStream()
      const handle = await start(command, options, {
        stdin: true,
        onStdout: (data) => stdout.push(data),
        onStderr: (data) => stderr.push(data),
      })
      const exited = settle(handle).then(
        (result) => result.exitCode,
        () => -1,
      )
      exited.finally(() => {
        stdout.end()
        stderr.end()
      })
      options.signal?.addEventListener('abort', () => void killGroup(handle).catch(() => {}), { once: true })
      return {
        pid: handle.pid,
        stdout,
        stderr,
        stdin: {
          write: (data) => sandbox.commands.sendStdin(handle.pid, data),
          end: () => sandbox.commands.closeStdin(handle.pid),
        },
        wait: () => exited,
        kill: () => killGroup(handle),
      }
    },
  }

  const fs = {
    read: (path) => sandbox.files.read(mapPath(path)),
    readBytes: (path) => sandbox.files.read(mapPath(path), { format: 'bytes' }),
    write: async (path, data) => {
      await sandbox.files.write(mapPath(path), data)
    },
    list: async (path) =>
      (await sandbox.files.list(mapPath(path))).map((entry) => ({
        name: entry.name,
        path: entry.path,
        type: entry.type === 'dir' ? 'dir' : 'file',
      })),
    mkdir: async (path) => {
      await sandbox.files.makeDir(mapPath(path))
    },
    remove: (path) => sandbox.files.remove(mapPath(path)),
    rename: async (from, to) => {
      await sandbox.files.rename(mapPath(from), mapPath(to))
    },
    exists: (path) => sandbox.files.exists(mapPath(path)),
  }

  return {
    id: sandbox.sandboxId,
    provider: 'e2b',
    workspaceRoot: workdir,
    capabilities: E2B_CAPABILITIES,
    fs,
    git: modules.aiSandbox.createExecBackedGit(process, workdir),
    process,
    ports: { connect: async (port) => ({ url: `https://${sandbox.getHost(port)}` }) },
    env: {
      set: async (vars) => {
        Object.assign(envs, vars)
      },
    },
    destroy: async () => {
      await sandbox.kill()
    },
  }
}

/** A SandboxProvider creating E2B sandboxes with the unmodified SDK: `modules` = {e2b, aiSandbox}. */
export function e2bSandbox(modules, options = {}) {
  const sdk = modules.e2b
  const {
    apiKey,
    domain,
    apiUrl,
    template,
    timeoutMs = 1_800_000,
    onTimeout = 'kill',
    workdir = '/home/user/workspace',
    metadata = {},
  } = options
  const connection = Object.fromEntries(Object.entries({ apiKey, domain, apiUrl }).filter(([, v]) => v !== undefined))
  return {
    name: 'e2b',
    capabilities: () => E2B_CAPABILITIES,
    async create(input = {}) {
      const createOptions = {
        ...connection,
        timeoutMs,
        metadata: { ...metadata, ...(input.id ? { 'tanstack-ai-key': input.id } : {}) },
        envs: input.env,
        lifecycle: { onTimeout },
      }
      const sandbox = template
        ? await sdk.Sandbox.create(template, createOptions)
        : await sdk.Sandbox.create(createOptions)
      await sandbox.files.makeDir(workdir)
      return handleFor(modules, sandbox, workdir)
    },
    async resume({ id }) {
      try {
        return handleFor(modules, await sdk.Sandbox.connect(id, connection), workdir)
      } catch (err) {
        if (err instanceof sdk.SandboxNotFoundError) return null
        throw err
      }
    },
    async destroy({ id }) {
      await sdk.Sandbox.kill(id, connection)
    },
  }
}
