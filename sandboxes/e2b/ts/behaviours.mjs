// Documented behaviours of the npm SDK, each checked twice: what the call returns, and the state it leaves,
// seen through an independent path (a shell command in the sandbox, the REST API, another call). The same
// behaviours as the Python suite (sandboxes/e2b/python/behaviours.py), named `js_<behaviour>`; the
// inventory (sandboxes/e2b/behaviours.toml) names both.
//
// Which public SDK methods a step called is observed through Proxies around the SDK's own objects (no
// patch: the call goes to the SDK unchanged) and recorded in `details.sdk_calls` for the coverage table.

import { createHash, randomBytes } from 'node:crypto'

import {
  Fail,
  NOT_RECEIVED,
  errorDetails,
  excerpt,
  expect,
  main,
  show,
  sleep,
  step,
  waitUntilSeen,
} from './driver.mjs'

const SUITE = 'behaviours'
const HOME = '/home/user'
// Sizes on both sides of the buffer boundaries a transport may have (pages, stream chunks, 64 KiB frames).
const BOUNDARY_SIZES = [0, 1, 4095, 4096, 4097, 65535, 65536, 65537, (1 << 20) - 1, 1 << 20, (1 << 20) + 1]
// Inside the sandbox: wait (at most 5 s) until no process matches, then say so.
const GONE = (pattern) => `timeout 5 sh -c 'while pgrep -f "^${pattern}$" >/dev/null; do sleep 0.05; done' && echo gone`
const MEMBERS = new Set(['commands', 'files', 'pty'])
// The extended attributes of a file, as the shell sees them (envd keeps file metadata as user.e2b.* xattrs).
const XATTRS = `python3 -c 'import json, os, sys; p = sys.argv[1]; print(json.dumps(sorted([k, os.getxattr(p, k).decode()] for k in os.listxattr(p))))'`

// --- observing calls ---------------------------------------------------------------------------

/** `target` seen through a Proxy that records each public method called on it as `<prefix>.<name>`. */
function observed(target, prefix, calls) {
  return new Proxy(target, {
    get(object, name, receiver) {
      const value = Reflect.get(object, name, object)
      if (typeof name !== 'string' || name.startsWith('_')) return value
      if (MEMBERS.has(name) && value && typeof value === 'object') return observed(value, `${prefix}.${name}`, calls)
      if (typeof value !== 'function' || name === 'constructor') return value
      return (...args) => {
        calls.add(`${prefix}.${name}`)
        const result = value.apply(object, args)
        // A sandbox returned by create/connect is observed too.
        if (result instanceof Promise) {
          return result.then((made) => (made instanceof object.constructor || made?.sandboxId && made?.commands ? observed(made, 'Sandbox', calls) : made))
        }
        return result
      }
    },
  })
}

function behaviour(name, body) {
  step(`js_${name}`, async (ctx, obs) => {
    const calls = new Set()
    const b = new Behaviour(ctx, obs, calls)
    try {
      await body(b, obs)
    } finally {
      obs.sdk_calls = [...calls].sort()
    }
  })
}

class Behaviour {
  constructor(ctx, obs, calls) {
    this.ctx = ctx
    this.obs = obs
    this.calls = calls
    this.Sandbox = observed(ctx.sdk.Sandbox, 'Sandbox', calls)
  }

  /** A fresh sandbox tagged with the run (killed when the step ends, unless the context keeps it). */
  async fresh(options = {}) {
    const metadata = { ...this.ctx.metadata, ...(options.metadata ?? {}) }
    const opts = { timeoutMs: this.ctx.sandboxTimeoutMs, ...options, metadata }
    const made = this.ctx.template ? await this.Sandbox.create(this.ctx.template, opts) : await this.Sandbox.create(opts)
    this.ctx.created.push(made.sandboxId)
    return made
  }

  /** One sandbox shared by the behaviours that only add files and processes of their own. */
  async shared() {
    const state = this.ctx.state
    if (!state.shared) {
      state.shared = await this.fresh({ timeoutMs: this.ctx.sharedTimeoutMs })
      this.ctx.sharedCreated(state.shared.sandboxId)
      await this.ctx.watch(state.shared.sandboxId, () => state.shared, () => delete state.shared)
    }
    this.ctx.uses(state.shared.sandboxId)
    return observed(this.ctx.state.shared, 'Sandbox', this.calls)
  }

  /** The independent path inside the sandbox: a shell command's stdout. */
  async sh(sandbox, command, opts = {}) {
    return (await sandbox.commands.run(command, opts)).stdout
  }

  dir(name) {
    return `${HOME}/bh-js-${name}`
  }
}

// --- the second path: the REST API -------------------------------------------------------------

async function rest(path, init = {}) {
  const url = `${process.env.E2B_API_URL}${path}`
  return fetch(url, { ...init, headers: { 'X-API-KEY': process.env.E2B_API_KEY, ...(init.headers ?? {}) } })
}

async function restInfo(sandboxId) {
  const response = await rest(`/sandboxes/${sandboxId}`)
  return { status: response.status, body: response.status === 200 ? await response.json() : null }
}

/** JSON with object keys sorted, so that equal values compare equal whatever their key order. */
function canon(value) {
  if (Array.isArray(value)) return value.map(canon)
  if (value && typeof value === 'object' && !(value instanceof Date)) {
    return Object.fromEntries(Object.keys(value).sort().map((key) => [key, canon(value[key])]))
  }
  return value
}

function same(obs, key, actual, wanted) {
  obs[key] = typeof actual === 'string' ? excerpt(actual) : actual
  if (show(canon(actual)) !== show(canon(wanted))) throw new Fail(`${key}: got ${excerpt(show(actual))}, expected ${excerpt(show(wanted))}`)
}

async function rejects(obs, key, call, ...names) {
  let value
  try {
    value = await call()
  } catch (err) {
    obs[key] = errorDetails(err)
    expect(names.includes(err?.name), `${key}: raised ${err?.name}: ${err?.message}, expected ${names.join(' or ')}`)
    return err
  }
  obs[key] = { returned: excerpt(show(value)) }
  throw new Fail(`${key}: returned ${excerpt(show(value))} instead of raising ${names.join(' or ')}`)
}

const sha256 = (data) => createHash('sha256').update(data).digest('hex')
const seconds = (iso) => new Date(iso).getTime() / 1000

// --- lifecycle ---------------------------------------------------------------------------------

behaviour('create_envs_metadata', async (b, obs) => {
  const sbx = await b.fresh({ envs: { BH_VAR: 'v 1 ✓', BH_EMPTY: '' }, metadata: { 'bh-key': 'bh value' } })
  same(obs, 'envs_in_shell', await b.sh(sbx, 'printf "%s|%s|%s" "$BH_VAR" "${BH_EMPTY-unset}" "$HOME"'), `v 1 ✓||${HOME}`)
  const { body } = await restInfo(sbx.sandboxId)
  same(obs, 'rest_metadata', body?.metadata?.['bh-key'], 'bh value')
  const info = await sbx.getInfo()
  same(obs, 'sdk_metadata', info.metadata['bh-key'], 'bh value')
  same(obs, 'template_id_agrees', info.templateId, body?.templateID)
})

behaviour('create_timeout_end_at', async (b, obs) => {
  const sbx = await b.fresh({ timeoutMs: 97_000 })
  const { body } = await restInfo(sbx.sandboxId)
  const lifetime = seconds(body.endAt) - seconds(body.startedAt)
  obs.rest_lifetime_s = lifetime
  expect(Math.abs(lifetime - 97) <= 3, `endAt - startedAt is ${lifetime} s, expected the 97 s asked for`)
})

