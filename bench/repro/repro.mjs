// Standalone reproduction of one e2b-bench case (written by `e2b-bench repro`; runs without the harness).
//
// Needs only the packages of package.json (`npm ci`) and three variables, as the E2B SDK reads them:
// E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL (E2B_DOMAIN too for a hosted endpoint). It runs the case's step
// (and the steps it needs) with the client code under runner/, exactly as the harness ran it, and exits 0 when
// the endpoint behaved as E2B does (the step passed), 1 printing the symptom when it did not, 2 when it could not
// run (a missing variable). REPRO_TIMEOUT_S bounds the silence of a step (300 s).

import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

const HERE = dirname(fileURLToPath(import.meta.url))
const VARIABLES = ['E2B_API_KEY', 'E2B_API_URL', 'E2B_SANDBOX_URL']

async function main() {
  const kase = JSON.parse(readFileSync(join(HERE, 'case.json'), 'utf8'))
  const missing = VARIABLES.filter((name) => !process.env[name])
  if (missing.length > 0) {
    console.error(`repro: set ${missing.join(', ')} (see README.md)`)
    return 2
  }
  const timeoutS = Number(process.env.REPRO_TIMEOUT_S || '300')
  const task = structuredClone(kase.task)
  task.run_id = task.metadata['e2b-bench-run'] = `repro-${process.pid}-${Date.now()}`
  const child = spawn(process.execPath, [join(HERE, kase.entry)], {
    cwd: HERE,
    env: { ...process.env, NODE_PATH: join(HERE, 'node_modules') },
    stdio: ['pipe', 'pipe', 'pipe'],
    detached: true,
  })
  child.stdin.end(JSON.stringify(task))
  let stderr = ''
  child.stderr.on('data', (chunk) => {
    stderr = (stderr + chunk.toString()).slice(-4000)
  })
  const events = {}
  let running = null
  let heard = Date.now()
  const exited = new Promise((resolve) => child.on('close', (code) => resolve(code)))
  createInterface({ input: child.stdout }).on('line', (line) => {
    heard = Date.now()
    let event
    try {
      event = JSON.parse(line)
    } catch {
      return
    }
    if (event.type === 'hello') {
      const pins = Object.entries(event.pins ?? {}).map(([k, v]) => `${k} ${v}`)
      console.log(`repro: ${kase.id} with ${pins.join(', ')}`)
    } else if (event.type === 'start') {
      running = event.id
    } else if (event.type === 'step') {
      events[event.id] = event
      running = null
      console.log(`  ${event.id}: ${event.outcome}${event.error ? `: ${event.error}` : ''}`)
    }
  })
  const silent = new Promise((resolve) => {
    const timer = setInterval(() => {
      if (Date.now() - heard > timeoutS * 1000) {
        clearInterval(timer)
        resolve('silent')
      }
    }, 200)
    exited.then(() => clearInterval(timer))
  })
  const first = await Promise.race([exited.then((code) => ({ code })), silent])
  if (first === 'silent') {
    process.kill(-child.pid, 'SIGTERM')
    setTimeout(() => process.kill(-child.pid, 'SIGKILL'), 5000).unref()
    console.log(`REPRODUCED: no answer in ${timeoutS} s in step ${running ?? '(between steps)'}`)
    return 1
  }
  const step = events[kase.step]
  if (step === undefined) {
    console.log(`REPRODUCED: the client ended (exit ${first.code}) before ${kase.step} was reported\n${stderr.trim()}`)
    return 1
  }
  if (step.outcome === 'pass' || step.outcome === 'skip') {
    console.log(`OK: ${kase.step} behaves as E2B does${step.outcome === 'skip' ? ` (skipped: ${step.error})` : ''}`)
    return 0
  }
  const error = String(step.error ?? '')
  const culprit = error.startsWith('depends on ') && events[error.slice(11)] ? events[error.slice(11)] : step
  console.log(`REPRODUCED: ${culprit.id} ${culprit.outcome}: ${culprit.error}`)
  const { traceback, ...details } = culprit.details ?? {}
  if (Object.keys(details).length > 0) console.log(JSON.stringify(details, null, 2).slice(0, 4000))
  console.log(`E2B: ${kase.expected}`)
  return 1
}

process.exitCode = await main()
