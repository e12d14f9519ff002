// BullMQ side of bench/peers.py: `node peer.js enqueue N [single]` prints {"seconds": …};
// `node peer.js work CONCURRENCY` runs a worker until SIGTERM. BENCH_PRIORITY (bench/memory.py)
// gives the enqueued jobs that priority (BullMQ keeps such jobs in a sorted set, not a list).
const { Queue, Worker } = require("bullmq");
const url = new URL(process.env.BENCH_URL || "redis://127.0.0.1:6399/0");
const connection = { host: url.hostname, port: Number(url.port) };
const [mode, arg] = process.argv.slice(2);

async function main() {
  if (mode === "enqueue") {
    const queue = new Queue("bench", { connection });
    await queue.waitUntilReady();
    const n = Number(arg);
    const single = process.argv[4] === "single";
    const opts = { removeOnComplete: true };
    if (Number(process.env.BENCH_PRIORITY || 0) > 0) opts.priority = Number(process.env.BENCH_PRIORITY);
    const started = process.hrtime.bigint();
    if (single) {
      for (let i = 0; i < n; i++) await queue.add("tick", {}, { ...opts });
    } else {
      for (let i = 0; i < n; i += 1000) {
        const batch = [];
        for (let j = i; j < Math.min(n, i + 1000); j++) batch.push({ name: "tick", data: {}, opts: { ...opts } });
        await queue.addBulk(batch);
      }
    }
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    console.log(JSON.stringify({ seconds }));
    await queue.close();
  } else {
    const IORedis = require("ioredis");
    const counter = new IORedis(connection);
    const worker = new Worker("bench", async () => { await counter.incr("bench:done"); },
      { connection, concurrency: Number(arg) });
    process.on("SIGTERM", async () => { await worker.close(); process.exit(0); });
  }
}
main();