behaviour('get_info_fields', async (b, obs) => {
  const sbx = await b.shared()
  const info = await sbx.getInfo()
  const { body } = await restInfo(sbx.sandboxId)
  const full = await b.Sandbox.getFullInfo(sbx.sandboxId)
  same(obs, 'full_info_id', [full.sandboxId, full.templateId], [body.sandboxID, body.templateID])
  const sdk = {
    sandboxID: info.sandboxId, templateID: info.templateId, state: info.state, cpuCount: info.cpuCount,
    memoryMB: info.memoryMB, metadata: info.metadata, startedAt: info.startedAt.getTime() / 1000, endAt: info.endAt.getTime() / 1000,
  }
  const wire = Object.fromEntries(Object.keys(sdk).map((key) => [key, body[key]]))
  wire.startedAt = seconds(body.startedAt)
  wire.endAt = seconds(body.endAt)
  same(obs, 'sdk_equals_rest', sdk, wire)
  same(obs, 'state', info.state, 'running')
  const now = Date.now()
  expect(info.startedAt.getTime() <= now && now <= info.endAt.getTime(), `now is not within [${show(info.startedAt)}, ${show(info.endAt)}]`)
})

behaviour('set_timeout', async (b, obs) => {
  const sbx = await b.fresh() // its own: a shared sandbox cut to 180 s would expire under later cases
  for (const s of [250, 180]) {
    const asked = Date.now() / 1000
    await sbx.setTimeout(s * 1000)
    const end = seconds((await restInfo(sbx.sandboxId)).body.endAt)
    obs[`end_minus_now_${s}`] = Math.round((end - asked) * 10) / 10
    expect(Math.abs(end - asked - s) <= 3, `setTimeout(${s * 1000}) put endAt ${end - asked} s ahead`)
  }
})

behaviour('list_filters_paging', async (b, obs) => {
  const group = `${b.ctx.runId}-js-list`
  const first = await b.fresh({ metadata: { 'bh-group': group, 'bh-which': 'first' } })
  const second = await b.fresh({ metadata: { 'bh-group': group, 'bh-which': 'second' } })
  await second.betaPause()
  const ids = async (query, limit) => {
    const paginator = b.Sandbox.list({ query, limit })
    const pages = [(await paginator.nextItems()).map((s) => s.sandboxId)]
    while (paginator.hasNext && pages.length < 5) pages.push((await paginator.nextItems()).map((s) => s.sandboxId))
    return { pages, more: paginator.hasNext }
  }
  const both = { metadata: { 'bh-group': group }, state: ['running', 'paused'] }
  const sorted = (list) => [...list].sort()
  same(obs, 'both_states', sorted((await ids(both)).pages.flat()), sorted([first.sandboxId, second.sandboxId]))
  same(obs, 'metadata_filter', (await ids({ metadata: { 'bh-group': group, 'bh-which': 'first' } })).pages.flat(), [first.sandboxId])
  same(obs, 'state_paused', (await ids({ metadata: { 'bh-group': group }, state: ['paused'] })).pages.flat(), [second.sandboxId])
  same(obs, 'state_running', (await ids({ metadata: { 'bh-group': group }, state: ['running'] })).pages.flat(), [first.sandboxId])
  const paged = await ids(both, 1)
  same(obs, 'pages_of_one', paged.pages.map((page) => page.length), [1, 1])
  same(obs, 'pages_cover_both', sorted(paged.pages.flat()), sorted([first.sandboxId, second.sandboxId]))
  expect(!paged.more, 'hasNext is still true after the last page')
  const wire = await (await rest(`/v2/sandboxes?metadata=${encodeURIComponent(`bh-group=${group}`)}&state=paused`)).json()
  same(obs, 'rest_filter', wire.map((s) => s.sandboxID), [second.sandboxId])
})

behaviour('pause_connect', async (b, obs) => {
  const sbx = await b.fresh()
  await sbx.files.write(`${HOME}/kept.txt`, 'kept across pause')
  same(obs, 'pause', await sbx.pause(), true)
  same(obs, 'rest_state_paused', (await restInfo(sbx.sandboxId)).body?.state, 'paused')
  same(obs, 'sdk_state_paused', (await sbx.getInfo()).state, 'paused')
  const resumed = await b.Sandbox.connect(sbx.sandboxId)
  same(obs, 'rest_state_resumed', (await restInfo(sbx.sandboxId)).body?.state, 'running')
  same(obs, 'file_kept', await b.sh(resumed, `cat ${HOME}/kept.txt`), 'kept across pause')
  same(obs, 'is_running', await resumed.isRunning(), true)
})

behaviour('kill', async (b, obs) => {
  const sbx = await b.fresh()
  same(obs, 'is_running_new', await sbx.isRunning(), true)
  same(obs, 'kill', await sbx.kill(), true)
  b.ctx.killed.add(sbx.sandboxId)
  same(obs, 'rest_status_after_kill', (await restInfo(sbx.sandboxId)).status, 404)
  same(obs, 'is_running_after_kill', await sbx.isRunning(), false)
  same(obs, 'kill_again', await b.Sandbox.kill(sbx.sandboxId), false)
  const listed = (await b.Sandbox.list({ query: { metadata: b.ctx.metadata } }).nextItems()).map((s) => s.sandboxId)
  expect(!listed.includes(sbx.sandboxId), 'a killed sandbox is still listed')
})

behaviour('metrics', async (b, obs) => {
  const sbx = await b.shared()
  const samples = await sbx.getMetrics()
  obs.samples = samples.length
  expect(samples.length >= 1, 'getMetrics() returned no sample')
  const last = samples.at(-1)
  obs.last = { cpuCount: last.cpuCount, memTotal: last.memTotal, diskTotal: last.diskTotal }
  expect(last.cpuCount >= 1 && last.memTotal > 0 && last.diskTotal > 0, `empty sample ${show(obs.last)}`)
  const wire = await rest(`/sandboxes/${sbx.sandboxId}/metrics`)
  same(obs, 'rest_status', wire.status, 200)
  expect((await wire.json()).length >= 1, 'GET /sandboxes/{id}/metrics returned no sample')
})

behaviour('create_internet_access', async (b, obs) => {
  const sbx = await b.fresh({ allowInternetAccess: false })
  same(obs, 'rest', (await restInfo(sbx.sandboxId)).body?.allowInternetAccess, false)
  same(obs, 'sdk', (await sbx.getInfo()).allowInternetAccess, false)
})

behaviour('snapshots', async (b, obs) => {
  const sbx = await b.fresh()
  await sbx.files.write(`${HOME}/origin.txt`, 'from the origin')
  const snapshot = await sbx.createSnapshot()
  obs.snapshot = snapshot
  const listed = (await sbx.listSnapshots().nextItems()).map((s) => s.snapshotId)
  expect(listed.includes(snapshot.snapshotId), 'listSnapshots() does not list the new snapshot')
  const restored = await b.Sandbox.create(snapshot.snapshotId, { timeoutMs: b.ctx.sandboxTimeoutMs, metadata: b.ctx.metadata })
  b.ctx.created.push(restored.sandboxId)
  same(obs, 'restored_file', await b.sh(restored, `cat ${HOME}/origin.txt`), 'from the origin')
  same(obs, 'delete_snapshot', await b.Sandbox.deleteSnapshot(snapshot.snapshotId), true)
  const after = await (await rest(`/snapshots?sandboxID=${sbx.sandboxId}`)).text()
  expect(!after.includes(snapshot.snapshotId), 'GET /snapshots still lists the deleted snapshot')
})

behaviour('fork', async (b, obs) => {
  const sbx = await b.fresh()
  await sbx.files.write(`${HOME}/origin.txt`, 'from the origin')
  const forks = await sbx.fork()
  for (const made of forks) if (made?.sandboxId) b.ctx.created.push(made.sandboxId)
  expect(forks.length === 1 && forks[0]?.sandboxId, `fork() returned ${show(forks.map(String))}`)
  same(obs, 'forked_file', await b.sh(forks[0], `cat ${HOME}/origin.txt`), 'from the origin')
  await b.sh(forks[0], `echo changed > ${HOME}/origin.txt`)
  same(obs, 'origin_untouched', await b.sh(sbx, `cat ${HOME}/origin.txt`), 'from the origin')
})

