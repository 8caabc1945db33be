// A client of the agent computer that is about to crash (step co08_release of computer.mjs): it opens a computer
// with a short lifetime, prints its sandbox id, start and end (JSON) and waits to be killed, so nothing closes the sandbox.
// Arguments: the lifetime in ms and the run's sandbox metadata as JSON.

import { AgentComputer } from './agent_computer.mjs'
import { loadSdk } from './driver.mjs'

const [lifetimeMs, metadata] = process.argv.slice(2)
const { sdk } = await loadSdk()
const computer = await AgentComputer.open(sdk, { timeoutMs: Number(lifetimeMs), metadata: JSON.parse(metadata) })
const { startedAt, endAt } = await sdk.Sandbox.getInfo(computer.sandboxId)
process.stdout.write(`${JSON.stringify({ sandboxId: computer.sandboxId, startedAt, endAt })}\n`)
setInterval(() => {}, 1 << 30)
