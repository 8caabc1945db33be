// envd probes through the unmodified `e2b` npm SDK, where it takes another path than the Python SDK
// (sandboxes/e2b/python/probes.py): `files.watchDir` streams the WatchDir RPC instead of polling a
// CreateWatcher, stdin and pty input go through the SDK's own calls, gzip is an option of write/read.
//
// Each probe records what the endpoint really does (`details.observed`, next to `details.e2b`: what E2B
// does) and ends as `pass` (as E2B), `deviation` (observed differs) or `refused` (the SDK reported a
// refusal: status, code and message recorded for the declarations to match). Any other exception is
// `fail`. The protocol and driver are shared with the quickstart runner (driver.mjs); the steps are the
// `[probes.ts]` table of sandboxes/e2b/manifest.toml.

import { randomBytes } from 'node:crypto'

import { Deviation, Refused, excerpt, main, show, step, until } from './driver.mjs'

const SUITE = 'probes'
const HOME = '/home/user'
// Snake_case error codes an endpoint names in its messages; Connect codes appear as `[code]`.
const ERROR_CODES = /\b(unsupported_option|not_implemented|envd_token_invalid|invalid_argument)\b/
const CONNECT_CODE = /\[([a-z]+(?:_[a-z]+)*)\]/
const HTTP_STATUS = /\bHTTP (\d{3})\b/

// --- helpers ------------------------------------------------------------------------------------

/** One shared sandbox for the probes. */
async function sandbox(ctx) {
  if (ctx.sandbox === null) {
    ctx.sandbox = await ctx.newSandbox({ timeoutMs: ctx.sharedTimeoutMs })
    ctx.sandboxId = ctx.sandbox.sandboxId
    ctx.sharedCreated(ctx.sandboxId)
    await ctx.watch(ctx.sandboxId, () => ctx.sandbox, () => {
      ctx.sandbox = null
      ctx.sandboxId = null
    })
  }
  return ctx.sandbox
}

function errorCode(message) {
  return (message.match(ERROR_CODES) ?? message.match(CONNECT_CODE))?.[1]
}

/** A `Refused` when the SDK reports that the endpoint refused; any other error is returned unchanged. */
function refused(ctx, err, what) {
  const { SandboxError, AuthenticationError, TimeoutError, CommandExitError, InvalidArgumentError } = ctx.sdk
  const sdkRefusal =
    (err instanceof SandboxError || err instanceof AuthenticationError) &&
    !(err instanceof TimeoutError) &&
    !(err instanceof CommandExitError)
  if (!sdkRefusal && typeof err?.statusCode !== 'number') return err
  const message = String(err?.message ?? err)
  // A Connect error keeps the HTTP status only in its message ("[unimplemented] HTTP 404").
  const inMessage = message.match(HTTP_STATUS)?.[1]
  let status = err?.statusCode ?? (inMessage ? Number(inMessage) : undefined)
  if (err instanceof InvalidArgumentError) status ??= 400
  return new Refused(`${what}: ${err?.name}: ${message}`, {
    status_code: status,
    error_code: errorCode(message),
    message: excerpt(message),
    exception: err?.name,
  })
}

/** Run `call`; an SDK refusal becomes `Refused`. */
async function attempt(ctx, what, call) {
  try {
    return await call()
  } catch (err) {
    throw refused(ctx, err, what)
  }
}

/** A non-2xx answer to a plain fetch, recorded as a refusal. */
async function httpRefusal(response, what) {
  const text = await response.text()
  let body
  try {
    body = JSON.parse(text)
  } catch {
    body = { raw: text.slice(0, 300) }
  }
  const message = String(body?.message ?? text.slice(0, 300))
  const code = typeof body?.code === 'string' ? body.code : errorCode(message)
  return new Refused(`${what}: HTTP ${response.status}: ${message}`, {
    status_code: response.status,
    error_code: code,
    message: excerpt(message),
    body,
  })
}

function observe(obs, observed, e2b) {
  obs.observed = observed
  obs.e2b = e2b
  if (show(observed) !== show(e2b)) throw new Deviation(`observed ${show(observed)}, E2B: ${show(e2b)}`)
}

/** A command's result whatever its exit code: CommandExitError carries the same fields. */
async function settle(ctx, running) {
  try {
    return await running
  } catch (err) {
    if (err instanceof ctx.sdk.CommandExitError) return err
    throw err
  }
}

// --- probes -------------------------------------------------------------------------------------

