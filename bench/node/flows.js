// BullMQ side of bench/flows.py: `node flows.js MEMBERS ROUNDS CONCURRENCY` runs ROUNDS flows
// (FlowProducer: a parent with MEMBERS children) through in-process workers and prints
// {"rounds": [{"seconds": enqueue → parent started, "gap_ms": last child finished → parent started}]}.
// Children return when they finished (ms); the parent reads them with getChildrenValues().
const { FlowProducer, Worker } = require("bullmq");
const url = new URL(process.env.BENCH_URL || "redis://127.0.0.1:6399/0");
const connection = { host: url.hostname, port: Number(url.port) };
const [members, rounds, concurrency] = process.argv.slice(2).map(Number);

async function main() {
  let done = null;
  const kids = new Worker("flowkids", async () => Date.now(), { connection, concurrency });
  const parent = new Worker("flowparent", async (job) => {
    const started = Date.now();
    const finished = Object.values(await job.getChildrenValues());
    done({ started, gap_ms: started - Math.max(...finished), n: finished.length });
  }, { connection, concurrency: 1 });
  await Promise.all([kids.waitUntilReady(), parent.waitUntilReady()]);
  const flow = new FlowProducer({ connection });
  const out = [];
  for (let r = 0; r < rounds; r++) {
    const finished = new Promise((resolve) => { done = resolve; });
    const children = [];
    for (let i = 0; i < members; i++) {
      children.push({ name: "member", queueName: "flowkids", data: { i }, opts: { removeOnComplete: true } });
    }
    const t0 = Date.now();
    await flow.add({ name: "callback", queueName: "flowparent", children, opts: { removeOnComplete: true } });
    const got = await finished;
    out.push({ seconds: (got.started - t0) / 1000, gap_ms: got.gap_ms, n: got.n });
  }
  console.log(JSON.stringify({ rounds: out }));
  await Promise.all([kids.close(), parent.close(), flow.close()]);
  process.exit(0);
}
main();
