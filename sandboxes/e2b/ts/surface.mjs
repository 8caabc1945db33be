// The public API of the npm SDK under test, for the coverage table: every public method of `Sandbox`
// (static and instance) and of its `commands`, `files` and `pty` members, printed as one JSON list of
// names such as "Sandbox.commands.run". Members TypeScript declares private or protected are left out.
// No network: the sandbox object is built locally, never connected.

import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { delimiter, dirname, join } from 'node:path'

import { loadSdk } from './driver.mjs'

const { sdk } = await loadSdk()
const { Sandbox } = sdk
const typings = (() => {
  try {
    const roots = (process.env.NODE_PATH || '').split(delimiter).filter(Boolean).map((p) => (p.endsWith('node_modules') ? dirname(p) : p))
    const entry = createRequire(import.meta.url).resolve('e2b', { paths: roots.length ? roots : [dirname(new URL(import.meta.url).pathname)] })
    return readFileSync(join(dirname(entry), 'index.d.ts'), 'utf8')
  } catch {
    return ''
  }
})()
const hidden = new Set([...typings.matchAll(/^\s+(?:private|protected)\s+(?:static\s+)?(?:readonly\s+)?(\w+)/gm)].map((m) => m[1]))

function methods(object) {
  const names = new Set()
  for (let proto = object; proto && proto !== Object.prototype && proto !== Function.prototype; proto = Object.getPrototypeOf(proto)) {
    for (const name of Object.getOwnPropertyNames(proto)) {
      const descriptor = Object.getOwnPropertyDescriptor(proto, name)
      if (name === 'constructor' || name.startsWith('_') || hidden.has(name)) continue
      if (descriptor && typeof descriptor.value === 'function') names.add(name)
    }
  }
  return [...names]
}

const sandbox = new Sandbox({ sandboxId: 'surface-probe', envdVersion: '0.5.0', envdAccessToken: 'x', sandboxDomain: 'e2b.app', apiKey: 'e2b_surface' })
const names = new Set([...methods(Sandbox), ...methods(Sandbox.prototype)].map((name) => `Sandbox.${name}`))
for (const member of ['commands', 'files', 'pty']) {
  for (const name of methods(Object.getPrototypeOf(sandbox[member]))) names.add(`Sandbox.${member}.${name}`)
}
process.stdout.write(`${JSON.stringify([...names].sort())}\n`)