step('pj01_watch_dir_stream', async (ctx, obs) => {
  const sbx = await sandbox(ctx)
  const dir = `${HOME}/watched-js`
  await sbx.files.makeDir(dir)
  const events = []
  const handle = await attempt(ctx, 'files.watchDir', () =>
    sbx.files.watchDir(dir, (event) => events.push({ name: event.name, type: event.type })),
  )
  try {
    await sbx.files.write(`${dir}/new.txt`, 'x')
    await until(() => events.some((e) => e.name === 'new.txt' && e.type === 'create'), 5_000)
  } finally {
    await handle.stop()
  }
  obs.events = events.slice(0, 20)
  observe(obs, events.some((e) => e.name === 'new.txt' && e.type === 'create'), true)
})

step('pj02_stdin', async (ctx, obs) => {
  const sbx = await sandbox(ctx)
  const result = await attempt(ctx, 'commands.run({stdin: true})', async () => {
    const handle = await sbx.commands.run('read line; echo got:$line', { background: true, stdin: true })
    await sbx.commands.sendStdin(handle.pid, 'ping\n')
    return handle.wait()
  })
  const closed = await sbx.commands.run('cat; echo eof', { stdin: false })
  observe(obs, [result.stdout, closed.stdout], ['got:ping\n', 'eof\n'])
})

step('pj03_pty', async (ctx, obs) => {
  const sbx = await sandbox(ctx)
  const decoder = new TextDecoder()
  let text = ''
  const terminal = await attempt(ctx, 'pty.create', () =>
    sbx.pty.create({ cols: 80, rows: 24, onData: (data) => (text += decoder.decode(data, { stream: true })) }),
  )
  await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('echo pty-$((40+2)); exit 3\n'))
  const ended = await settle(ctx, terminal.wait())
  obs.output = excerpt(text)
  observe(obs, { echoed: text.includes('pty-42'), exit_code: ended.exitCode }, { echoed: true, exit_code: 3 })
})

step('pj04_gzip', async (ctx, obs) => {
  const sbx = await sandbox(ctx)
  const data = Buffer.concat([randomBytes(4096), Buffer.from('e2b'.repeat(2000))])
  const path = '/tmp/gzip-js.bin'
  const sent = data.buffer.slice(data.byteOffset, data.byteOffset + data.length)
  await attempt(ctx, 'files.write({gzip: true})', () => sbx.files.write(path, sent, { gzip: true }))
  const back = await attempt(ctx, 'files.read({gzip: true})', () => sbx.files.read(path, { format: 'bytes', gzip: true }))
  obs.read_length = back?.length
  observe(obs, { round_trip: Buffer.from(back).equals(data) }, { round_trip: true })
})

step('pj05_signed_urls', async (ctx, obs) => {
  const sbx = await sandbox(ctx)
  const path = `${HOME}/signed-js.txt`
  const uploadUrl = await attempt(ctx, 'uploadUrl', () => sbx.uploadUrl(path))
  const form = new FormData()
  form.append('file', new Blob(['signed-js']), 'signed-js.txt')
  const upload = await fetch(uploadUrl, { method: 'POST', body: form })
  obs.upload_status = upload.status
  if (upload.status !== 200) throw await httpRefusal(upload, 'uploadUrl')
  const downloadUrl = await attempt(ctx, 'downloadUrl', () => sbx.downloadUrl(path, { useSignatureExpiration: 120 }))
  const download = await fetch(downloadUrl)
  obs.download_status = download.status
  if (download.status !== 200) throw await httpRefusal(download, 'downloadUrl')
  observe(obs, await download.text(), 'signed-js')
})

step('pj06_metrics', async (ctx, obs) => {
  const sbx = await sandbox(ctx)
  const samples = await attempt(ctx, 'getMetrics', () => sbx.getMetrics())
  obs.samples = samples.slice(0, 2)
  observe(obs, samples.length > 0 && samples.at(-1).memTotal > 0, true)
})

step('pj07_default_cwd', async (ctx, obs) => {
  const sbx = await sandbox(ctx)
  const plain = await sbx.commands.run('pwd')
  const inTmp = await sbx.commands.run('pwd', { cwd: '/tmp' })
  observe(
    obs,
    { default: plain.stdout.trim(), 'cwd=/tmp': inTmp.stdout.trim() },
    { default: HOME, 'cwd=/tmp': '/tmp' },
  )
})

step('pj08_setsid_exit_code', async (ctx, obs) => {
  const sbx = await sandbox(ctx)
  const ended = await settle(ctx, sbx.commands.run("exec setsid bash -c 'sleep 1; echo late; exit 5'"))
  observe(obs, { exit_code: ended.exitCode, stdout: ended.stdout }, { exit_code: 5, stdout: 'late\n' })
})

process.exitCode = await main(SUITE)