behaviour('metrics_window', async (b, obs) => {
  const sbx = await b.shared()
  const before = new Date(Date.now() - 7200_000)
  same(obs, 'window_before_creation', await sbx.getMetrics({ start: before, end: before }), [])
  same(obs, 'bad_start', (await rest(`/sandboxes/${sbx.sandboxId}/metrics?start=not-a-time`)).status, 400)
})

behaviour('host_and_mcp', async (b, obs) => {
  const sbx = await b.fresh()
  const domain = (await restInfo(sbx.sandboxId)).body?.domain || process.env.E2B_DOMAIN || 'e2b.app'
  same(obs, 'get_host', sbx.getHost(8123), `8123-${sbx.sandboxId}.${domain}`)
  same(obs, 'get_mcp_url', sbx.getMcpUrl(), `https://50005-${sbx.sandboxId}.${domain}/mcp`)
  await b.sh(sbx, 'mkdir -p /etc/mcp-gateway && printf bh-mcp-js > /etc/mcp-gateway/.token', { user: 'root' })
  same(obs, 'get_mcp_token', await sbx.getMcpToken(), 'bh-mcp-js')
})

behaviour('update_network', async (b, obs) => {
  const sbx = await b.fresh()
  await sbx.updateNetwork({ denyOut: ['10.9.9.9/32'] })
  const network = (await restInfo(sbx.sandboxId)).body?.network ?? {}
  obs.rest_network = network
  expect((network.denyOut ?? []).includes('10.9.9.9/32'), `GET /sandboxes/{id} network is ${show(network)}`)
})

// --- commands ----------------------------------------------------------------------------------

behaviour('run_envs_cwd_user', async (b, obs) => {
  const sbx = await b.shared()
  const result = await sbx.commands.run('printf "%s|" "$BH_A" "$BH_B"; pwd; whoami', {
    envs: { BH_A: 'a b', BH_B: '=x=' }, cwd: '/tmp', user: 'root',
  })
  same(obs, 'stdout', result.stdout, 'a b|=x=|/tmp\nroot\n')
  same(obs, 'default_user', await b.sh(sbx, 'whoami; pwd'), `user\n${HOME}\n`)
})

behaviour('run_streams', async (b, obs) => {
  const sbx = await b.shared()
  const out = []
  const err = []
  const signals = []
  // The rest is written once the client has received out1 (a second command it runs makes the file the first
  // waits for): output sent as it comes, not at the command's end, however loaded the endpoint's host is
  const gate = '/tmp/bh-js-streams-seen'
  const waits = waitUntilSeen(b.ctx, gate, 'out1')
  const script = `rm -f ${gate}; for i in 1 2 3; do echo out$i; echo err$i >&2; [ $i = 1 ] && ${waits}; sleep 0.05; done`
  const onStdout = (d) => {
    out.push(d)
    // a kept promise is handled at once (its error is the step's, below): one that rejects while the main command
    // is still failing is never an unhandled rejection
    if (signals.length === 0 && out.join('').includes('out1\n')) signals.push(sbx.commands.run(`touch ${gate}`).then(() => null, (e) => e))
  }
  const result = await sbx.commands.run(script, { onStdout, onStderr: (d) => err.push(d) })
  const refused = (await Promise.all(signals)).find((e) => e !== null)
  if (refused !== undefined) throw refused
  const said = result.stderr.split(/(?<=\n)/)
  same(obs, 'stdout', result.stdout, 'out1\nout2\nout3\n')
  same(obs, 'held_back', said.filter((line) => line.includes(NOT_RECEIVED)).map((line) => line.trim()), [])
  same(obs, 'stderr', said.filter((line) => !line.includes(NOT_RECEIVED)).join(''), 'err1\nerr2\nerr3\n')
  same(obs, 'on_stdout_joined', out.join(''), result.stdout)
  same(obs, 'on_stderr_joined', err.join(''), result.stderr)
  same(obs, 'exit_code', result.exitCode, 0)
})

behaviour('run_exit_code', async (b, obs) => {
  const sbx = await b.shared()
  const marker = '/tmp/bh-js-exit-marker'
  const err = await rejects(obs, 'exit_7', () => sbx.commands.run(`echo partial; echo ran > ${marker}; exit 7`), 'CommandExitError')
  same(obs, 'exit_code', err.exitCode, 7)
  same(obs, 'stdout_kept', err.stdout, 'partial\n')
  same(obs, 'side_effect', await sbx.files.read(marker), 'ran\n')
})

behaviour('run_timeout', async (b, obs) => {
  const sbx = await b.shared()
  // The deadline ends the stream and kills the process at the same moment (envd runs the process under the
  // request's context): the SDK raises whichever it sees first, a timeout or the kill.
  const err = await rejects(obs, 'timeout', () => sbx.commands.run('sleep 21.5', { timeoutMs: 1000 }), 'TimeoutError', 'CommandExitError')
  if (err.name === 'CommandExitError') same(obs, 'killed', [err.exitCode, err.error], [-1, 'signal: killed'])
  same(obs, 'process_gone', await b.sh(sbx, GONE('sleep 21.5')), 'gone\n')
})

behaviour('background_list_kill', async (b, obs) => {
  const sbx = await b.shared()
  const handle = await sbx.commands.run('sleep 45', { background: true, envs: { BH_TAG: 'js' }, cwd: '/tmp' })
  const listed = new Map((await sbx.commands.list()).map((p) => [p.pid, p]))
  expect(listed.has(handle.pid), `pid ${handle.pid} is not in commands.list()`)
  const proc = listed.get(handle.pid)
  same(obs, 'listed_cwd', proc.cwd, '/tmp')
  same(obs, 'listed_env', proc.envs?.BH_TAG, 'js')
  same(obs, 'alive_in_shell', await b.sh(sbx, `kill -0 ${handle.pid} && echo alive`), 'alive\n')
  same(obs, 'kill', await sbx.commands.kill(handle.pid), true)
  // kill answers once the process is gone
  same(obs, 'listed_right_after_kill', (await sbx.commands.list()).some((p) => p.pid === handle.pid), false)
  const err = await rejects(obs, 'wait_after_kill', () => handle.wait(), 'CommandExitError')
  same(obs, 'killed_exit_code', err.exitCode, -1)
  same(obs, 'gone_in_shell', await b.sh(sbx, `kill -0 ${handle.pid} 2>/dev/null || echo gone`), 'gone\n')
  expect(!(await sbx.commands.list()).some((p) => p.pid === handle.pid), 'a killed pid is still listed')
  same(obs, 'kill_again', await sbx.commands.kill(handle.pid), false)
})

behaviour('stdin', async (b, obs) => {
  const sbx = await b.shared()
  const handle = await sbx.commands.run('while read -r line; do echo "got:$line"; done; echo eof', { background: true, stdin: true })
  await sbx.commands.sendStdin(handle.pid, 'one\n')
  await sbx.commands.sendStdin(handle.pid, 'two ✓\n')
  await sbx.commands.closeStdin(handle.pid)
  const result = await handle.wait()
  same(obs, 'stdout', result.stdout, 'got:one\ngot:two ✓\neof\n')
})

