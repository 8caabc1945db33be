// The agent computer contract (docs/suites.md, "The computer suite"): what an agent platform's E2B "computer" binding
// needs from an endpoint, driven through our own adapter of that contract (agent_computer.mjs) on the
// unmodified npm SDK. Each step checks the effect through a second path: a shell command in the sandbox as
// root, or the REST API. Steps are the `[computer.ts]` table of sandboxes/e2b/manifest.toml.

import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createHash, randomBytes } from 'node:crypto'
import http from 'node:http'
import https from 'node:https'
import { fileURLToPath } from 'node:url'

import { AgentComputer, INVOCATION_TAG, LIMITS, SKILLS_DIR, quote } from './agent_computer.mjs'
import { Fail, errorDetails, excerpt, expect, main, show, sleep, step } from './driver.mjs'

const SUITE = 'computer'
const AGENT = 'agent'
const AGENT_HOME = `/home/${AGENT}`
const MIB = 1 << 20
const SEEDS = { '/workspace/seed/task.md': '# task\nsay hello\n', '/home/user/seed.json': '{"seed": 1}\n' }
const SKILLS = { 'pdf/SKILL.md': '# pdf\nread pdfs with pdftotext\n', 'web/SKILL.md': '# web\nfetch with curl\n' }
const ORPHAN = fileURLToPath(new URL('./computer_orphan.mjs', import.meta.url))
const ORPHAN_LIFETIME_S = 10
const CLOCK_SKEW_MS = 5_000 // between this host and the endpoint's clock

const sha256 = (data) => createHash('sha256').update(data).digest('hex')

function same(obs, key, actual, wanted) {
  obs[key] = typeof actual === 'string' ? excerpt(actual) : actual
  if (show(actual) !== show(wanted)) throw new Fail(`${key}: got ${excerpt(show(actual))}, expected ${excerpt(show(wanted))}`)
}

async function rejects(obs, key, call, pattern) {
  try {
    const value = await call()
    obs[key] = { returned: excerpt(show(value)) }
  } catch (err) {
    obs[key] = errorDetails(err)
    expect(pattern === undefined || pattern.test(String(err?.message)), `${key}: ${err?.name}: ${err?.message} does not match ${pattern}`)
    return err
  }
  throw new Fail(`${key}: succeeded, expected a refusal`)
}

/** The second path inside the sandbox: a shell command as root, its stdout (a failure is a `Fail`). */
async function root(computer, command) {
  const done = await computer.exec(command)
  if (done.exitCode !== 0) throw new Fail(`root check \`${command.slice(0, 120)}\` exited with ${done.exitCode}: ${done.stderr.trim()}`)
  return done.stdout
}

/** A shell command as the agent user: its exit code. */
async function asAgent(computer, command) {
  return (await computer.exec(command, { user: AGENT })).exitCode
}

// --- the second path: the REST API -------------------------------------------------------------

