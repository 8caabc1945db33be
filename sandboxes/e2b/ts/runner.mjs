// TypeScript quickstart runner: drives the unmodified `e2b` npm SDK through the steps of the manifest.
//
// One script serves every pinned Node project (sandboxes/e2b/ts, sandboxes/e2b/ts-2.50, ...): the SDK
// is loaded from the project named by NODE_PATH. The protocol, step registry, dependency plan and
// clean-up live in driver.mjs (shared with probes.mjs). The task carries the step ids and their
// prerequisites from the `[quickstart.ts]` table of sandboxes/e2b/manifest.toml, so the manifest stays
// the single source of the step list; this script holds one `step(...)` per id.

import {
  NOT_RECEIVED,
  RUN_TAG,
  errorDetails,
  excerpt,
  expect,
  expectRejects,
  main,
  need,
  sameList,
  show,
  step,
  until,
  waitUntilSeen,
} from './driver.mjs'

const SUITE = 'quickstart'
const HOME = '/home/user'
const TEXT_FILE = `${HOME}/e2b-bench-ts13.txt`
const TEXT = 'hi there\nünïcödé ✓\n'
const MISSING_FILE = `${HOME}/e2b-bench-missing.txt`

// --- steps -------------------------------------------------------------------------------------

step('ts01_create', async (ctx, obs) => {
  const opts = { timeoutMs: ctx.sharedTimeoutMs, metadata: ctx.metadata }
  const sandbox = ctx.template
    ? await ctx.sdk.Sandbox.create(ctx.template, opts)
    : await ctx.sdk.Sandbox.create(opts)
  ctx.sandbox = sandbox
  ctx.sandboxId = sandbox.sandboxId
  ctx.created.push(sandbox.sandboxId)
  ctx.sharedCreated(sandbox.sandboxId)
  await ctx.watch(sandbox.sandboxId, () => ctx.sandbox) // later steps need its state: never replaced
  obs.sandbox_id = sandbox.sandboxId
  expect(typeof sandbox.sandboxId === 'string' && sandbox.sandboxId !== '', 'sandboxId is empty')
})

step('ts02_run_echo', async (ctx, obs) => {
  const result = await ctx.sandbox.commands.run('echo hello')
  Object.assign(obs, { exitCode: result.exitCode, stdout: excerpt(result.stdout), stderr: excerpt(result.stderr) })
  expect(result.exitCode === 0, `exitCode is ${show(result.exitCode)}, expected 0`)
  expect(result.stdout === 'hello\n', `stdout is ${show(result.stdout)}, expected "hello\\n"`)
  expect(result.stderr === '', `stderr is ${show(result.stderr)}, expected ""`)
})

step('ts03_run_exit_code_throws', async (ctx, obs) => {
  const err = await expectRejects(ctx.sandbox.commands.run('exit 3'), ctx.sdk.CommandExitError, "run('exit 3')", obs, 'raised')
  expect(err.exitCode === 3, `exitCode is ${show(err.exitCode)}, expected 3`)
  expect(err.error === 'exit status 3', `error is ${show(err.error)}, expected "exit status 3"`)
  expect(err.stdout === '' && err.stderr === '', `stdout/stderr are ${show([err.stdout, err.stderr])}, expected ""`)
})

step('ts04_run_stderr', async (ctx, obs) => {
  const result = await ctx.sandbox.commands.run('echo err >&2')
  Object.assign(obs, { exitCode: result.exitCode, stdout: excerpt(result.stdout), stderr: excerpt(result.stderr) })
  expect(result.exitCode === 0, `exitCode is ${show(result.exitCode)}, expected 0`)
  expect(result.stderr === 'err\n', `stderr is ${show(result.stderr)}, expected "err\\n"`)
  expect(result.stdout === '', `stdout is ${show(result.stdout)}, expected ""`)
})

// In lockstep: the command writes its next line only once the step has received the one before (onStdout runs a
// second command that makes the file the first waits for), so each line is read and sent on its own however
// loaded the endpoint's host is; an endpoint that holds output back until the end makes the command say so
const STREAM_GATE = '/tmp/e2b-bench-ts05-seen'
const streamed = (ctx) =>
  `rm -f ${STREAM_GATE}.*; for i in 1 2 3; do echo $i; ` +
  `[ $i = 3 ] || ${waitUntilSeen(ctx, `${STREAM_GATE}.$i`, 'line $i')}; done`