behaviour('connect_command', async (b, obs) => {
  const sbx = await b.shared()
  const flag = '/tmp/bh-js-go'
  const handle = await sbx.commands.run(`echo before; while [ ! -e ${flag} ]; do sleep 0.05; done; echo after`, { background: true })
  await handle.disconnect()
  same(obs, 'alive_after_disconnect', await b.sh(sbx, `kill -0 ${handle.pid} && echo alive`), 'alive\n')
  const again = await sbx.commands.connect(handle.pid)
  await b.sh(sbx, `touch ${flag}`) // the later output is written only once connected again
  const result = await again.wait()
  same(obs, 'exit_code', result.exitCode, 0)
  expect(result.stdout.endsWith('after\n'), `connect() got stdout ${show(result.stdout)}, expected it to end 'after\\n'`)
})

behaviour('output_sizes', async (b, obs) => {
  const sbx = await b.shared()
  const wrong = {}
  for (const size of BOUNDARY_SIZES) {
    const result = await sbx.commands.run(`head -c ${size} /dev/zero | tr '\\0' 'y'`)
    if (result.stdout !== 'y'.repeat(size)) wrong[size] = result.stdout.length
  }
  same(obs, 'wrong_lengths', wrong, {})
})

// --- files -------------------------------------------------------------------------------------

behaviour('write_read_sizes', async (b, obs) => {
  const sbx = await b.shared()
  const wrong = {}
  for (const size of BOUNDARY_SIZES) {
    const data = randomBytes(size)
    const path = `${b.dir('sizes')}/f${size}.bin`
    await sbx.files.write(path, data.buffer.slice(data.byteOffset, data.byteOffset + size))
    const inside = (await b.sh(sbx, `stat -c %s ${path}; sha256sum < ${path}`)).split(/\s+/)
    const back = Buffer.from(await sbx.files.read(path, { format: 'bytes' }))
    if (inside[0] !== String(size) || inside[1] !== sha256(data) || !back.equals(data)) {
      wrong[size] = { stat_size: inside[0], sha_inside_ok: inside[1] === sha256(data), read_back: back.length }
    }
  }
  same(obs, 'wrong_sizes', wrong, {})
})

behaviour('read_formats', async (b, obs) => {
  const sbx = await b.shared()
  const path = `${b.dir('formats')}.txt`
  const text = 'línea 1\n\tzwei\r\n三\n'
  await sbx.files.write(path, text)
  same(obs, 'shell', await b.sh(sbx, `cat ${path}`), text)
  same(obs, 'text', await sbx.files.read(path), text)
  same(obs, 'bytes', Buffer.from(await sbx.files.read(path, { format: 'bytes' })).toString('utf8'), text)
  same(obs, 'blob', await (await sbx.files.read(path, { format: 'blob' })).text(), text)
  const chunks = []
  for await (const chunk of await sbx.files.read(path, { format: 'stream' })) chunks.push(Buffer.from(chunk))
  same(obs, 'stream', Buffer.concat(chunks).toString('utf8'), text)
})

behaviour('write_files', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('write-files')
  const entries = [
    { path: `${base}/a.txt`, data: 'A' },
    { path: `${base}/new/deeper/b.bin`, data: new Uint8Array([0, 0x42, 0xff]).buffer },
    { path: `${base}/c.txt`, data: '' },
  ]
  const infos = await sbx.files.writeFiles(entries)
  same(obs, 'returned_paths', infos.map((i) => i.path), entries.map((e) => e.path))
  const listing = await b.sh(sbx, `cd ${base} && find . -type f | sort && od -An -tx1 new/deeper/b.bin && cat a.txt`)
  same(obs, 'in_shell', listing.split(/\s+/).filter(Boolean), ['./a.txt', './c.txt', './new/deeper/b.bin', '00', '42', 'ff', 'A'])
})

behaviour('list_depth', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('depth')
  await b.sh(sbx, `mkdir -p ${base}/a/b/c && touch ${base}/top.txt ${base}/a/one.txt ${base}/a/b/two.txt`)
  for (const depth of [1, 2, 3]) {
    const listed = (await sbx.files.list(base, { depth })).map((e) => e.path).sort()
    const found = (await b.sh(sbx, `find ${base} -mindepth 1 -maxdepth ${depth}`)).split('\n').filter(Boolean).sort()
    same(obs, `depth_${depth}`, listed, found)
  }
  await rejects(obs, 'depth_0', () => sbx.files.list(base, { depth: 0 }), 'InvalidArgumentError')
})

behaviour('entry_info', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('info')
  await b.sh(sbx, `mkdir -p ${base}/d && printf 12345 > ${base}/f && chmod 640 ${base}/f && ln -sfn f ${base}/link`)
  const entry = await sbx.files.getInfo(`${base}/f`)
  const stat = (await b.sh(sbx, `stat -c '%s %a %A %U %G %Y' ${base}/f`)).split(/\s+/)
  same(obs, 'file', [entry.type, entry.size, entry.mode.toString(8), entry.permissions, entry.owner, entry.group],
    ['file', Number(stat[0]), stat[1], stat[2], stat[3], stat[4]])
  expect(Math.abs(entry.modifiedTime.getTime() / 1000 - Number(stat[5])) <= 1, `modifiedTime ${show(entry.modifiedTime)} vs ${stat[5]}`)
  same(obs, 'symlink_target', (await sbx.files.getInfo(`${base}/link`)).symlinkTarget, `${base}/f`)
  const directory = await sbx.files.getInfo(`${base}/d`)
  const dstat = (await b.sh(sbx, `stat -c '%A %U' ${base}/d`)).split(/\s+/).filter(Boolean)
  same(obs, 'dir', [directory.type, directory.permissions, directory.owner], ['dir', ...dstat])
})

behaviour('dir_mode', async (b, obs) => {
  const sbx = await b.shared()
  const path = b.dir('dir-mode')
  await b.sh(sbx, `mkdir -p ${path} && chmod 750 ${path}`)
  const directory = await sbx.files.getInfo(path)
  same(obs, 'mode', directory.mode.toString(8), (await b.sh(sbx, `stat -c %a ${path}`)).trim())
})

behaviour('make_dir', async (b, obs) => {
  const sbx = await b.shared()
  const path = `${b.dir('mkdir')}/x/y`
  same(obs, 'first', await sbx.files.makeDir(path), true)
  same(obs, 'in_shell', await b.sh(sbx, `test -d ${path} && stat -c %U ${path}`), 'user\n')
  same(obs, 'again', await sbx.files.makeDir(path), false)
})

behaviour('rename', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('rename')
  await sbx.files.write(`${base}/old.txt`, 'moved')
  const entry = await sbx.files.rename(`${base}/old.txt`, `${base}/new.txt`)
  same(obs, 'returned', [entry.path, entry.name], [`${base}/new.txt`, 'new.txt'])
  same(obs, 'in_shell', await b.sh(sbx, `test -e ${base}/old.txt || cat ${base}/new.txt`), 'moved')
  await rejects(obs, 'missing_source', () => sbx.files.rename(`${base}/nope`, `${base}/x`), 'FileNotFoundError')
})

behaviour('remove', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('remove')
  await b.sh(sbx, `mkdir -p ${base}/tree/sub && touch ${base}/file ${base}/tree/sub/x`)
  await sbx.files.remove(`${base}/file`)
  await sbx.files.remove(`${base}/tree`)
  same(obs, 'in_shell', await b.sh(sbx, `ls -A ${base}`), '')
  same(obs, 'exists_after', await sbx.files.exists(`${base}/tree`), false)
})

behaviour('remove_missing', async (b, obs) => {
  const sbx = await b.shared()
  const path = `${b.dir('remove-missing')}/never-existed`
  await sbx.files.remove(path) // envd removes with RemoveAll: a missing path is fine
  same(obs, 'in_shell', await b.sh(sbx, `test -e ${path} || echo absent`), 'absent\n')
})