async function rest(path) {
  return fetch(`${process.env.E2B_API_URL}${path}`, { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
}

async function restInfo(id) {
  const response = await rest(`/sandboxes/${id}`)
  return { status: response.status, body: response.status === 200 ? await response.json() : null }
}

/** The listed sandboxes whose own metadata has `key=value` (the list is asked to filter, and checked). */
async function restTagged(key, value) {
  const response = await rest(`/v2/sandboxes?metadata=${encodeURIComponent(`${key}=${value}`)}`)
  return (await response.json()).filter((s) => s.metadata?.[key] === value).map((s) => s.sandboxID)
}

// --- the shared computer -----------------------------------------------------------------------

async function open(ctx, options = {}) {
  const computer = await AgentComputer.open(ctx.sdk, { metadata: ctx.metadata, ...options })
  ctx.created.push(computer.sandboxId)
  return computer
}

function shared(ctx) {
  return ctx.state.computer
}

async function streamed(readable) {
  const hash = createHash('sha256')
  let size = 0
  for await (const chunk of readable) {
    hash.update(chunk)
    size += chunk.length
  }
  return { size, sha: hash.digest('hex') }
}

async function rootSha(computer, path) {
  return (await root(computer, `sha256sum ${quote(path)}`)).split(' ')[0]
}

// --- steps ---------------------------------------------------------------------------------------

step('co01_open_seeds_python', async (ctx, obs) => {
  const computer = await open(ctx, { seeds: SEEDS })
  ctx.state.computer = computer
  obs.sandbox_id = computer.sandboxId
  expect(/^Python 3\.\d+/.test(computer.pythonVersion), `python --version said ${show(computer.pythonVersion)}`)
  obs.python = computer.pythonVersion
  for (const [path, content] of Object.entries(SEEDS)) same(obs, `seed ${path}`, await rootSha(computer, path), sha256(content))
  const { status, body } = await restInfo(computer.sandboxId)
  same(obs, 'rest_status', status, 200)
  same(obs, 'rest_template', body?.templateID, 'base')
  same(obs, 'rest_state', body?.state, 'running')
  same(obs, 'rest_receipt_tag', body?.metadata?.[INVOCATION_TAG], computer.invocation)
  same(obs, 'rest_lifetime_s', Math.round((Date.parse(body?.endAt) - Date.parse(body?.startedAt)) / 1000), LIMITS.sandboxTimeoutMs / 1000)
})

step('co02_template_agent_user', async (ctx, obs) => {
  const computer = shared(ctx)
  same(obs, 'tools', (await root(computer, 'for t in bash python3 timeout useradd; do command -v $t >/dev/null && echo $t; done')).split('\n').filter(Boolean), ['bash', 'python3', 'timeout', 'useradd'])
  await computer.ensureAgentUser(AGENT)
  const [uid, groups, home] = (await root(computer, `id -u ${AGENT}; id -nG ${AGENT}; getent passwd ${AGENT} | cut -d: -f6`)).trim().split('\n')
  obs.uid = Number(uid)
  expect(Number(uid) >= 1000, `the agent user's uid is ${uid}`)
  same(obs, 'home', home, AGENT_HOME)
  expect(!groups.split(' ').some((g) => ['sudo', 'root', 'wheel', 'admin'].includes(g)), `the agent user is in ${groups}`)
  same(obs, 'sudo_n_true_exit_nonzero', (await asAgent(computer, 'sudo -n true 2>/dev/null')) !== 0, true)
  same(obs, 'whoami', (await computer.run('whoami')).stdout.trim(), AGENT)
})

step('co03_skills_read_only', async (ctx, obs) => {
  const computer = shared(ctx)
  const paths = await computer.installSkills(SKILLS)
  const before = await root(computer, `cd ${SKILLS_DIR} && find . | sort && sha256sum */* && stat -c '%U:%G %a %n' . */ */*`)
  const [first] = paths
  same(obs, 'agent_reads', (await computer.run(`cat ${quote(first)}`)).stdout, SKILLS['pdf/SKILL.md'])
  const refused = {
    append: await asAgent(computer, `echo x >> ${quote(first)}`),
    rename: await asAgent(computer, `mv ${quote(first)} ${quote(`${first}.moved`)}`),
    remove: await asAgent(computer, `rm -f ${quote(first)}`),
    create: await asAgent(computer, `touch ${SKILLS_DIR}/new`),
    remove_dir: await asAgent(computer, `rm -rf ${SKILLS_DIR}/web`),
  }
  obs.shell_exit_codes = refused
  for (const [what, code] of Object.entries(refused)) expect(code !== 0, `the agent user could ${what} a skill (exit 0)`)
  await rejects(obs, 'adapter_write', () => computer.writeStream(first, [Buffer.from('changed')]), /cannot write/)
  // envd renames and removes as root (the user only expands `~`): the adapter, not the endpoint, refuses them.
  await rejects(obs, 'adapter_rename', () => computer.rename(first, `${first}.moved`, { user: AGENT }), /cannot write/)
  await rejects(obs, 'adapter_remove', () => computer.remove(first, { user: AGENT }), /cannot write/)
  await rejects(obs, 'adapter_remove_dir', () => computer.remove(`${SKILLS_DIR}/web`, { user: AGENT }), /cannot write/)
  const after = await root(computer, `cd ${SKILLS_DIR} && find . | sort && sha256sum */* && stat -c '%U:%G %a %n' . */ */*`)
  same(obs, 'unchanged', after, before)
  const modes = after.split('\n').filter((line) => line.startsWith('root:') || /^\S+:\S+ \d+ /.test(line))
  same(obs, 'owners_modes', modes, ['root:root 755 .', 'root:root 755 pdf/', 'root:root 755 web/', 'root:root 644 pdf/SKILL.md', 'root:root 644 web/SKILL.md'])
})

step('co04_command_limits', async (ctx, obs) => {
  const computer = shared(ctx)
  const tag = randomBytes(4).toString('hex')
  // The deadline ends a command that overruns, its group with it (the sleeps' lengths name them).
  const started = Date.now()
  const late = await computer.run('sleep 6007 & sleep 6008; echo not-reached', { deadlineMs: 1_500 })
  obs.deadline = { ...late, stdout: excerpt(late.stdout), stderr: excerpt(late.stderr), elapsed_ms: Date.now() - started }
  expect(late.timedOut && late.exitCode !== 0, `a command past its 1.5 s deadline ended with ${late.exitCode} (timed out: ${late.timedOut})`)
  expect(!late.stdout.includes('not-reached'), 'the command ran past its deadline')
  same(obs, 'deadline_left_running', (await root(computer, 'ps -eo args= | grep -cx "sleep 600[78]" || true')).trim(), '0')
  // Output past 2 MiB is cut and flagged; the endpoint streams the rest without stalling and the command ends.
  const total = 3 * MIB
  const big = await computer.run(`head -c ${total} /dev/zero | tr '\\0' x; touch /tmp/output-done-${tag}`)
  obs.output = { exitCode: big.exitCode, truncated: big.truncated, kept: big.keptBytes, streamed: big.streamedBytes, timedOut: big.timedOut }
  same(obs, 'output_exit_code', big.exitCode, 0)
  same(obs, 'output_truncated', big.truncated, true)
  same(obs, 'output_kept_bytes', Buffer.byteLength(big.stdout), LIMITS.outputBytes)
  same(obs, 'output_streamed_bytes', big.streamedBytes, total)
  same(obs, 'output_finished_in_sandbox', (await root(computer, `test -e /tmp/output-done-${tag} && echo yes`)).trim(), 'yes')
})

step('co05_cancel_descendants', async (ctx, obs) => {
  const computer = shared(ctx)
  const dir = `/tmp/cancel-${randomBytes(4).toString('hex')}`
  const names = ['leader', 'background', 'nested_background', 'nested_shell', 'ignores_term']
  const tree = [
    `mkdir -p ${dir}`,
    `sleep 300 & echo $! > ${dir}/background`,
    `bash -c 'sleep 301 & echo $! > ${dir}/nested_background; bash -c "echo \\$\\$ > ${dir}/nested_shell; sleep 302"' &`,
    `bash -c 'trap "" TERM; echo $$ > ${dir}/ignores_term; while :; do sleep 0.1; done' &`,
    `echo $$ > ${dir}/leader`,
    `until ${names.map((n) => `test -s ${dir}/${n}`).join(' && ')}; do sleep 0.05; done; echo started`,
    'wait',
  ].join('\n')
  // The tree says when every part of it runs; the bound is only the contract's command deadline.
  const running = await computer.start(tree)
  const bound = Date.now() + LIMITS.commandDeadlineMs
  while (!running.stdoutSoFar.includes('started') && Date.now() < bound) await sleep(50)
  expect(running.stdoutSoFar.includes('started'), `the command tree did not start within ${LIMITS.commandDeadlineMs / 1000} s`)
  const listed = (await root(computer, `cd ${dir} && for f in *; do echo "$f $(cat $f)"; done`)).trim()
  const pids = Object.fromEntries(listed.split('\n').map((l) => l.split(' ')))
  obs.pids = pids
  const survivors = await running.cancel()
  const result = await running.wait()
  obs.adapter_survivors = survivors
  obs.exit_code = result.exitCode
  obs.stream_held_open = result.streamHeld
  const alive = (await root(computer, `for p in ${Object.values(pids).join(' ')}; do s=$(awk '{print $3}' /proc/$p/stat 2>/dev/null); test -n "$s" && test "$s" != Z && echo $p; done; true`)).split('\n').filter(Boolean)
  const named = Object.fromEntries(Object.entries(pids).filter(([, pid]) => alive.includes(pid)))
  same(obs, 'still_running', named, {})
  same(obs, 'reported_survivors', survivors, [])
})

step('co06_file_streams', async (ctx, obs) => {
  const computer = shared(ctx)
  const dir = `${AGENT_HOME}/files-${randomBytes(4).toString('hex')}`
  await root(computer, `install -d -o ${AGENT} -g ${AGENT} ${dir}`)
  // 20 MiB of random bytes written and read back as streams.
  const data = randomBytes(20 * MIB)
  await computer.writeStream(`${dir}/big.bin`, randomChunksOf(data))
  same(obs, 'big_sha_in_sandbox', await rootSha(computer, `${dir}/big.bin`), sha256(data))
  same(obs, 'big_read_stream', await streamed(await computer.readStream(`${dir}/big.bin`)), { size: data.length, sha: sha256(data) })
  // Six uploads at once go through four slots: the first four, once sending, hold the rest of their bytes
  // until all four are open.
  const many = Array.from({ length: 6 }, () => randomBytes(MIB))
  let entered = 0
  let allIn
  const fourOpen = new Promise((resolve) => (allIn = resolve))
  async function* gated(bytes) {
    const chunks = randomChunksOf(bytes, 256 << 10)
    yield (await chunks.next()).value
    if (++entered === LIMITS.uploadSlots) allIn(true)
    // The bound's timer is cleared once the four are open: a pending one keeps the runner from exiting.
    let bound
    const late = new Promise((resolve) => (bound = setTimeout(() => resolve(false), 60_000)))
    obs.four_uploads_open = await Promise.race([fourOpen, late])
    clearTimeout(bound)
    yield* chunks
  }
  await Promise.all(many.map((bytes, i) => computer.writeStream(`${dir}/slot-${i}.bin`, gated(bytes))))
  same(obs, 'four_uploads_open_at_once', obs.four_uploads_open, true)
  same(obs, 'upload_slots_peak', computer.slots.peak, LIMITS.uploadSlots)
  const shas = (await root(computer, `cd ${dir} && sha256sum slot-*.bin`)).trim().split('\n').map((l) => l.split(' ')[0])
  same(obs, 'slot_shas', shas, many.map(sha256))
  // A 17 MiB file reads as a stream; a buffered read of it is refused before any transfer.
  await root(computer, `head -c ${17 * MIB} /dev/urandom > ${dir}/17.bin && chown ${AGENT}: ${dir}/17.bin`)
  same(obs, 'read_17_mib_stream', (await streamed(await computer.readStream(`${dir}/17.bin`))).sha, await rootSha(computer, `${dir}/17.bin`))
  await rejects(obs, 'buffered_17_mib', () => computer.readBytes(`${dir}/17.bin`), /over the 16 MiB limit, read it as a stream/)
  // Publishing is atomic: while the new bytes are staged, the destination still holds the old ones whole.
  const old = Buffer.from('old complete content\n')
  await computer.writeStream(`${dir}/doc.txt`, randomChunksOf(old))
  const next = randomBytes(2 * MIB)
  let during
  await computer.writeStream(`${dir}/doc.txt`, randomChunksOf(next, MIB, { [MIB]: async () => {
    during = await root(computer, `sha256sum ${dir}/doc.txt | cut -d' ' -f1; ls -a ${dir} | grep -c '^\\.agent-stage-'`)
  } }))
  same(obs, 'while_staged', during.trim().split('\n'), [sha256(old), '1'])
  same(obs, 'published', await rootSha(computer, `${dir}/doc.txt`), sha256(next))
  // A source that fails midway publishes nothing and leaves no staged file.
  async function* failing() {
    yield randomBytes(MIB)
    throw new Error('source failed midway')
  }
  await rejects(obs, 'failed_source', () => computer.writeStream(`${dir}/partial.bin`, failing()), /nothing was published/)
  same(obs, 'after_failed_source', (await root(computer, `ls -a ${dir} | grep -E '^(partial\\.bin|\\.agent-stage-.*)$'; true`)).trim(), '')
  // A parent path that is a symlink is refused; nothing lands where it points.
  const elsewhere = `/tmp/elsewhere-${randomBytes(4).toString('hex')}`
  await root(computer, `install -d -o ${AGENT} ${elsewhere} && ln -s ${elsewhere} ${dir}/link && chown -h ${AGENT}: ${dir}/link`)
  await rejects(obs, 'symlinked_parent', () => computer.writeStream(`${dir}/link/escape.txt`, randomChunksOf(old)), /is a symlink/)
  same(obs, 'elsewhere_empty', (await root(computer, `ls -A ${elsewhere}`)).trim(), '')
  same(obs, 'answers_lost', computer.lostAnswers, [])
})

async function* randomChunksOf(data, chunk = MIB, after = {}) {
  for (let sent = 0; sent < data.length; sent += chunk) {
    if (after[sent]) await after[sent]()
    yield data.subarray(sent, sent + chunk)
  }
}

/** A loopback proxy to the endpoint that forwards everything and loses the answer to the requests `drop` picks. */
async function lossyProxy(drop) {
  const api = new URL(process.env.E2B_API_URL)
  const envd = new URL(process.env.E2B_SANDBOX_URL || `https://sandbox.${process.env.E2B_DOMAIN || 'e2b.app'}`)
  const seen = []
  const server = http.createServer((req, res) => {
    const base = req.headers['e2b-sandbox-id'] ? envd : api
    const url = new URL(base.pathname.replace(/\/$/, '') + req.url, base)
    const lose = drop(req)
    seen.push({ method: req.method, path: url.pathname, lost: lose })
    const upstream = (url.protocol === 'https:' ? https : http).request(url, { method: req.method, headers: { ...req.headers, host: url.host } }, (answer) => {
      if (lose) {
        answer.resume()
        answer.on('end', () => req.socket.destroy()) // applied upstream; the client never learns it
        return
      }
      res.writeHead(answer.statusCode, answer.headers)
      answer.pipe(res)
    })
    upstream.on('error', () => req.socket.destroy())
    req.pipe(upstream)
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  const url = `http://127.0.0.1:${server.address().port}`
  return { url, seen, close: () => new Promise((resolve) => server.close(resolve)) }
}

step('co07_mutation_receipts', async (ctx, obs) => {
  const lost = { create: 0, move: 0 }
  const proxy = await lossyProxy((req) => {
    if (req.method === 'POST' && /\/sandboxes$/.test(req.url) && lost.create++ === 0) return true
    return /\/filesystem\.Filesystem\/Move$/.test(req.url) && lost.move++ === 0
  })
  let computer
  try {
    computer = await open(ctx, { connection: { apiUrl: proxy.url, sandboxUrl: proxy.url } })
    const path = `/home/user/receipt-${randomBytes(4).toString('hex')}.txt`
    const content = Buffer.from('published once\n')
    await computer.writeStream(path, randomChunksOf(content))
    obs.requests = proxy.seen.filter((r) => r.method === 'POST' && /\/sandboxes$|Move$/.test(r.path))
    obs.receipts = computer.receipts
    same(obs, 'creates_sent', lost.create, 1)
    same(obs, 'renames_sent', lost.move, 1)
    same(obs, 'rest_sandboxes_with_receipt', await restTagged(INVOCATION_TAG, computer.invocation), [computer.sandboxId])
    same(obs, 'receipt_outcomes', computer.receipts.map((r) => `${r.op}: ${r.outcome}`), [
      'create: applied (answer lost; found by its receipt)',
      'publish: applied (answer lost; found by its receipt)',
    ])
    same(obs, 'in_sandbox', (await root(computer, `sha256sum ${path} | cut -d' ' -f1; ls -a /home/user | grep -c '^\\.agent-stage-' || true`)).trim().split('\n'), [sha256(content), '0'])
  } finally {
    if (computer && !ctx.created.includes(computer.sandboxId)) ctx.created.push(computer.sandboxId)
    await proxy.close()
  }
})

step('co08_release', async (ctx, obs) => {
  // Close: the sandbox is killed and confirmed gone (get: not found; the list omits it).
  const computer = await open(ctx)
  const id = computer.sandboxId
  await computer.close()
  ctx.killed.add(id)
  same(obs, 'rest_get_after_close', (await restInfo(id)).status, 404)
  same(obs, 'rest_list_after_close', (await restTagged(INVOCATION_TAG, computer.invocation)).length, 0)
  // A crashed client: its sandbox runs on until its lifetime ends it.
  const child = spawn(process.execPath, [ORPHAN, String(ORPHAN_LIFETIME_S * 1000), JSON.stringify(ctx.metadata)], { stdio: ['ignore', 'pipe', 'pipe'] })
  let stderr = ''
  child.stderr.on('data', (d) => (stderr += d))
  const printed = await new Promise((resolve, reject) => {
    let out = ''
    child.stdout.on('data', (d) => {
      out += d
      if (out.includes('\n')) resolve(JSON.parse(out))
    })
    child.on('exit', (code) => reject(new Fail(`the client exited with ${code} before opening its computer: ${stderr.slice(-500)}`)))
  })
  const orphan = printed.sandboxId
  const endAt = Date.parse(printed.endAt)
  ctx.created.push(orphan)
  child.kill('SIGKILL')
  await new Promise((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', resolve)))
  obs.orphan = printed
  same(obs, 'orphan_lifetime_s', Math.round((endAt - Date.parse(printed.startedAt)) / 1000), ORPHAN_LIFETIME_S)
  const after = await restInfo(orphan)
  // Still there after the crash, unless its lifetime is over already (a busy host).
  if (Date.now() < endAt - CLOCK_SKEW_MS) same(obs, 'orphan_state_after_crash', after.body?.state, 'running')
  // Bounded by its lifetime and a margin for a busy host; the poll ends as soon as the endpoint ends it.
  let status = after.status
  while (status === 200 && Date.now() < endAt + 30_000) {
    await sleep(200)
    status = (await restInfo(orphan)).status
  }
  obs.orphan_gone_ms_after_end_at = Date.now() - endAt
  same(obs, 'orphan_after_lifetime', status, 404)
  expect(obs.orphan_gone_ms_after_end_at >= -CLOCK_SKEW_MS, `the orphan was gone ${-obs.orphan_gone_ms_after_end_at} ms before its lifetime ended`)
  ctx.killed.add(orphan)
})

// Runs in the sandbox (as root): which of the secrets, given masked, are in any process's environment or
// arguments or in a file changed since the sandbox was created.
const SCAN = readFileSync(new URL('./credential_scan.py', import.meta.url), 'utf8')
const CLOCK_MARGIN_S = 600 // between this host's idea of the create and the sandbox's clock

step('co09_no_credentials_inside', async (ctx, obs) => {
  const computer = shared(ctx)
  const secrets = [process.env.E2B_API_KEY, computer.sandbox.envdAccessToken].filter(Boolean)
  obs.secrets_checked = ['api key', 'envd access token'].slice(0, secrets.length)
  expect(secrets.length === 2, 'the run has no API key or the sandbox no envd access token to look for')
  const since = Date.parse((await restInfo(computer.sandboxId)).body?.startedAt) / 1000 - CLOCK_MARGIN_S
  const pad = randomBytes(Math.max(...secrets.map((s) => Buffer.byteLength(s))))
  const masked = secrets.map((s) => Buffer.from(Buffer.from(s).map((b, i) => b ^ pad[i])).toString('hex'))
  const scan = `echo ${Object.keys(SEEDS).join(' ')} | python3 -I -c ${quote(SCAN)} ${since} ${pad.toString('hex')} ${masked.join(' ')}`
  const [counts, ...lines] = (await root(computer, scan)).trim().split('\n')
  const [scanned, seedsSeen] = counts.split(' ').map(Number)
  obs.files_scanned = scanned
  same(obs, 'scan_saw_the_seeds', seedsSeen, 1)
  const where = lines.filter(Boolean).map((line) => `${obs.secrets_checked[Number(line.split(' ')[0])]} in ${line.split(' ').slice(1).join(' ')}`)
  same(obs, 'credentials_found', where, [])
})

process.exitCode = await main(SUITE)