step('ts05_run_streaming_onStdout', async (ctx, obs) => {
  const chunks = []
  const signals = []
  const result = await ctx.sandbox.commands.run(streamed(ctx), {
    onStdout: (chunk) => {
      chunks.push(chunk)
      const received = Math.min(chunks.join('').split('\n').length - 1, 2) // the lines received so far, but the last
      while (signals.length < received) {
        const signal = ctx.sandbox.commands.run(`touch ${STREAM_GATE}.${signals.length + 1}`)
        signals.push(signal.then(() => null, (error) => error)) // the step's own signal, said as such below
      }
    },
  })
  Object.assign(obs, { chunks, exitCode: result.exitCode, stdout: excerpt(result.stdout), stderr: excerpt(result.stderr) })
  const refused = (await Promise.all(signals)).filter((error) => error !== null)
  if (refused.length > 0) {
    obs.signalRefused = refused.map(errorDetails)
    const [first] = obs.signalRefused
    expect(false, `the step's signal (commands.run('touch ...')) raised ${first.exception}: ${first.message}`)
  }
  const held = result.stderr.split('\n').filter((line) => line.includes(NOT_RECEIVED))
  expect(held.length === 0, `output was not sent as it came: ${held.join('; ')} (onStdout got ${show(chunks)})`)
  expect(sameList(chunks, ['1\n', '2\n', '3\n']), `onStdout got ${show(chunks)}, expected ["1\\n","2\\n","3\\n"]`)
  expect(result.stdout === '1\n2\n3\n', `stdout is ${show(result.stdout)}, expected "1\\n2\\n3\\n"`)
  expect(result.exitCode === 0, `exitCode is ${show(result.exitCode)}, expected 0`)
})

step('ts06_run_envs_cwd', async (ctx, obs) => {
  const dir = `${HOME}/e2b-bench-ts06`
  const made = await ctx.sandbox.files.makeDir(dir)
  obs.makeDir = made
  expect(made === true, `makeDir(${show(dir)}) returned ${show(made)}, expected true`)
  const result = await ctx.sandbox.commands.run('echo $FOO; pwd', { envs: { FOO: 'bar-ts06' }, cwd: dir })
  Object.assign(obs, { exitCode: result.exitCode, stdout: excerpt(result.stdout) })
  const wanted = `bar-ts06\n${dir}\n`
  expect(result.stdout === wanted, `stdout is ${show(result.stdout)}, expected ${show(wanted)}`)
})

step('ts07_run_as_root', async (ctx, obs) => {
  const result = await ctx.sandbox.commands.run('whoami', { user: 'root' })
  Object.assign(obs, { exitCode: result.exitCode, stdout: excerpt(result.stdout) })
  expect(result.exitCode === 0, `exitCode is ${show(result.exitCode)}, expected 0`)
  expect(result.stdout === 'root\n', `whoami printed ${show(result.stdout)}, expected "root\\n"`)
})

step('ts08_background_wait', async (ctx, obs) => {
  const handle = await ctx.sandbox.commands.run('sleep 0.3; echo done', { background: true })
  obs.pid = handle.pid
  expect(Number.isInteger(handle.pid) && handle.pid > 0, `pid is ${show(handle.pid)}, expected a positive integer`)
  const result = await handle.wait()
  Object.assign(obs, { exitCode: result.exitCode, stdout: excerpt(result.stdout) })
  expect(result.exitCode === 0, `exitCode is ${show(result.exitCode)}, expected 0`)
  expect(result.stdout === 'done\n', `stdout is ${show(result.stdout)}, expected "done\\n"`)
})

step('ts09_commands_list', async (ctx, obs) => {
  const handle = await ctx.sandbox.commands.run('sleep 30', { background: true })
  ctx.sleeper = handle
  obs.pid = handle.pid
  const processes = await ctx.sandbox.commands.list()
  obs.listed = processes.slice(0, 50).map(({ pid, cmd, args, cwd }) => ({ pid, cmd, args, cwd }))
  const listed = processes.find((process) => process.pid === handle.pid)
  expect(listed !== undefined, `pid ${handle.pid} not in commands.list() pids ${show(processes.map((p) => p.pid))}`)
  expect(listed.cmd === '/bin/bash', `listed cmd is ${show(listed.cmd)}, expected "/bin/bash"`)
  const args = ['-l', '-c', 'sleep 30']
  expect(sameList(listed.args, args), `listed args are ${show(listed.args)}, expected ${show(args)}`)
})