behaviour('file_metadata', async (b, obs) => {
  const sbx = await b.shared()
  const path = `${b.dir('metadata')}.txt`
  const wanted = { 'bh-owner': 'suite', 'bh-n': '1' }
  await sbx.files.write(path, 'm', { metadata: wanted })
  same(obs, 'get_info', (await sbx.files.getInfo(path)).metadata, wanted)
  same(obs, 'listed', (await sbx.files.list(HOME)).find((e) => e.path === path)?.metadata, wanted)
  same(obs, 'xattrs', await b.sh(sbx, `${XATTRS} ${path}`), '[["user.e2b.bh-n", "1"], ["user.e2b.bh-owner", "suite"]]\n')
})

behaviour('file_metadata_replaced', async (b, obs) => {
  const sbx = await b.shared()
  const path = `${b.dir('metadata-replaced')}.txt`
  await sbx.files.write(path, 'm', { metadata: { 'bh-owner': 'suite' } })
  await sbx.files.write(path, 'm2') // an upload without metadata clears it
  same(obs, 'cleared', (await sbx.files.getInfo(path)).metadata ?? {}, {})
  same(obs, 'xattrs', await b.sh(sbx, `${XATTRS} ${path}`), '[]\n')
  same(obs, 'content', await b.sh(sbx, `cat ${path}`), 'm2')
})

behaviour('exists', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('exists')
  await b.sh(sbx, `mkdir -p ${base}/dir && touch ${base}/file`)
  const seen = {}
  for (const name of ['dir', 'file', 'missing']) seen[name] = await sbx.files.exists(`${base}/${name}`)
  same(obs, 'exists', seen, { dir: true, file: true, missing: false })
})

behaviour('write_as_user', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('owner')
  await sbx.files.write(`${base}/by-user.txt`, 'u')
  await sbx.files.write('/tmp/bh-js-by-root.txt', 'r', { user: 'root' })
  same(obs, 'owners', (await b.sh(sbx, `stat -c %U ${base}/by-user.txt /tmp/bh-js-by-root.txt`)).split(/\s+/).filter(Boolean), ['user', 'root'])
  // envd opens a download as root whoever asks (internal/api/download.go GetFiles): the username only expands `~`
  // and relative paths. So the default user reads a file only root may read, and a relative path read as root is
  // root's home's.
  const secret = '/root/bh-js-root-only.txt'
  await sbx.files.write('bh-js-root-only.txt', 'only root js', { user: 'root' })
  await b.sh(sbx, `chmod 600 ${secret}`, { user: 'root' })
  try {
    same(obs, 'read_root_only', await sbx.files.read(secret), 'only root js')
    same(obs, 'read_relative_as_root', await sbx.files.read('bh-js-root-only.txt', { user: 'root' }), 'only root js')
  } finally {
    await b.sh(sbx, `rm -f ${secret} /tmp/bh-js-by-root.txt`, { user: 'root' })
  }
})

behaviour('watch_recursive', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('watch')
  await b.sh(sbx, `mkdir -p ${base}/sub`)
  const events = []
  const handle = await sbx.files.watchDir(base, (event) => events.push(event), { recursive: true })
  const names = () => new Set(events.map((e) => `${e.type} ${e.name}`))
  try {
    await b.sh(sbx, `echo x > ${base}/sub/deep.txt; echo y > ${base}/top.txt; rm ${base}/top.txt`)
    for (let i = 0; i < 50 && !(names().has('create sub/deep.txt') && names().has('remove top.txt')); i++) await sleep(100)
  } finally {
    await handle.stop() // a watcher left open holds a stream of the shared sandbox's envd
  }
  obs.events = [...names()].sort()
  for (const wanted of ['create sub/deep.txt', 'create top.txt', 'remove top.txt']) {
    expect(names().has(wanted), `no '${wanted}' event (recursive watch)`)
  }
})

behaviour('signed_urls', async (b, obs) => {
  const sbx = await b.fresh({ secure: true })
  const path = `${HOME}/signed-js.bin`
  const payload = randomBytes(3000)
  const form = new FormData()
  form.append('file', new Blob([payload]), 'x.bin')
  const up = await fetch(await sbx.uploadUrl(path, { useSignatureExpiration: 120 }), { method: 'POST', body: form })
  same(obs, 'upload_status', up.status, 200)
  same(obs, 'sha_inside', (await b.sh(sbx, `sha256sum < ${path}`)).split(/\s+/)[0], sha256(payload))
  const down = await fetch(await sbx.downloadUrl(path, { useSignatureExpiration: 120 }))
  same(obs, 'download', [down.status, Buffer.from(await down.arrayBuffer()).equals(payload)], [200, true])
  const unsigned = new URL(await sbx.downloadUrl(path))
  for (const key of [...unsigned.searchParams.keys()]) if (key.startsWith('signature')) unsigned.searchParams.delete(key)
  same(obs, 'unsigned_refused', (await fetch(unsigned)).status, 401)
})

behaviour('gzip', async (b, obs) => {
  const sbx = await b.shared()
  const path = `${b.dir('gzip')}.bin`
  const data = Buffer.concat([randomBytes(70000), Buffer.alloc(70000, 'z')])
  await sbx.files.write(path, data.buffer.slice(data.byteOffset, data.byteOffset + data.length), { gzip: true })
  same(obs, 'sha_inside', (await b.sh(sbx, `sha256sum < ${path}`)).split(/\s+/)[0], sha256(data))
  same(obs, 'read_back', Buffer.from(await sbx.files.read(path, { format: 'bytes', gzip: true })).equals(data), true)
})

behaviour('download_encoding', async (b, obs) => {
  const sbx = await b.fresh()
  const path = `${HOME}/encoding.txt`
  await sbx.files.write(path, 'e2b '.repeat(1000))
  const url = await sbx.downloadUrl(path, { useSignatureExpiration: 120 })
  // fetch decodes gzip itself: the header says which encoding came.
  const zipped = await fetch(url, { headers: { 'Accept-Encoding': 'gzip' } })
  same(obs, 'gzip', [zipped.status, zipped.headers.get('content-encoding'), await zipped.text()], [200, 'gzip', 'e2b '.repeat(1000)])
  const refused = await fetch(url, { headers: { 'Accept-Encoding': 'br;q=1, identity;q=0' } })
  obs.refused_body = excerpt(await refused.text())
  same(obs, 'none_acceptable', refused.status, 406)
})

// --- pty ---------------------------------------------------------------------------------------

behaviour('pty_resize_kill', async (b, obs) => {
  const sbx = await b.shared()
  const chunks = []
  const terminal = await sbx.pty.create({ rows: 24, cols: 80, onData: (d) => chunks.push(Buffer.from(d)) })
  await sbx.pty.resize(terminal.pid, { rows: 33, cols: 111 })
  await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('stty size; exit 4\n'))
  let exitCode = 0
  try {
    await terminal.wait()
  } catch (err) {
    exitCode = err?.exitCode
  }
  const text = Buffer.concat(chunks).toString('utf8')
  obs.output = excerpt(text)
  expect(text.includes('33 111'), 'stty size inside the pty does not show the resized 33 111')
  same(obs, 'exit_code', exitCode, 4)
  const second = await sbx.pty.create({ rows: 10, cols: 40, onData: () => {} })
  same(obs, 'kill', await sbx.pty.kill(second.pid), true)
  const killed = await rejects(obs, 'wait_after_kill', () => second.wait(), 'CommandExitError')
  same(obs, 'killed_exit_code', killed.exitCode, -1)
  same(obs, 'gone_in_shell', await b.sh(sbx, `kill -0 ${second.pid} 2>/dev/null || echo gone`), 'gone\n')
})

