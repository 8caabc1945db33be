// The upstream suite's vitest configuration (the project's own; nothing of E2B's is copied): it runs the
// Node test projects of an E2B js-sdk source tree, unmodified, as E2B's own configuration defines them
// (`unit`, `template`, `connectionConfig`: their includes, timeouts, isolation and setup files), and none of
// its browser or Cloudflare projects (sandboxes/upstream/manifest.toml declares those tests with the reason).
// Vitest's root is the source's packages/js-sdk (E2B_BENCH_UPSTREAM_JS_SDK); the packages the source and its
// tests import come from this runner's environment (NODE_PATH), never from the source tree, through the
// `runner-packages` plugin below. No imports: this file is read from the project, which has no node_modules.
import { delimiter, isAbsolute, join } from 'node:path'

const sdk = process.env.E2B_BENCH_UPSTREAM_JS_SDK
const packages = (process.env.NODE_PATH || '').split(delimiter).filter(Boolean)[0]
if (!sdk || !packages) throw new Error('vitest.config.mjs: E2B_BENCH_UPSTREAM_JS_SDK and NODE_PATH must be set')
const anchor = join(packages, '..', 'package.json') // bare imports resolve as if made from the environment

/** Bare imports of the source tree's files resolve in this runner's environment. */
function runnerPackages() {
  return {
    name: 'runner-packages',
    enforce: 'pre',
    async resolveId(id, importer, options) {
      if (!importer || id.startsWith('.') || isAbsolute(id) || id.startsWith('\0') || id.startsWith('node:')) return null
      if (id.startsWith('/@') || id.startsWith('virtual:') || id.includes(':')) return null
      if (!importer.startsWith(sdk)) return null
      return this.resolve(id, anchor, { ...options, skipSelf: true })
    },
  }
}

const node = { globals: false, environment: 'node' }
export default {
  root: sdk,
  plugins: [runnerPackages()],
  cacheDir: process.env.E2B_BENCH_VITE_CACHE, // never inside the source tree
  test: {
    watch: false,
    projects: [
      {
        plugins: [runnerPackages()],
        test: {
          ...node,
          name: 'unit',
          include: ['tests/**/*.test.ts'],
          exclude: ['tests/runtimes/**', 'tests/template/**', 'tests/connectionConfig.test.ts'],
          isolate: true,
          testTimeout: 30_000,
          bail: 0,
          setupFiles: ['tests/globalFetchFallback.setup.ts'],
          deps: { interopDefault: true },
          env: { ...process.env },
        },
      },
      {
        plugins: [runnerPackages()],
        test: {
          ...node,
          name: 'template',
          include: ['tests/template/**/*.test.ts'],
          testTimeout: 180_000,
          setupFiles: ['tests/globalFetchFallback.setup.ts'],
        },
      },
      {
        plugins: [runnerPackages()],
        test: { ...node, name: 'connectionConfig', include: ['tests/connectionConfig.test.ts'], isolate: true, testTimeout: 10_000 },
      },
    ],
  },
}