step('ts10_commands_kill', async (ctx, obs) => {
  const { commands } = ctx.sandbox
  const handle = ctx.sleeper
  ctx.sleeper = null // this step ends it: once it has run, the kit ends what is left
  const killed = await commands.kill(handle.pid)
  obs.kill = killed
  expect(killed === true, `commands.kill(${handle.pid}) returned ${show(killed)}, expected true`)
  const err = await expectRejects(handle.wait(), ctx.sdk.CommandExitError, 'wait() after kill', obs, 'wait')
  expect(err.exitCode === -1, `wait() raised exitCode ${show(err.exitCode)}, expected -1`)
  expect(err.error === 'signal: killed', `wait() raised error ${show(err.error)}, expected "signal: killed"`)
  const again = await commands.kill(handle.pid)
  obs.kill_again = again
  expect(again === false, `second commands.kill(${handle.pid}) returned ${show(again)}, expected false`)
})

step('ts11_send_stdin', async (ctx, obs) => {
  need(ctx.sandbox.commands, 'sendStdin', 'commands.sendStdin')
  const handle = await ctx.sandbox.commands.run('read line; echo "got:$line"', { background: true, stdin: true })
  obs.pid = handle.pid
  await ctx.sandbox.commands.sendStdin(handle.pid, 'ping\n')
  const result = await handle.wait()
  Object.assign(obs, { exitCode: result.exitCode, stdout: excerpt(result.stdout) })
  expect(result.stdout === 'got:ping\n', `stdout is ${show(result.stdout)}, expected "got:ping\\n"`)
  expect(result.exitCode === 0, `exitCode is ${show(result.exitCode)}, expected 0`)
})

step('ts12_commands_connect', async (ctx, obs) => {
  need(ctx.sandbox.commands, 'connect', 'commands.connect')
  const before = []
  const handle = await ctx.sandbox.commands.run('echo early; sleep 2; echo late', {
    background: true,
    onStdout: (chunk) => before.push(chunk),
  })
  obs.pid = handle.pid
  const early = await until(() => before.length > 0, 10_000)
  obs.before_disconnect = [...before]
  expect(early, 'no output within 10 s before disconnecting')
  await handle.disconnect()
  const after = []
  const reconnected = await ctx.sandbox.commands.connect(handle.pid, { onStdout: (chunk) => after.push(chunk) })
  const result = await reconnected.wait()
  Object.assign(obs, { after_connect: after, exitCode: result.exitCode, stdout: excerpt(result.stdout) })
  expect(sameList(before, ['early\n']), `output before disconnect is ${show(before)}, expected ["early\\n"]`)
  expect(sameList(after, ['late\n']), `onStdout after connect got ${show(after)}, expected ["late\\n"]`)
  expect(result.stdout === 'late\n', `stdout after connect is ${show(result.stdout)}, expected "late\\n"`)
  expect(result.exitCode === 0, `exitCode is ${show(result.exitCode)}, expected 0`)
})

step('ts13_files_write_read_text', async (ctx, obs) => {
  const info = await ctx.sandbox.files.write(TEXT_FILE, TEXT)
  obs.written = info
  expect(info?.path === TEXT_FILE, `write returned path ${show(info?.path)}, expected ${show(TEXT_FILE)}`)
  const text = await ctx.sandbox.files.read(TEXT_FILE)
  obs.read = excerpt(text)
  expect(text === TEXT, `read returned ${show(text)}, expected ${show(TEXT)}`)
})

step('ts14_files_bytes_roundtrip', async (ctx, obs) => {
  const path = `${HOME}/e2b-bench-ts14.bin`
  const sent = new Uint8Array(512).map((_, i) => (i < 256 ? i : 511 - i)) // 0x00..0xFF..0x00
  await ctx.sandbox.files.write(path, sent.buffer)
  const got = await ctx.sandbox.files.read(path, { format: 'bytes' })
  obs.read_type = got?.constructor?.name
  obs.read_length = got?.length
  expect(got instanceof Uint8Array, `read(format bytes) returned ${obs.read_type}, expected Uint8Array`)
  const first = got.findIndex((byte, i) => byte !== sent[i])
  obs.first_difference = first
  expect(got.length === sent.length, `read ${got.length} bytes, expected ${sent.length}`)
  expect(first === -1, `byte ${first} is 0x${got[first]?.toString(16)}, expected 0x${sent[first]?.toString(16)}`)
})

step('ts15_files_write_multiple', async (ctx, obs) => {
  const entries = [
    { path: `${HOME}/e2b-bench-ts15-a.txt`, data: 'first\n' },
    { path: `${HOME}/e2b-bench-ts15-b.txt`, data: 'second\n' },
  ]
  const infos = await ctx.sandbox.files.write(entries)
  obs.written = infos
  expect(Array.isArray(infos), `write([2 files]) returned ${show(infos)}, expected an array of WriteInfo`)
  const paths = infos.map((info) => info.path)
  const wanted = entries.map((entry) => entry.path)
  expect(sameList(paths, wanted), `WriteInfo paths are ${show(paths)}, expected ${show(wanted)}`)
  for (const entry of entries) {
    const text = await ctx.sandbox.files.read(entry.path)
    expect(text === entry.data, `read(${show(entry.path)}) returned ${show(text)}, expected ${show(entry.data)}`)
  }
})