behaviour('pty_connect_input', async (b, obs) => {
  const sbx = await b.shared()
  const chunks = []
  const first = await sbx.pty.create({ rows: 24, cols: 80, onData: () => {} })
  await first.disconnect()
  const again = await sbx.pty.connect(first.pid, { onData: (d) => chunks.push(Buffer.from(d)) })
  await sbx.pty.sendInput(first.pid, new TextEncoder().encode('echo pty-$((6*7))\nexit 0\n'))
  await again.wait()
  obs.output = excerpt(Buffer.concat(chunks).toString('utf8'))
  expect(obs.output.includes('pty-42'), 'the reconnected pty did not run the input sent to it')
})

// --- errors ------------------------------------------------------------------------------------

behaviour('errors', async (b, obs) => {
  const sbx = await b.shared()
  await rejects(obs, 'unknown_sandbox', () => b.Sandbox.connect('bh-no-such-sandbox'), 'SandboxNotFoundError', 'NotFoundError')
  await rejects(obs, 'wrong_key', () => b.Sandbox.list({ apiKey: `e2b_${'0'.repeat(40)}` }).nextItems(), 'AuthenticationError')
  await rejects(obs, 'read_missing', () => sbx.files.read(`${HOME}/bh-missing`), 'FileNotFoundError')
  await rejects(obs, 'list_a_file', () => sbx.files.list('/etc/hostname'), 'InvalidArgumentError')
  await rejects(obs, 'info_missing', () => sbx.files.getInfo('/nope/nope'), 'FileNotFoundError')
  const statuses = [
    (await rest('/sandboxes/bh-no-such-sandbox')).status,
    (await fetch(`${process.env.E2B_API_URL}/v2/sandboxes`, { headers: { 'X-API-KEY': `e2b_${'0'.repeat(40)}` } })).status,
  ]
  same(obs, 'rest_statuses', statuses, [404, 401])
})

// --- what envd does where compatibility layers differ --------------------------------------------

const PROC_FILE = '/proc/sys/kernel/hostname' // stat says 0 bytes; reading it gives the sandbox id
// Inside the sandbox: the boot id, pid 1's start time, how many `sleep 600` run, the kept file.
const BOOT_STATE = "cat /proc/sys/kernel/random/boot_id; cut -d' ' -f22 /proc/1/stat; pgrep -f '^sleep 600$' | wc -l; cat ~/kept"
// A process that outlives its command, started only once it runs (a fork may exec after the command ends).
const KEEP_RUNNING = "sleep 600 >/dev/null 2>&1 & for i in $(seq 500); do pgrep -f '^sleep 600$' >/dev/null && break; sleep 0.01; done"

behaviour('proc_file_read', async (b, obs) => {
  const sbx = await b.shared()
  const hostname = await sbx.files.read(PROC_FILE)
  const ostype = await sbx.files.read('/proc/sys/kernel/ostype')
  const [size, shellHostname, shellOstype] = (await b.sh(sbx, `stat -c %s ${PROC_FILE}; cat ${PROC_FILE}; uname -s`)).split(/\s+/)
  same(obs, 'stat_size', size, '0')
  same(obs, 'read', hostname, `${shellHostname}\n`)
  same(obs, 'next_read', ostype, `${shellOstype}\n`)
})

behaviour('kill_cuts_stream', async (b, obs) => {
  const sbx = await b.fresh()
  const handle = await sbx.commands.run('echo started; sleep 20', { background: true })
  same(obs, 'rest_kill', (await rest(`/sandboxes/${sbx.sandboxId}`, { method: 'DELETE' })).status, 204)
  let result
  try {
    result = await handle.wait()
  } catch (err) {
    obs.raised = errorDetails(err)
    expect(err?.name === 'TimeoutError', `wait() raised ${err?.name}: ${err?.message}, expected a TimeoutError`)
    // What the SDK says once its health probe found the sandbox gone after the connection was lost (an envd
    // `unavailable` end message instead reads "likely due to sandbox timeout").
    expect(
      String(err?.message).includes('killed or reached its end of life'),
      `wait() raised ${err?.message}: the connection was not lost, so the SDK was not told the sandbox was killed`
    )
    return
  }
  throw new Fail(`wait() returned exitCode ${show(result?.exitCode)}: the stream of a killed sandbox ended cleanly`)
})

behaviour('signed_url_refusals', async (b, obs) => {
  const sbx = await b.fresh({ secure: true })
  const path = `${HOME}/signed-refusal-js.txt`
  await sbx.files.write(path, 's')
  const expired = await sbx.downloadUrl(path, { useSignatureExpiration: -10 })
  const valid = await sbx.downloadUrl(path, { useSignatureExpiration: 120 })
  const forged = valid.replace('signature=v1_', 'signature=v1_x')
  const answers = await Promise.all([valid, expired, forged].map((url) => fetch(url)))
  same(obs, 'valid', [answers[0].status, await answers[0].text()], [200, 's'])
  const refused = []
  for (const answer of answers.slice(1)) refused.push([answer.status, (await answer.json()).message])
  same(obs, 'refused', refused, [[401, 'signature is already expired'], [401, 'invalid signature']])
})

behaviour('pause_filesystem', async (b, obs) => {
  const sbx = await b.fresh()
  await b.sh(sbx, `echo on-disk > ${HOME}/kept; ${KEEP_RUNNING}`)
  const before = (await b.sh(sbx, BOOT_STATE)).split(/\s+/).filter(Boolean)
  same(obs, 'paused', await sbx.pause({ keepMemory: false }), true)
  same(obs, 'rest_state_paused', (await restInfo(sbx.sandboxId)).body?.state, 'paused')
  const resumed = await b.Sandbox.connect(sbx.sandboxId)
  const after = (await b.sh(resumed, BOOT_STATE)).split(/\s+/).filter(Boolean)
  Object.assign(obs, { before, after })
  same(obs, 'files_kept_processes_gone', [before.slice(2), after.slice(2)], [['1', 'on-disk'], ['0', 'on-disk']])
  expect(before[0] !== after[0], 'the boot id did not change: the resume restored memory instead of booting')
  expect(before[1] !== after[1], 'pid 1 is the same process: the resume restored memory instead of booting')
})

// fidelity: wake on traffic, host masking, watch events

// A server answering every GET with the Host header it got (the sandbox's side of host masking).
const HOST_ECHO = [
  'import http.server, sys',
  'class H(http.server.BaseHTTPRequestHandler):',
  '    def do_GET(self):',
  "        body = (self.headers.get('Host') or '').encode()",
  "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()",
  '        self.wfile.write(body)',
  '    def log_message(self, *args): pass',
  "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()",
  '',
].join('\n')
const MASK_TEMPLATE = 'bench-masked.internal:${PORT}'
const WATCH_WAIT_MS = 60_000 // bounds a wait for an event that arrives in milliseconds

async function serveHostEcho(b, sbx, port) {
  const script = `/tmp/bh-host-echo-${port}.py`
  await sbx.files.write(script, HOST_ECHO)
  await b.sh(sbx, `nohup python3 ${script} ${port} >/dev/null 2>&1 &`)
  const ready = `for i in $(seq 100); do curl -s -o /dev/null localhost:${port} && echo up && break; sleep 0.1; done`
  expect((await b.sh(sbx, ready)).trim() === 'up', `the sandbox's server on port ${port} did not start`)
}

