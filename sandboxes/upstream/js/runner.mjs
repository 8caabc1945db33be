// The upstream suite's Node runner: E2B's own js-sdk tests, unmodified, run by vitest (this runner's
// pinned environment, NODE_PATH) from the source tree's packages/js-sdk with the project's own
// configuration (vitest.config.mjs: E2B's Node test projects only), one step per vitest test.
//
// The task's `options.upstream` names the source (`js_sdk`), the tests this endpoint cannot serve
// (`declared`: step -> why; reported `skip` with reason `needs`, never run) and vitest's workers. A step
// is `<file> > <describe> > ... > <title>` (bench/upstream/source.py lists them from the syntax); a title
// with placeholders (`.each`/`.for`'s `%s`, a template literal's `${...}`) is one step for every test it
// names, judged together when its file ends. Vitest's reporter API gives each test's result as it ends;
// its JSON reporter's file is read at the end for any test the stream did not deliver. Nothing is written
// into the source tree (vite's cache goes to a temporary folder).

import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join, relative } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

import { Skip, emit, footer, hello, readTask, stepEvent } from '../../e2b/ts/runkit.mjs'

const SEPARATOR = ' > '
const ERROR_CHARS = 4000
const here = dirname(fileURLToPath(import.meta.url))

/** The regular expression source matching what a listed title names: its placeholders match anything. */
function titlePattern(title) {
  const placeholder = /\$\{[^}]*\}|%[sdifjoc#$%]|\$[A-Za-z_][\w.]*|\$\d+/g
  let source = ''
  let last = 0
  for (const match of title.matchAll(placeholder)) {
    source += escape(title.slice(last, match.index)) + (match[0] === '%%' ? '%' : '[\\s\\S]*?')
    last = match.index + match[0].length
  }
  return source + escape(title.slice(last))
}

function escape(text) {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
}

function hasPlaceholder(title) {
  return titlePattern(title) !== escape(title)
}

function packageVersion(packages, name) {
  return JSON.parse(readFileSync(join(packages, name, 'package.json'), 'utf8')).version
}

class Steps {
  constructor(wanted) {
    this.byFile = new Map() // file -> [{id, name, pattern, plain}]
    this.items = new Map() // step -> [{name, state, errors, ms}]
    this.reported = new Set()
    this.fileErrors = new Map() // file -> the errors vitest reported for the file itself
    for (const id of wanted) {
      const cut = id.indexOf(SEPARATOR)
      const file = id.slice(0, cut)
      const name = id.slice(cut + SEPARATOR.length)
      const plain = !hasPlaceholder(name)
      const pattern = new RegExp(`^${titlePattern(name)}$`)
      if (!this.byFile.has(file)) this.byFile.set(file, [])
      this.byFile.get(file).push({ id, name, pattern, plain })
    }
  }

  files() {
    return [...this.byFile.keys()]
  }

  /** vitest's -t: the full names (titles joined by spaces) of the wanted tests, anchored at the end. */
  namePattern() {
    const names = [...this.byFile.values()].flat().map(({ name }) => titlePattern(name).split(escape(SEPARATOR)).join('(?: > | )'))
    return `(?:^| )(?:${names.join('|')})$`
  }

  /** One test's result: its step's item, the step sent when it is a plain title's. */
  add(file, fullName, state, errors, ms) {
    const steps = this.byFile.get(file) ?? []
    const step = steps.find((s) => s.plain && s.name === fullName) ?? steps.find((s) => s.pattern.test(fullName))
    if (step === undefined || this.reported.has(step.id)) return
    if (!this.items.has(step.id)) this.items.set(step.id, [])
    this.items.get(step.id).push({ name: fullName, state, errors, ms })
    if (step.plain) this.send(step.id)
  }

  /** A file ended: each of its steps that has results is sent. A step with none waits for the end of the run
   * (`final`): vitest may deliver a test's result after its file's end, and its JSON report has them all. */
  endFile(file, fileErrors = [], final = false) {
    if (fileErrors.length > 0) this.fileErrors.set(file, fileErrors)
    for (const { id } of this.byFile.get(file) ?? []) {
      if (this.reported.has(id)) continue
      if (this.items.has(id)) this.send(id)
      else if (final) {
        const errors = this.fileErrors.get(file) ?? []
        const why = errors.length > 0 ? `the file failed: ${oneLine(errors[0].message)}` : 'vitest ran no test of this name'
        this.reported.add(id)
        emit(stepEvent(id, 'error', 0, why, { upstream: id, errors: excerpt(errors.map(text).join('\n\n')) }))
      }
    }
  }

