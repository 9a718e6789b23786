// Figures for BENCHMARKS.md under node (reports; the tests assert): .wasm size, load time
// (instantiate → first vector, the weights streamed from the file), memory (JS heap +
// ArrayBuffers + wasm linear memory) after load, at peak and at the end of 200 queries + 50 more, single-query p50/p99 on the benchmark
// workload's 200 queries, and documents/s on its first 512 documents. Run with
// `node --expose-gc tests/bench.mjs` (tools/wasm/test.sh does); the x86 figures of the same
// run come from the wasm_reference example (RURI_WASM_X86). RURI_WASM_ATTENTION sets the
// `attention` option.
import { createRequire } from "node:module";
import { closeSync, openSync, readFileSync, readSync, statSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { join } from "node:path";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { performance } from "node:perf_hooks";

// Not common.mjs: importing it would instantiate the module before the clock starts.
const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const modelDir = process.env.RURI_WASM_MODEL ?? join(repo, "testdata", "generated", "ruri-v3-30m-shape");

const pkg = join(repo, "ruri-wasm", "pkg", "node");
const workload = process.env.RURI_WASM_WORKLOAD ?? join(repo, "testdata", "generated", "bench");
const lines = (f) => readFileSync(join(workload, f), "utf8").trim().split("\n").map((l) => JSON.parse(l).text);
const queries = lines("queries.jsonl");
const documents = lines("documents.jsonl").slice(0, 512);
const config = readFileSync(join(modelDir, "config.json"), "utf8");
const tokenizer = readFileSync(join(modelDir, "tokenizer.json"), "utf8");
// The weights are streamed from the file in 1 MiB chunks into an EmbedderLoader, as the
// example Worker streams its fetch body: neither side holds the file whole. RURI_WASM_WEIGHTS
// names another file (ruri's int8 file, `ruri quantize`'s `model.ruri-int8.safetensors`).
const weightsPath = process.env.RURI_WASM_WEIGHTS ?? join(modelDir, "model.safetensors");

const MB = 1024 * 1024;
let ruri;
function memory() {
  const m = process.memoryUsage();
  const wasm = ruri ? ruri.wasmMemoryBytes() : 0;
  return { heap: m.heapUsed / MB, arrayBuffers: m.arrayBuffers / MB, wasm: wasm / MB, total: (m.heapUsed + m.arrayBuffers + wasm) / MB };
}
// A full collection after the current task, so that dropped buffers are really gone.
// (Two rounds: V8 frees an ArrayBuffer's backing store only after a later collection.)
const gc = async () => {
  for (let i = 0; i < 2; i++) {
    await new Promise((r) => setTimeout(r, 20));
    if (globalThis.gc) globalThis.gc();
  }
};
const fmt = (m) => `JS heap ${m.heap.toFixed(1)} + ArrayBuffers ${m.arrayBuffers.toFixed(1)} + wasm ${m.wasm.toFixed(1)} = ${m.total.toFixed(1)} MiB`;

await gc();
const before = memory();
const t0 = performance.now();
ruri = createRequire(import.meta.url)(join(pkg, "ruri_wasm.js")); // compiles + instantiates
const t1 = performance.now();
// RURI_WASM_ATTENTION: the `attention` option (when unset, ruri-wasm's default: int13 at int8).
const attention = process.env.RURI_WASM_ATTENTION;
const loader = new ruri.EmbedderLoader(config, tokenizer, attention ? { attention } : undefined);
const tTokenizer = performance.now();
let duringLoad = memory();
// One reused 1 MiB buffer (as the Worker's BYOB reader): a fresh buffer per chunk
// (`createReadStream`) leaves up to 35 MiB of read chunks to the garbage collector during the
// load (measured 2026-12-01).
const chunk = new Uint8Array(1 << 20);
const fd = openSync(weightsPath, "r");
for (let n; (n = readSync(fd, chunk, 0, chunk.length, null)) > 0; ) {
  loader.push(chunk.subarray(0, n));
  const m = memory();
  if (m.total > duringLoad.total) duringLoad = m;
}
closeSync(fd);
const embedder = loader.finish();
loader.free();
const t2 = performance.now();
embedder.embedQuery(queries[0]);
const t3 = performance.now();
await gc();
const afterLoad = memory();

let peak = Math.max(duringLoad.total, afterLoad.total);
const times = [];
for (const q of queries) {
  const s = performance.now();
  embedder.embedQuery(q);
  times.push(performance.now() - s);
  peak = Math.max(peak, memory().total);
}
for (const q of queries.slice(0, 50)) {
  embedder.embedQuery(q);
  peak = Math.max(peak, memory().total);
}
const s = performance.now();
embedder.embedDocuments(documents);
const docsPerS = documents.length / ((performance.now() - s) / 1e3);
peak = Math.max(peak, memory().total);
await gc();
const end = memory();
times.sort((a, b) => a - b);
const at = (p) => times[Math.round((times.length - 1) * p)];

const wasmBytes = readFileSync(join(pkg, "ruri_wasm_bg.wasm"));
const report = {
  attention: embedder.attention,
  weights_file: weightsPath,
  weights_bytes: statSync(weightsPath).size,
  wasm_bytes: wasmBytes.length,
  wasm_gzip_bytes: gzipSync(wasmBytes, { level: 9 }).length,
  bundle_gzip_bytes: gzipSync(Buffer.concat([wasmBytes, readFileSync(join(pkg, "ruri_wasm.js")), Buffer.from(tokenizer)]), { level: 9 }).length,
  load_ms: { instantiate: t1 - t0, tokenizer: tTokenizer - t1, weights: t2 - tTokenizer, embedder: t2 - t1, first_vector: t3 - t2, total: t3 - t0 },
  memory_mb: { before, during_load: duringLoad, after_load: afterLoad, peak_total: peak, end },
  query_ms: { p50: at(0.5), p99: at(0.99), runs: times.length },
  documents_per_s: docsPerS,
};
if (process.env.RURI_WASM_X86) {
  const x86 = JSON.parse(readFileSync(process.env.RURI_WASM_X86, "utf8"));
  report.x86 = { kernel: x86.kernel, query_ms: x86.query_ms, documents_per_s: x86.documents_per_s };
  if (x86.query_ms) report.p50_vs_x86 = report.query_ms.p50 / x86.query_ms.p50;
}
console.log(`.wasm ${(report.wasm_bytes / MB).toFixed(2)} MiB, gzipped ${(report.wasm_gzip_bytes / MB).toFixed(2)} MiB; code + tokenizer gzipped ${(report.bundle_gzip_bytes / MB).toFixed(2)} MiB`);
console.log(`load: instantiate ${report.load_ms.instantiate.toFixed(0)} ms, Embedder ${report.load_ms.embedder.toFixed(0)} ms (tokenizer ${report.load_ms.tokenizer.toFixed(0)}, weights streamed ${report.load_ms.weights.toFixed(0)}), first vector ${report.load_ms.first_vector.toFixed(1)} ms; total ${report.load_ms.total.toFixed(0)} ms`);
console.log(`memory during load (its highest sample): ${fmt(duringLoad)}`);
console.log(`memory after load:  ${fmt(afterLoad)}`);
console.log(`memory peak (load included): ${peak.toFixed(1)} MiB; end: ${fmt(end)}`);
console.log(`query p50 ${report.query_ms.p50.toFixed(3)} ms, p99 ${report.query_ms.p99.toFixed(3)} ms; ${docsPerS.toFixed(1)} documents/s`);
if (report.p50_vs_x86) console.log(`x86 native (${report.x86.kernel}) query p50 ${report.x86.query_ms.p50.toFixed(3)} ms: wasm/x86 = ${report.p50_vs_x86.toFixed(2)}×; x86 ${report.x86.documents_per_s.toFixed(1)} documents/s`);
console.log(JSON.stringify(report));