/** A GET of a sandbox port through the endpoint: by headers at E2B_SANDBOX_URL when set, else at getHost's name. */
async function portGet(sbx, port) {
  const base = process.env.E2B_SANDBOX_URL
  const response = base
    ? await fetch(base, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': String(port) } })
    : await fetch(`https://${sbx.getHost(port)}`)
  const text = await response.text()
  let body = text
  try {
    if (response.status !== 200) body = JSON.parse(text)
  } catch {}
  return [response.status, body]
}

const endAt = async (sandboxId) => seconds((await restInfo(sandboxId)).body.endAt)

behaviour('auto_resume_wakes_on_traffic', async (b, obs) => {
  const port = 8137
  for (const wakes of [true, false]) {
    const label = wakes ? 'auto_resume' : 'no_auto_resume'
    const sbx = await b.fresh({ lifecycle: { onTimeout: 'pause', autoResume: wakes } })
    await serveHostEcho(b, sbx, port)
    for (const request of ['envd', 'port']) {
      const before = await endAt(sbx.sandboxId)
      same(obs, `${label}_${request}_pause`, await sbx.pause(), true)
      same(obs, `${label}_${request}_paused`, (await restInfo(sbx.sandboxId)).body?.state, 'paused')
      let answer
      if (request === 'envd') {
        try {
          answer = (await sbx.commands.run('echo awake')).stdout
        } catch (err) {
          answer = `${err?.name}: ${err?.message}`
        }
      } else {
        answer = await portGet(sbx, port)
      }
      obs[`${label}_${request}_answer`] = answer
      const state = (await restInfo(sbx.sandboxId)).body?.state
      if (wakes) {
        if (request === 'port') expect(answer[0] === 200 && Boolean(answer[1]), `a port request to the paused sandbox got ${show(answer)}`)
        else same(obs, `${label}_envd_result`, answer, 'awake\n')
        same(obs, `${label}_${request}_rest_state`, state, 'running')
        same(obs, `${label}_${request}_sdk_state`, (await sbx.getInfo()).state, 'running')
        const after = await endAt(sbx.sandboxId)
        obs[`${label}_${request}_end_at_moved_s`] = Math.round((after - before) * 10) / 10
        expect(after > before, `the wake on ${request} traffic did not restart the timeout (endAt stayed)`)
      } else {
        // The SDKs word it differently (this one names only the status): the paused state or the 409.
        if (request === 'envd') expect(/paused|\b409\b/.test(String(answer).toLowerCase()), `an envd request to a paused sandbox got ${show(answer)}`)
        else {
          same(obs, `${label}_port_status`, answer[0], 409)
          same(obs, `${label}_port_message`, answer[1]?.message, 'The sandbox is paused')
        }
        same(obs, `${label}_${request}_stays_paused`, state, 'paused')
        await b.Sandbox.connect(sbx.sandboxId) // resumed by hand for the next request
      }
    }
  }
})

behaviour('mask_request_host', async (b, obs) => {
  const port = 8138
  const masked = await b.fresh({ network: { maskRequestHost: MASK_TEMPLATE } })
  same(obs, 'rest_mask_request_host', (await restInfo(masked.sandboxId)).body?.network?.maskRequestHost, MASK_TEMPLATE)
  const plain = await b.shared()
  const seen = {}
  for (const [name, sbx] of [['masked', masked], ['plain', plain]]) {
    await serveHostEcho(b, sbx, port)
    const [status, body] = await portGet(sbx, port)
    same(obs, `${name}_status`, status, 200)
    seen[name] = body
  }
  same(obs, 'masked_host_seen', seen.masked, MASK_TEMPLATE.replace('${PORT}', String(port)))
  obs.plain_host_seen = seen.plain
  expect(Boolean(seen.plain) && !String(seen.plain).includes('bench-masked'), 'a sandbox without the mask saw a masked Host')
})

// envd's events for each operation (type, name relative to the watched directory); the watch is recursive and
// `sub` exists before it starts. The same table as the Python suite's WATCH_OPERATIONS.
const WATCH_OPERATIONS = [
  ['upload a new file', [['create', 'up.txt'], ['chmod', 'up.txt'], ['write', 'up.txt']]],
  ['append in a shell', [['write', 'up.txt']]],
  ['rename', [['rename', 'up.txt'], ['create', 'moved.txt']]],
  ['chmod in a shell', [['chmod', 'moved.txt']]],
  ['make_dir', [['create', 'made'], ['chmod', 'made']]],
  ['remove a file', [['remove', 'moved.txt']]],
  ['upload into a subdirectory', [['create', 'sub/in.txt'], ['chmod', 'sub/in.txt'], ['write', 'sub/in.txt']]],
]
// Other sequences envd gives for an operation, as they come by chance (the Python suite's WATCH_ALSO). make_dir:
// envd mkdirs then chowns (permissions.EnsureDirs); its recursive watcher adds the new directory as it learns of
// it, and when that add wins the race with the chown, the directory's own watch reports the chown too.
const WATCH_ALSO = { make_dir: [[['create', 'made'], ['chmod', 'made'], ['chmod', 'made']]] }

/** Each operation whose events are none of the sequences envd gives for it: what came, what envd gives. */
function watchMismatches(found) {
  const wrong = {}
  for (const [label, wanted] of WATCH_OPERATIONS) {
    const accepted = [wanted, ...(WATCH_ALSO[label] ?? [])]
    if (!accepted.some((seq) => JSON.stringify(seq) === JSON.stringify(found[label]))) {
      wrong[label] = { got: found[label], envd_gives: accepted.length > 1 ? accepted : wanted }
    }
  }
  return wrong
}

behaviour('watch_events_match_envd', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('watch-envd')
  await b.sh(sbx, `rm -rf ${base}; mkdir -p ${base}/sub`)
  const events = []
  const handle = await sbx.files.watchDir(base, (event) => events.push(event), { recursive: true })
  try {
    const seenNow = () => events.map((e) => [String(e.type), e.name])
    const until = async (done) => {
      const deadline = Date.now() + WATCH_WAIT_MS
      while (!done(seenNow()) && Date.now() < deadline) await sleep(50)
      return seenNow()
    }
    const actions = [
      () => sbx.files.write(`${base}/up.txt`, 'hello'),
      () => sbx.commands.run(`printf more >> ${base}/up.txt`),
      () => sbx.files.rename(`${base}/up.txt`, `${base}/moved.txt`),
      () => sbx.commands.run(`chmod 600 ${base}/moved.txt`),
      () => sbx.files.makeDir(`${base}/made`),
      () => sbx.files.remove(`${base}/moved.txt`),
      () => sbx.files.write(`${base}/sub/in.txt`, 'nested'),
    ]
    const found = {}
    for (const [n, [label]] of WATCH_OPERATIONS.entries()) {
      await actions[n]()
      await b.sh(sbx, `mkdir ${base}/mark-${n}`)
      const isMarker = (e) => e[0] === 'create' && e[1] === `mark-${n}`
      const seen = await until((list) => list.some(isMarker))
      const cut = seen.findIndex(isMarker)
      expect(cut >= 0, `${label}: no event arrived in ${WATCH_WAIT_MS / 1000} s`)
      found[label] = seen.slice(0, cut).filter((e) => !e[1].startsWith('mark-'))
      events.splice(0, cut + 1)
    }
    obs.events = Object.fromEntries(Object.entries(found).map(([label, list]) => [label, list.map((e) => e.join(' '))]))
    obs.events_per_operation = found
    const wrong = watchMismatches(found)
    if (Object.keys(wrong).length) throw new Fail(`events_per_operation: ${excerpt(show(wrong))}`)
    await sbx.files.remove(base)
    const seen = await until((list) => list.some((e) => e[0] === 'remove' && e[1] === '.'))
    obs.events_of_removal = seen.map((e) => e.join(' '))
    const last = seen.at(-1)
    expect(last?.[0] === 'remove' && last?.[1] === '.', "removing the watched directory did not end with remove '.'")
    expect(seen.every((e) => e[0] === 'remove'), `removing the watched directory gave ${show(seen)}`)
  } finally {
    await handle.stop()
  }
})

// --- fidelity: field table and second-path checks ----------------------------------------------
// What an SDK call reports, compared with what the sandbox itself shows; options that end with their call;
// the bytes envd defines (sandboxes/e2b/python/behaviours.py has the same checks).