step('ts16_files_list_exists_getInfo', async (ctx, obs) => {
  const { files } = ctx.sandbox
  const listed = await files.list(HOME)
  obs.listed = listed.slice(0, 50).map((entry) => entry.path)
  expect(listed.some((entry) => entry.path === TEXT_FILE), `list(${show(HOME)}) does not contain ${TEXT_FILE}`)
  obs.exists = await files.exists(TEXT_FILE)
  obs.exists_missing = await files.exists(MISSING_FILE)
  expect(obs.exists === true, `exists(${show(TEXT_FILE)}) is ${show(obs.exists)}, expected true`)
  expect(obs.exists_missing === false, `exists(missing) is ${show(obs.exists_missing)}, expected false`)
  const entry = await files.getInfo(TEXT_FILE)
  const observed = { name: entry.name, type: entry.type, path: entry.path, size: entry.size }
  obs.entry = observed
  const wanted = { name: 'e2b-bench-ts13.txt', type: 'file', path: TEXT_FILE, size: Buffer.byteLength(TEXT) }
  const wrong = Object.keys(wanted).filter((key) => observed[key] !== wanted[key])
  expect(wrong.length === 0, `getInfo fields differ: ${show(observed)}, expected ${show(wanted)}`)
})

step('ts17_files_makeDir_rename_remove', async (ctx, obs) => {
  const { files } = ctx.sandbox
  const dir = `${HOME}/e2b-bench-ts17`
  const moved = `${HOME}/e2b-bench-ts17-moved`
  obs.makeDir = await files.makeDir(dir)
  expect(obs.makeDir === true, `makeDir(${show(dir)}) returned ${show(obs.makeDir)}, expected true`)
  obs.makeDir_again = await files.makeDir(dir)
  expect(obs.makeDir_again === false, `makeDir(existing) returned ${show(obs.makeDir_again)}, expected false`)
  const entry = await files.rename(dir, moved)
  obs.rename = { name: entry?.name, type: entry?.type, path: entry?.path }
  expect(entry?.path === moved, `rename returned path ${show(entry?.path)}, expected ${show(moved)}`)
  expect(entry?.name === 'e2b-bench-ts17-moved', `rename returned name ${show(entry?.name)}`)
  expect(entry?.type === 'dir', `rename returned type ${show(entry?.type)}, expected "dir"`)
  obs.exists_old = await files.exists(dir)
  expect(obs.exists_old === false, `exists(old path) after rename is ${show(obs.exists_old)}, expected false`)
  await files.remove(moved)
  obs.exists_removed = await files.exists(moved)
  expect(obs.exists_removed === false, `exists(removed) is ${show(obs.exists_removed)}, expected false`)
})

step('ts18_files_read_missing', async (ctx, obs) => {
  await expectRejects(ctx.sandbox.files.read(`${HOME}/nope`), ctx.sdk.FileNotFoundError, "read('/home/user/nope')", obs, 'raised')
})

step('ts19_sandbox_list', async (ctx, obs) => {
  need(ctx.sdk.Sandbox, 'list', 'Sandbox.list')
  const paginator = ctx.sdk.Sandbox.list({ query: { state: ['running', 'paused'], metadata: ctx.metadata } })
  const items = await paginator.nextItems()
  obs.listed = items.slice(0, 50).map((item) => ({ sandboxId: item.sandboxId, state: item.state, metadata: item.metadata }))
  obs.hasNext = paginator.hasNext
  const own = items.find((item) => item.sandboxId === ctx.sandboxId)
  expect(own !== undefined, `nextItems() does not contain ${ctx.sandboxId}: ${show(items.map((i) => i.sandboxId))}`)
  expect(paginator.hasNext === false, `hasNext is ${show(paginator.hasNext)}, expected false`)
  expect(own.state === 'running', `listed state is ${show(own.state)}, expected "running"`)
  const strangers = items.filter((item) => item.metadata?.[RUN_TAG] !== ctx.runId).map((item) => item.sandboxId)
  expect(strangers.length === 0, `the metadata filter let through ${show(strangers)}`)
})

