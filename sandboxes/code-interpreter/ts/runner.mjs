// npm code-interpreter runner: drives the unmodified `@e2b/code-interpreter` SDK through the steps of the
// `[code-interpreter.js-code-interpreter]` table of sandboxes/code-interpreter/manifest.toml (the step ids
// of the Python runner, sandboxes/code-interpreter/python/runner.py, which says what each step checks).
//
// The sandbox is made on the SDK's default template (`code-interpreter-v1`); every cell goes through
// `sandbox.runCode` to the sandbox's Jupyter-backed server on port 49999. The SDK is loaded from the
// project NODE_PATH names; the step registry, outcomes and clean-up are the SDK runners' (driver.mjs of
// sandboxes/e2b/ts), the protocol the runner kit's (runkit.mjs beside it).

import { readFileSync } from 'node:fs'

import { Fail, Refused, errorDetails, excerpt, expect, expectRejects, main, show, step } from '../../e2b/ts/driver.mjs'

const SUITE = 'code-interpreter'
const TEMPLATE = 'code-interpreter-v1'
const HOME = '/home/user'
const CONTEXT_DIR = `${HOME}/e2b-bench-ci-context`
const GO_FILE = '/tmp/e2b-bench-ci-go' // cells/stream.py waits for it
const ENV_NAME = 'E2B_BENCH_CI_VAR' // cells/env.py reads it
const ANSI_ESCAPE = /\x1b\[[0-9;]*m/g
const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
const TIMEOUT_MS = 3000 // the interrupted cell's timeout
const AFTER_TIMEOUT_MS = 15000 // bound on the cell right after it (the sleep it interrupts lasts 30 s)
// A cell's request, on a quiet host (scaled by the run's slowness): the sandbox's first cell starts its kernel,
// which took 40-60 s on a loaded host, against the SDK's default 60 s; within the step's 90 s (scaled too).
const CELL_REQUEST_MS = 80_000
// Every step of the suite shares the sandbox ci01 creates: it lives three run lifetimes (a loaded host took more
// than one, 120 s scaled, to reach ci11, and it expired under the later steps: 502 "sandbox was not found").
const SHARED_LIFETIMES = 3
const MAX_TIMEOUT_MS = 3_600_000 // the longest lifetime E2B grants a sandbox

// The cells both runners send, one file each.
const cell = (name) => readFileSync(new URL(`../cells/${name}.py`, import.meta.url), 'utf8')

function resultsOf(execution) {
  return execution.results.map((result) => ({
    formats: result.formats(),
    isMainResult: result.isMainResult,
    text: excerpt(result.text),
  }))
}

/** `runCode(code, opts)` with what it returned recorded under `obs[key]`. */
async function runCell(ctx, obs, key, code, opts = {}) {
  const execution = await ctx.sandbox.runCode(code, { requestTimeoutMs: CELL_REQUEST_MS * ctx.slowness, ...opts })
  const { error } = execution
  obs[key] = {
    text: excerpt(execution.text),
    results: resultsOf(execution),
    stdout: execution.logs.stdout,
    stderr: execution.logs.stderr,
    error: error ? { name: error.name, value: error.value } : null,
    executionCount: execution.executionCount,
  }
  return execution
}

function expectText(execution, wanted, what) {
  expect(!execution.error, `${what} raised ${execution.error?.name} in the cell`)
  expect(execution.text === wanted, `${what}: main result text is ${show(execution.text)}, expected ${show(wanted)}`)
}

function expectNameError(execution, name, what) {
  const got = execution.error ? [execution.error.name, execution.error.value] : null
  const wanted = ['NameError', `name '${name}' is not defined`]
  expect(show(got) === show(wanted), `${what}: error is ${show(got)}, expected ${show(wanted)}`)
}

function expectNoError(execution, obs, key) {
  expect(!execution.error, `the cell raised ${show(obs[key].error)}`)
}

/** The one result of a cell that must give exactly one (and no error). */
async function soleResult(ctx, obs, code) {
  const execution = await runCell(ctx, obs, 'cell', code)
  expectNoError(execution, obs, 'cell')
  expect(execution.results.length === 1, `${execution.results.length} results, expected 1: ${show(obs.cell.results)}`)
  return execution.results[0]
}

/** Width and height from a PNG's IHDR chunk (the first chunk of every PNG). */
function pngSize(data) {
  expect(data.subarray(0, 8).equals(PNG_SIGNATURE), `png result does not start with the PNG signature: ${data.subarray(0, 8).toString('hex')}`)
  const length = data.readUInt32BE(8)
  const kind = data.subarray(12, 16).toString('latin1')
  expect(kind === 'IHDR' && length === 13, `the first PNG chunk is ${show(kind)} (${length} bytes), expected IHDR (13)`)
  return [data.readUInt32BE(16), data.readUInt32BE(20)]
}

// --- steps -------------------------------------------------------------------------------------

step('ci01_create', async (ctx, obs) => {
  const { Sandbox } = ctx.sdk
  obs.defaultTemplate = Sandbox.defaultTemplate
  expect(Sandbox.defaultTemplate === TEMPLATE, `the SDK's default template is ${show(Sandbox.defaultTemplate)}`)
  let sandbox
  try {
    sandbox = await Sandbox.create({ timeoutMs: Math.min(ctx.sandboxTimeoutMs * SHARED_LIFETIMES, MAX_TIMEOUT_MS), metadata: ctx.metadata })
  } catch (err) {
    // An answer of the endpoint's (it has a status): the template is refused there.
    if (!(err instanceof ctx.sdk.SandboxError) || err.statusCode === undefined) throw err
    throw new Refused(`create on ${TEMPLATE} refused: ${err.message}`, { status_code: err.statusCode, message: err.message })
  }
  ctx.sandbox = sandbox
  ctx.sandboxId = sandbox.sandboxId
  ctx.created.push(sandbox.sandboxId)
  await ctx.watch(sandbox.sandboxId, () => ctx.sandbox) // later steps need its contexts: never replaced
  obs.sandbox_id = sandbox.sandboxId
  const info = await sandbox.getInfo()
  obs.info = { templateId: info.templateId, name: info.name }
  expect([info.templateId, info.name].includes(TEMPLATE), `getInfo names template ${show(obs.info)}, not ${TEMPLATE}`)
})

step('ci02_state_across_cells', async (ctx, obs) => {
  const first = await runCell(ctx, obs, 'assign', 'x = 41')
  expect(!first.error && first.results.length === 0, `'x = 41' gave ${show(obs.assign)}, expected no result`)
  expectText(await runCell(ctx, obs, 'read', 'x + 1'), '42', "'x + 1'")
})

// `[stream, text]` messages with each stream's adjacent ones joined.
function runsOf(messages) {
  const joined = []
  for (const [stream, text] of messages) {
    if (joined.length > 0 && joined[joined.length - 1][0] === stream) joined[joined.length - 1][1] += text
    else joined.push([stream, text])
  }
  return joined
}

step('ci03_stream_callbacks', async (ctx, obs) => {
  const seen = []
  const onStdout = async (message) => {
    // The cell waits for this file: only a streamed first line lets it go on at once.
    if (seen.length === 0) await ctx.sandbox.files.write(GO_FILE, 'go')
    seen.push(['stdout', message.line])
  }
  const onStderr = (message) => seen.push(['stderr', message.line])
  const execution = await runCell(ctx, obs, 'cell', cell('stream'), { onStdout, onStderr })
  obs.callbacks = seen
  const wanted = [['stdout', 'out-1\n'], ['stderr', 'err-1\n'], ['stdout', 'out-2\n']]
  expectNoError(execution, obs, 'cell')
  // How a stream is cut into messages is the kernel's flushing (a busy host may flush "out-1" before its
  // newline): the order of the streams' text is the contract, so a stream's adjacent messages are one.
  expect(show(runsOf(seen)) === show(wanted), `the callbacks got ${show(seen)}, expected ${show(wanted)}`)
  const logs = [execution.logs.stdout, execution.logs.stderr]
  const joined = logs.map((chunks) => chunks.join(''))
  expect(show(joined) === show(['out-1\nout-2\n', 'err-1\n']), `logs are ${show(logs)}`)
})

step('ci04_display_png', async (ctx, obs) => {
  const figure = await soleResult(ctx, obs, cell('figure'))
  expect(figure.isMainResult === false, 'the figure is the main result, expected a display result')
  expect(Boolean(figure.png), `the figure's result has no png: ${show(obs.cell.results)}`)
  const data = Buffer.from(figure.png, 'base64')
  expect(data.toString('base64') === figure.png.replace(/\s/g, ''), 'the png result is not valid base64')
  obs.png = { bytes: data.length, size: pngSize(data), head: data.subarray(0, 24).toString('base64') }
  expect(Math.min(...obs.png.size) > 0, `the PNG is ${show(obs.png.size)} pixels`)
  expect(String(figure.text).startsWith('<Figure size'), `the figure's text is ${show(figure.text)}`)
})

step('ci05_dataframe_html', async (ctx, obs) => {
  const frame = await soleResult(ctx, obs, cell('dataframe'))
  expect(frame.isMainResult === true, 'the DataFrame is a display result, expected the main one')
  obs.html = excerpt(frame.html)
  expect(Boolean(frame.html) && frame.html.includes('<table'), 'the main result has no html table')
  for (const header of ['<th>a</th>', '<th>b</th>']) expect(frame.html.includes(header), `the html table has no ${header}`)
  const lines = String(frame.text).split('\n').map((line) => line.trim().split(/\s+/))
  expect(show(lines) === show([['a', 'b'], ['0', '1', '3'], ['1', '2', '4']]), `the text is ${show(frame.text)}`)
})

step('ci06_display_json', async (ctx, obs) => {
  const execution = await runCell(ctx, obs, 'cell', cell('json_display'))
  expectNoError(execution, obs, 'cell')
  const shown = execution.results.filter((result) => !result.isMainResult).map((result) => result.json)
  obs.json = shown
  expect(show(shown) === show([{ answer: 42, items: [1, 2] }]), `display results carry json ${show(shown)}`)
  expectText(execution, "{'k': 1}", 'the dict')
})

step('ci07_error', async (ctx, obs) => {
  const errors = []
  const execution = await runCell(ctx, obs, 'cell', '1 / 0', { onError: (error) => errors.push(error) })
  const failure = execution.error
  expect(failure, '1 / 0 gave no error')
  const traceback = failure.traceback.replace(ANSI_ESCAPE, '') // IPython colours its tracebacks
  obs.traceback = excerpt(traceback)
  const got = [failure.name, failure.value]
  expect(show(got) === show(['ZeroDivisionError', 'division by zero']), `the error is ${show(got)}`)
  expect(traceback.includes('ZeroDivisionError') && traceback.includes('1 / 0'), "the traceback lacks the cell's line")
  expect(errors.length === 1 && errors[0] === failure, `onError got ${errors.length} errors, expected this one`)
  expect(execution.results.length === 0, `1 / 0 gave results ${show(obs.cell.results)}`)
})

step('ci08_execution_count', async (ctx, obs) => {
  const first = (await runCell(ctx, obs, 'first', "'one'")).executionCount
  const second = (await runCell(ctx, obs, 'second', "'two'")).executionCount
  expect(Number.isInteger(first) && Number.isInteger(second), `execution counts are ${show(first)}, ${show(second)}`)
  expect(second === first + 1, `executionCount went from ${first} to ${second}, expected ${first} to ${first + 1}`)
})

step('ci09_env_vars', async (ctx, obs) => {
  const envs = { [ENV_NAME]: 'per-run' }
  expectText(await runCell(ctx, obs, 'with', cell('env'), { envs }), "('per-run', 'per-run')", 'envs')
  expectText(await runCell(ctx, obs, 'after', cell('env')), "('unset', 'unset')", 'the next run')
})

step('ci10_context_create_list', async (ctx, obs) => {
  const done = await ctx.sandbox.commands.run(`mkdir -p ${CONTEXT_DIR}`)
  expect(done.exitCode === 0, `mkdir exited ${done.exitCode}`)
  const context = await ctx.sandbox.createCodeContext({ cwd: CONTEXT_DIR })
  ctx.state.context = context
  obs.created = { id: context.id, language: context.language, cwd: context.cwd }
  expect(Boolean(context.id), 'the context has no id')
  expect(context.language === 'python' && context.cwd === CONTEXT_DIR, `the context is ${show(obs.created)}`)
  const listed = Object.fromEntries(
    (await ctx.sandbox.listCodeContexts()).map((c) => [c.id, { language: c.language, cwd: c.cwd }]),
  )
  obs.listed = listed
  const wanted = { language: 'python', cwd: CONTEXT_DIR }
  expect(show(listed[context.id]) === show(wanted), `listCodeContexts shows it as ${show(listed[context.id])}`)
})

step('ci11_context_isolation', async (ctx, obs) => {
  const { context } = ctx.state
  expectText(await runCell(ctx, obs, 'cwd', 'import os; os.getcwd()', { context }), `'${CONTEXT_DIR}'`, 'getcwd()')
  expectNameError(await runCell(ctx, obs, 'x_in_context', 'x', { context }), 'x', 'x in the context')
  expectText(await runCell(ctx, obs, 'x_in_default', 'x'), '41', 'x in the default context')
})

step('ci12_context_restart', async (ctx, obs) => {
  const { context } = ctx.state
  expectText(await runCell(ctx, obs, 'before', 'y = 7; y', { context }), '7', 'y before the restart')
  await ctx.sandbox.restartCodeContext(context)
  expectNameError(await runCell(ctx, obs, 'after', 'y', { context }), 'y', 'y after the restart')
  expectText(await runCell(ctx, obs, 'runs', '6 * 7', { context }), '42', 'a cell after the restart')
})

step('ci13_timeout_interrupts', async (ctx, obs) => {
  const { context } = ctx.state
  const { TimeoutError } = ctx.sdk
  try {
    const execution = await ctx.sandbox.runCode(cell('sleep'), { context, timeoutMs: TIMEOUT_MS })
    obs.returned = { results: resultsOf(execution), error: show(execution.error) }
  } catch (err) {
    obs.timeout = errorDetails(err)
    expect(err instanceof TimeoutError, `a 30 s cell with timeoutMs ${TIMEOUT_MS} threw ${err?.name}, expected TimeoutError`)
  }
  if (obs.returned) throw new Fail(`a 30 s cell with timeoutMs ${TIMEOUT_MS} returned instead of throwing TimeoutError`)
  expect(obs.timeout.message.startsWith('Execution timed out'), `the timeout error says ${show(obs.timeout.message)}`)
  let after
  try {
    after = await runCell(ctx, obs, 'next', 'interrupted', { context, timeoutMs: AFTER_TIMEOUT_MS })
  } catch (err) {
    obs.next_timeout = errorDetails(err)
    if (err instanceof TimeoutError) throw new Fail(`the next cell timed out after ${AFTER_TIMEOUT_MS} ms: the kernel was not interrupted`)
    throw err
  }
  expectText(after, 'True', '`interrupted` in the next cell (KeyboardInterrupt raised in the sleep)')
})

step('ci14_context_remove', async (ctx, obs) => {
  const { context } = ctx.state
  await ctx.sandbox.removeCodeContext(context)
  const listed = (await ctx.sandbox.listCodeContexts()).map((c) => c.id)
  obs.listed = listed
  expect(!listed.includes(context.id), `listCodeContexts still shows ${context.id} after removeCodeContext`)
  const err = await expectRejects(ctx.sandbox.runCode('1', { context }), ctx.sdk.NotFoundError, 'runCode in the removed context', obs, 'run_removed')
  expect(err.message.includes(context.id), `the error does not name the context: ${show(obs.run_removed)}`)
})

step('ci15_second_path', async (ctx, obs) => {
  const path = `${HOME}/e2b-bench-ci-cell.txt`
  const text = 'written by a cell\n'
  const code = `with open('${path}', 'w') as f:\n    f.write(${JSON.stringify(text)})\n`
  expectNoError(await runCell(ctx, obs, 'write', code), obs, 'write')
  obs.files_read = await ctx.sandbox.files.read(path)
  expect(obs.files_read === text, `files.read gave ${show(obs.files_read)}, expected ${show(text)}`)
  const done = await ctx.sandbox.commands.run(`cat ${path}`)
  obs.cat = done.stdout
  expect(done.stdout === text, `cat gave ${show(done.stdout)}, expected ${show(text)}`)
  const other = `${HOME}/e2b-bench-ci-command.txt`
  await ctx.sandbox.commands.run(`printf 'from a command' > ${other}`)
  expectText(await runCell(ctx, obs, 'read', `open('${other}').read()`), "'from a command'", 'the cell reading it')
})

step('ci16_kill', async (ctx, obs) => {
  const { Sandbox } = ctx.sdk
  obs.kill = await ctx.sandbox.kill()
  if (obs.kill === true) ctx.killed.add(ctx.sandboxId)
  expect(obs.kill === true, `kill() returned ${show(obs.kill)}, expected true`)
  obs.kill_again = await Sandbox.kill(ctx.sandboxId)
  expect(obs.kill_again === false, `Sandbox.kill(killed id) returned ${show(obs.kill_again)}, expected false`)
})

// Its footer written, the runner ends: runCode refused by a removed context (ci14) leaves the SDK's request timer
// and socket pending, which would hold the runner (and the run) up to a minute longer.
process.exit(await main(SUITE, ['@e2b/code-interpreter', 'e2b']))