// Inside the sandbox: its CPU count (the cgroup's cpu.max quota over its period where one is set, else the CPUs
// it may run on) and its memory in MiB (the cgroup's memory.max where set, else MemTotal).
const SANDBOX_RESOURCES = `python3 - <<'EOF'
import math, os
def read(path):
    try:
        return open(path).read().split()
    except OSError:
        return []
v1 = "/sys/fs/cgroup/cpu/cpu.cfs_"
quota = read("/sys/fs/cgroup/cpu.max") or read(v1 + "quota_us") + read(v1 + "period_us")
limited = len(quota) == 2 and quota[0].isdigit() and int(quota[0]) > 0
cpus = math.ceil(int(quota[0]) / int(quota[1])) if limited else len(os.sched_getaffinity(0))
limit = (read("/sys/fs/cgroup/memory.max") or read("/sys/fs/cgroup/memory/memory.limit_in_bytes") or ["max"])[0]
meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
total = int(meminfo["MemTotal"].split()[0]) * 1024
capped = limit.isdigit() and int(limit) < total
print(cpus, (int(limit) if capped else total) >> 20, "cgroup" if capped else "meminfo")
EOF`

/** A cgroup limit is exact; a VM's MemTotal is what is left after the kernel's own share (at most 15%). */
function memoryAgrees(reportedMb, seenMb, source) {
  return source === 'cgroup' ? seenMb === reportedMb : 0.85 * reportedMb <= seenMb && seenMb <= reportedMb
}

behaviour('reported_resources', async (b, obs) => {
  const mark = `${b.ctx.runId}-js-resources`
  const sbx = await b.fresh({ metadata: { 'bh-resources': mark } })
  const [cpus, memoryMb, source] = (await b.sh(sbx, SANDBOX_RESOURCES)).split(/\s+/).filter(Boolean)
  obs.inside = { cpus: Number(cpus), memory_mb: Number(memoryMb), source }
  const info = await sbx.getInfo()
  same(obs, 'get_info_cpu_count_is_the_sandboxs', info.cpuCount, Number(cpus))
  expect(memoryAgrees(info.memoryMB, Number(memoryMb), source), `getInfo memoryMB ${info.memoryMB}, the sandbox has ${memoryMb} MiB (${source})`)
  const listed = await b.Sandbox.list({ query: { metadata: { 'bh-resources': mark } } }).nextItems()
  same(obs, 'listed_once', listed.map((s) => s.sandboxId), [sbx.sandboxId])
  const fields = ['templateId', 'cpuCount', 'memoryMB', 'metadata', 'startedAt', 'endAt']
  const pick = (item) => Object.fromEntries(fields.map((f) => [f, show(item[f])]))
  same(obs, 'list_entry_equals_get_info', pick(listed[0]), pick(info))
  const samples = await sbx.getMetrics()
  expect(samples.length >= 1, 'getMetrics() returned no sample')
  same(obs, 'metrics_cpu_count_is_the_sandboxs', samples.at(-1).cpuCount, Number(cpus))
  const memTotalMb = Math.floor(samples.at(-1).memTotal / (1 << 20))
  expect(memoryAgrees(memTotalMb, Number(memoryMb), source), `metrics memTotal ${samples.at(-1).memTotal} bytes, the sandbox has ${memoryMb} MiB (${source})`)
})

behaviour('file_info_current', async (b, obs) => {
  const sbx = await b.shared()
  const base = b.dir('current')
  const path = `${base}/grows`
  await b.sh(sbx, `mkdir -p ${base} && printf 1 > ${path} && touch -d @1000000000 ${path}`)
  await sbx.files.getInfo(path) // an answer an endpoint could keep
  await b.sh(sbx, `printf 23456789 >> ${path} && chmod 600 ${path} && touch -d @1500000000 ${path}`)
  const stat = (await b.sh(sbx, `stat -c '%s %a %A %Y' ${path}`)).split(/\s+/).filter(Boolean)
  const wanted = [Number(stat[0]), stat[1], stat[2], Number(stat[3])]
  const seen = (e) => [e.size, e.mode.toString(8), e.permissions, Math.floor(e.modifiedTime.getTime() / 1000)]
  same(obs, 'get_info_is_stat_now', seen(await sbx.files.getInfo(path)), wanted)
  const listed = (await sbx.files.list(base)).filter((e) => e.name === 'grows')
  expect(listed.length === 1, `files.list(${base}) does not list the file once`)
  same(obs, 'list_is_stat_now', seen(listed[0]), wanted)
})

// Inside the sandbox, as its user: a process's command line (one argument a line), then its cwd and its BH_PROC,
// once the command's shell has run its profile (its body, `sleep`, is its child: a login profile's `cd` is done).
const PROC_VIEW = (pid) => `i=0; while [ ! -s /proc/${pid}/task/${pid}/children ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; tr '\\0' '\\n' < /proc/${pid}/cmdline; echo --; readlink /proc/${pid}/cwd; tr '\\0' '\\n' < /proc/${pid}/environ | grep ^BH_PROC=`

behaviour('process_info', async (b, obs) => {
  const sbx = await b.shared()
  const handle = await sbx.commands.run('sleep 47; true', { background: true, envs: { BH_PROC: 'js' }, cwd: '/tmp' })
  try {
    const listed = (await sbx.commands.list()).filter((p) => p.pid === handle.pid)
    expect(listed.length === 1, `pid ${handle.pid} is not listed once by commands.list()`)
    const [command, rest] = (await b.sh(sbx, PROC_VIEW(handle.pid))).split('--\n')
    const [cwd, env] = rest.split(/\s+/).filter(Boolean)
    same(obs, 'command_line', [listed[0].cmd, ...listed[0].args], command.split('\n').filter(Boolean))
    same(obs, 'cwd', [listed[0].cwd, cwd], ['/tmp', '/tmp'])
    same(obs, 'env', [listed[0].envs?.BH_PROC, env], ['js', 'BH_PROC=js'])
  } finally {
    await sbx.commands.kill(handle.pid)
  }
})

behaviour('options_end_with_call', async (b, obs) => {
  const sbx = await b.fresh() // its own: an option that outlives its call would change later cases' commands
  const given = await sbx.commands.run('pwd; whoami; printf %s "$BH_ONCE"', { envs: { BH_ONCE: '1' }, cwd: '/tmp', user: 'root' })
  same(obs, 'given', given.stdout, '/tmp\nroot\n1')
  same(obs, 'next_call', await b.sh(sbx, 'pwd; whoami; printf %s "${BH_ONCE-unset}"'), `${HOME}\nuser\nunset`)
  await rejects(obs, 'short_timeout', () => sbx.commands.run('sleep 21.6', { timeoutMs: 1000 }), 'TimeoutError', 'CommandExitError')
  same(obs, 'next_call_outlives_one_second', await b.sh(sbx, 'sleep 2.5; echo done'), 'done\n')
})

behaviour('pty_bytes', async (b, obs) => {
  const sbx = await b.shared()
  const chunks = []
  const terminal = await sbx.pty.create({ rows: 24, cols: 80, onData: (d) => chunks.push(Buffer.from(d)) })
  const typed = "printf 'bh-one\\nbh-two\\n'; exit 3"
  await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode(`${typed}\n`))
  let exitCode = 0
  try {
    await terminal.wait()
  } catch (err) {
    exitCode = err?.exitCode
  }
  const data = Buffer.concat(chunks)
  obs.output = excerpt(data.toString('utf8'))
  expect(data.includes(Buffer.from(typed)), 'the typed line is not echoed by the pty')
  expect(data.includes(Buffer.from('bh-one\r\nbh-two\r\n')), 'the command\'s lines do not end CR LF as a terminal sends them')
  same(obs, 'line_feeds_without_cr', data.toString('latin1').split('\r\n').join('').split('\n').length - 1, 0)
  same(obs, 'exit_code', exitCode, 3)
})

process.exitCode = await main(SUITE)
