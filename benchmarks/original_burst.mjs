// A burst of K checkpoints of one session in the original TypeScript harness, on its JSONL
// backend, measured as benchmarks/original.py measures this library's (see there).
//
//   node original_burst.mjs --checkout DIR --dir DIR [--k 32] [--rounds 50] [--warmup 5]
//
// DIR is a checkout of the original whose session packages are built (lib/index.js of
// vendor/cordis, packages/core/session and packages/session/session-persistence-jsonl). Prints
// one JSON object: for each format, per measured round, the burst's wall and CPU microseconds,
// the raw write + fsync's, and the bytes the burst wrote.

import fs from 'node:fs'
import { join, resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'

const { values: args } = parseArgs({
  options: {
    checkout: { type: 'string' },
    dir: { type: 'string' },
    k: { type: 'string', default: '32' },
    rounds: { type: 'string', default: '50' },
    warmup: { type: 'string', default: '5' },
  },
})
if (!args.checkout || !args.dir) {
  console.error('usage: node original_burst.mjs --checkout DIR --dir DIR [--k K] [--rounds R] [--warmup W]')
  process.exit(2)
}
const checkout = resolve(args.checkout)
const K = Number(args.k)
const ROUNDS = Number(args.rounds)
const WARMUP = Number(args.warmup)

const load = (path) => import(pathToFileURL(join(checkout, path)).href)
const { Context } = await load('vendor/cordis/lib/index.js')
const { default: SessionStore, SessionId } = await load('packages/core/session/lib/index.js')
const { default: JsonlSessionPersistence } = await load(
  'packages/session/session-persistence-jsonl/lib/index.js',
)

const now = () => process.hrtime.bigint()
const cpu = (since) => {
  const used = process.cpuUsage(since)
  return used.user + used.system
}

async function bursts(compression) {
  const root = fs.mkdtempSync(join(args.dir, `original-${compression}-`))
  const ctx = new Context()
  await ctx.plugin(SessionStore)
  const fiber = await ctx.plugin(JsonlSessionPersistence, { root, compression })
  const session = ctx.sessions.create(SessionId(`burst-${compression}`), { meta: { cwd: root } })
  session.append('turn/start', { turn: 1 })
  await ctx.sessions.flush(session)
  const log = ctx.sessionPersistence.locate(session.header).path
  const raw = fs.openSync(join(log, '..', 'raw.bin'), 'a')
  const rawWrite = (bytes) => {
    const buffer = Buffer.alloc(bytes, 0x61)
    const since = process.cpuUsage()
    const start = now()
    fs.writeSync(raw, buffer)
    fs.fsyncSync(raw)
    return { wall: Number(now() - start) / 1000, cpu: cpu(since) }
  }

  const rounds = []
  let step = 0
  let bytes = 0
  for (let round = 0; round < WARMUP + ROUNDS; round++) {
    for (let i = 0; i < K; i++) {
      step++
      session.append('tool/call', { turn: 1, step, callId: `call-${step}`, name: 'lookup', arguments: '{}' })
    }
    const before = fs.statSync(log).size
    let release
    const gate = new Promise((resolve) => { release = resolve })
    let last = 0n
    const tasks = Array.from({ length: K }, async () => {
      await gate
      await ctx.sessions.flush(session)  // what the checkpoint policy awaits before a tool
      const end = now()
      if (end > last) last = end
    })
    await new Promise((resolve) => setImmediate(resolve))  // every task waits at the gate
    const rawFirst = round % 2 === 1 && bytes > 0
    const baseline = rawFirst ? rawWrite(bytes) : undefined
    const since = process.cpuUsage()
    const start = now()
    release()
    await Promise.all(tasks)
    const burst = { wall: Number(last - start) / 1000, cpu: cpu(since) }
    bytes = fs.statSync(log).size - before
    const measured = { burst, raw: baseline ?? rawWrite(bytes), bytes }
    if (round >= WARMUP) rounds.push(measured)
  }
  fs.closeSync(raw)
  await fiber.dispose()
  fs.rmSync(root, { recursive: true, force: true })
  return rounds
}

console.log(JSON.stringify({
  node: process.version,
  k: K,
  plain: await bursts('none'),
  zstd: await bursts('zstd'),
}))