step('ts20_getInfo', async (ctx, obs) => {
  const info = await ctx.sandbox.getInfo()
  obs.info = {
    sandboxId: info.sandboxId,
    state: info.state,
    cpuCount: info.cpuCount,
    memoryMB: info.memoryMB,
    metadata: info.metadata,
    startedAt: info.startedAt,
    endAt: info.endAt,
  }
  expect(info.sandboxId === ctx.sandboxId, `sandboxId is ${show(info.sandboxId)}, expected ${show(ctx.sandboxId)}`)
  expect(info.state === 'running', `state is ${show(info.state)}, expected "running"`)
  expect(Number.isInteger(info.cpuCount) && info.cpuCount > 0, `cpuCount is ${show(info.cpuCount)}`)
  expect(Number.isInteger(info.memoryMB) && info.memoryMB > 0, `memoryMB is ${show(info.memoryMB)}`)
  const tag = info.metadata?.[RUN_TAG]
  expect(tag === ctx.runId, `metadata[${RUN_TAG}] is ${show(tag)}, expected ${show(ctx.runId)}`)
})

step('ts21_setTimeout', async (ctx, obs) => {
  const { Sandbox } = ctx.sdk
  // Longer than the sandbox was given, so endAt moves later and the steps after this one keep their sandbox.
  const ms = ctx.sharedTimeoutMs + 60_000
  const before = (await Sandbox.getInfo(ctx.sandboxId)).endAt
  await ctx.sandbox.setTimeout(ms)
  const after = (await Sandbox.getInfo(ctx.sandboxId)).endAt
  Object.assign(obs, { endAt_before: before, endAt_after: after })
  expect(before instanceof Date && after instanceof Date, `endAt is not a Date: ${show(before)} / ${show(after)}`)
  obs.moved_ms = after - before
  expect(after > before, `endAt did not move after setTimeout(${ms}): ${show(before)} -> ${show(after)}`)
})

step('ts22_pause_connect', async (ctx, obs) => {
  const { Sandbox } = ctx.sdk
  need(ctx.sandbox, 'pause', 'Sandbox.pause')
  need(Sandbox, 'connect', 'Sandbox.connect')
  ctx.lifetimeChanged(ctx.sandboxId) // a resume gives it the endpoint's default lifetime
  const paused = await ctx.sandbox.pause()
  obs.pause = paused
  expect(paused === true, `pause() returned ${show(paused)}, expected true`)
  obs.state_after_pause = (await Sandbox.getInfo(ctx.sandboxId)).state
  expect(obs.state_after_pause === 'paused', `state after pause() is ${show(obs.state_after_pause)}, expected "paused"`)
  // connect() rotates the envd access token: the old handle must not be used for envd any more.
  ctx.sandbox = await Sandbox.connect(ctx.sandboxId)
  const result = await ctx.sandbox.commands.run('echo back')
  Object.assign(obs, { exitCode: result.exitCode, stdout: excerpt(result.stdout) })
  expect(result.stdout === 'back\n', `run('echo back') stdout is ${show(result.stdout)}, expected "back\\n"`)
  obs.state_after_connect = (await Sandbox.getInfo(ctx.sandboxId)).state
  expect(obs.state_after_connect === 'running', `state after connect is ${show(obs.state_after_connect)}, expected "running"`)
})

step('ts23_kill_and_refusals', async (ctx, obs) => {
  const { Sandbox, SandboxNotFoundError, AuthenticationError, SandboxError } = ctx.sdk
  obs.kill = await ctx.sandbox.kill()
  if (obs.kill === true) ctx.killed.add(ctx.sandboxId)
  expect(obs.kill === true, `kill() returned ${show(obs.kill)}, expected true`)
  obs.kill_again = await Sandbox.kill(ctx.sandboxId)
  expect(obs.kill_again === false, `Sandbox.kill(killed id) returned ${show(obs.kill_again)}, expected false`)
  await expectRejects(Sandbox.getInfo(ctx.sandboxId), SandboxNotFoundError, 'Sandbox.getInfo(killed id)', obs, 'getInfo_killed')
  const opts = { timeoutMs: ctx.sandboxTimeoutMs, metadata: ctx.metadata }
  const wrongKey = ctx.template
    ? Sandbox.create(ctx.template, { ...opts, apiKey: 'e2b_wrong' })
    : Sandbox.create({ ...opts, apiKey: 'e2b_wrong' })
  await expectRejects(ctx.adopt(wrongKey), AuthenticationError, "create({apiKey: 'e2b_wrong'})", obs, 'create_wrong_key')
  const missing = await expectRejects(
    ctx.adopt(Sandbox.create('does-not-exist', opts)),
    SandboxError,
    "create('does-not-exist')",
    obs,
    'create_missing_template',
  )
  expect(missing.statusCode === 404, `statusCode is ${show(missing.statusCode)}, expected 404`)
})

process.exitCode = await main(SUITE)