  send(id) {
    this.reported.add(id)
    const items = this.items.get(id)
    const ms = Math.round(items.reduce((sum, item) => sum + (item.ms ?? 0), 0) * 1000) / 1000
    const details = { upstream: id }
    if (items.length > 1 || items[0].name !== id.slice(id.indexOf(SEPARATOR) + SEPARATOR.length)) {
      details.items = Object.fromEntries(items.map((item) => [item.name, outcomeOf(item.state)]))
    }
    const failed = items.filter((item) => item.state === 'failed')
    if (failed.length > 0) {
      const first = failed[0]
      const message = oneLine(first.errors[0]?.message ?? 'failed')
      details.errors = excerpt(failed.flatMap((item) => item.errors.map(text)).join('\n\n'))
      const error = items.length === 1 ? message : `${failed.length} of ${items.length} failed; ${first.name}: ${message}`
      emit(stepEvent(id, 'fail', ms, error, details))
    } else if (items.every((item) => item.state === 'skipped')) {
      emit(stepEvent(id, 'skip', ms, null, details, new Skip('upstream skips it (skipIf/skip in the test)', 'upstream')))
    } else emit(stepEvent(id, 'pass', ms, null, details))
  }
}

function outcomeOf(state) {
  return { passed: 'pass', failed: 'fail', skipped: 'skip' }[state] ?? state
}

function oneLine(message) {
  return String(message ?? '').split('\n').map((line) => line.trim()).filter(Boolean).join(' ').slice(0, 500)
}

function text(error) {
  return error.stack || error.message || String(error)
}

function excerpt(value) {
  return value.length > ERROR_CHARS ? `${value.slice(0, ERROR_CHARS)}\n[... ${value.length - ERROR_CHARS} more characters]` : value
}

async function main() {
  const task = await readTask()
  const upstream = task.options?.upstream ?? {}
  const sdk = upstream.js_sdk
  const packages = (process.env.NODE_PATH || '').split(delimiter).filter(Boolean)[0]
  hello(task.runner, { vitest: packageVersion(packages, 'vitest'), e2b: JSON.parse(readFileSync(join(sdk, 'package.json'), 'utf8')).version })
  const declared = upstream.declared ?? {}
  const steps = task.steps ?? []
  for (const id of steps) {
    if (id in declared) emit(stepEvent(id, 'skip', 0, null, { upstream: id }, new Skip(declared[id], 'needs')))
  }
  const wanted = steps.filter((id) => !(id in declared))
  const scratch = mkdtempSync(join(tmpdir(), 'e2b-bench-vitest-'))
  let code = 0
  const started = Date.now()
  const plan = new Steps(wanted)
  if (wanted.length > 0) {
    process.env.E2B_BENCH_UPSTREAM_JS_SDK = sdk
    process.env.E2B_BENCH_VITE_CACHE = join(scratch, 'vite')
    const exports = JSON.parse(readFileSync(join(packages, 'vitest', 'package.json'), 'utf8')).exports['./node']
    const { startVitest } = await import(pathToFileURL(join(packages, 'vitest', exports.import?.default ?? exports.import ?? exports.default)).href)
    const report = join(scratch, 'report.json')
    const reporter = {
      onTestCaseResult(testCase) {
        const result = testCase.result()
        const file = relative(sdk, testCase.module.moduleId)
        plan.add(file, testCase.fullName, result.state, result.errors ?? [], testCase.diagnostic()?.duration ?? 0)
      },
      onTestModuleEnd(testModule) {
        plan.endFile(relative(sdk, testModule.moduleId), testModule.errors?.() ?? [])
      },
    }
    try {
      const vitest = await startVitest(
        'test',
        plan.files().map((file) => join(sdk, file)),
        {
          config: join(here, 'vitest.config.mjs'),
          root: sdk,
          run: true,
          watch: false,
          testNamePattern: plan.namePattern(),
          reporters: [reporter, ['json', { outputFile: report }]],
          maxWorkers: Number(upstream.workers) || 2,
        },
        {},
        { stdout: process.stderr, stderr: process.stderr },
      )
      await vitest?.close()
      code = process.exitCode ?? 0
    } catch (error) {
      console.error(error)
      code = 1
    }
    fromJsonReport(plan, sdk, report)
  }
  for (const id of wanted) {
    if (!plan.reported.has(id)) emit(stepEvent(id, 'error', 0, `vitest reported no end for it (see the runner's stderr)`, {}))
  }
  rmSync(scratch, { recursive: true, force: true })
  footer(true, { cleanup: {}, vitest_exit_code: code, seconds: Math.round((Date.now() - started) / 100) / 10 })
  process.exit(0)
}

/** Whatever the reporter stream did not deliver, from vitest's JSON report (when it was written). */
function fromJsonReport(plan, sdk, path) {
  let report = {}
  try {
    report = JSON.parse(readFileSync(path, 'utf8'))
  } catch (error) {
    console.error(`vitest's JSON report ${path} could not be read: ${error.message}`)
  }
  for (const module of report.testResults ?? []) {
    const file = relative(sdk, module.name)
    for (const test of module.assertionResults ?? []) {
      const state = { passed: 'passed', failed: 'failed' }[test.status] ?? 'skipped'
      const errors = (test.failureMessages ?? []).map((message) => ({ message }))
      plan.add(file, [...(test.ancestorTitles ?? []), test.title].join(SEPARATOR), state, errors, test.duration ?? 0)
    }
    plan.endFile(file, module.message ? [{ message: module.message }] : [], true)
  }
  for (const file of plan.files()) plan.endFile(file, [], true)
}

main().catch((error) => {
  console.error(error)
  footer(false, { reason: oneLine(error?.message ?? error) })
  process.exit(1)
})
