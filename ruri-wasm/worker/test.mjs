// The example Worker under workerd, offline, on the 30m-shape model: its vectors equal the
// native x86 int8 engine's (RURI_WASM_X86, from the wasm_reference example), 200 requests in a
// row then 50 concurrent without an error, OpenAI's shape and error shape; and the figures:
// load (the first request: instantiate, Embedder, first vector, answered), per-request latency, the isolate's linear memory
// (GET /stats) and workerd's resident memory (VmRSS/VmHWM, which also counts the runtime and
// the weights it streamed). Run: `node test.mjs` after tools/wasm/build.sh and `npm install`.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "..", "..");
const modelDir = process.env.RURI_WASM_MODEL ?? join(repo, "testdata", "generated", "ruri-v3-30m-shape");
const reference = JSON.parse(readFileSync(process.env.RURI_WASM_REFERENCE ?? join(repo, "testdata", "generated", "reference", "ruri-v3-30m-shape.json"), "utf8"));
if (!process.env.RURI_WASM_X86) throw new Error("set RURI_WASM_X86 to the output of the wasm_reference example");
const x86 = new Map(JSON.parse(readFileSync(process.env.RURI_WASM_X86, "utf8")).items.map((i) => [i.id, i.vector]));
// The workload's queries (tools/bench/make_workload.py) when generated, else the reference texts
// (CI runs on the committed tiny model without the workload).
const workload = join(repo, "testdata", "generated", "bench", "queries.jsonl");
const queries = existsSync(workload)
  ? readFileSync(workload, "utf8").trim().split("\n").map((l) => JSON.parse(l).text)
  : reference.items.filter((i) => !i.truncated && i.text.length > 0).map((i) => i.text);
// 50 concurrent requests below: repeat the texts up to 50.
for (let i = 0; queries.length < 50; i++) queries.push(queries[i]);
const port = Number(process.env.RURI_WASM_PORT ?? 8790);

// Stage the Worker: its module, the bound package (web target) and the model, side by side.
const stage = mkdtempSync(join(tmpdir(), "ruri-worker-"));
mkdirSync(join(stage, "model"));
symlinkSync(join(here, "src", "worker.js"), join(stage, "worker.js"));
for (const f of ["ruri_wasm.js", "ruri_wasm_bg.wasm"]) symlinkSync(join(here, "..", "pkg", "web", f), join(stage, f));
for (const f of ["config.json", "tokenizer.json", "sentence_bert_config.json"]) symlinkSync(resolve(modelDir, f), join(stage, "model", f));
writeFileSync(join(stage, "config.capnp"), `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    # model.safetensors over HTTP, which the Worker streams (as it would an R2 object).
    (name = "weights", disk = (path = "${resolve(modelDir)}", writable = false)),
  ],
  sockets = [(name = "http", address = "127.0.0.1:${port}", http = (), service = "main")],
);
const worker :Workerd.Worker = (
  modules = [
    (name = "worker.js", esModule = embed "worker.js"),
    (name = "ruri_wasm.js", esModule = embed "ruri_wasm.js"),
    (name = "ruri_wasm_bg.wasm", wasm = embed "ruri_wasm_bg.wasm"),
    (name = "model/config.json", text = embed "model/config.json"),
    (name = "model/tokenizer.json", text = embed "model/tokenizer.json"),
    (name = "model/sentence_bert_config.json", text = embed "model/sentence_bert_config.json"),
  ],
  compatibilityDate = "2025-01-01",
  bindings = [(name = "WEIGHTS", service = "weights")],
);
`);

const MB = 1024 * 1024;
const started = performance.now();
const workerd = spawn(join(here, "node_modules", ".bin", "workerd"), ["serve", join(stage, "config.capnp")], { stdio: ["ignore", "inherit", "inherit"] });
const vm = () => {
  const status = readFileSync(`/proc/${workerd.pid}/status`, "utf8");
  const kb = (k) => Number(status.match(new RegExp(`${k}:\\s+(\\d+)`))[1]) / 1024;
  return { rss: kb("VmRSS"), hwm: kb("VmHWM") };
};
const url = `http://127.0.0.1:${port}`;
const post = async (body) => {
  const r = await fetch(`${url}/v1/embeddings`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
};

try {
  // Up: the socket answers (the model loads on the first request, below).
  let up = false;
  for (let i = 0; i < 300 && !up; i++) {
    try { await fetch(`${url}/health`).catch(() => { throw 0; }); up = true; } catch { await new Promise((r) => setTimeout(r, 50)); }
  }
  assert.ok(up, "workerd did not start");
  const rssBeforeLoad = vm();
  const t = performance.now();
  const first = await post({ input: "瑠璃色はどんな色？", prompt_name: "query" });
  const firstMs = performance.now() - t;
  assert.equal(first.status, 200, JSON.stringify(first.json));
  const afterLoad = { ...vm(), wasm: (await (await fetch(`${url}/stats`)).json()).wasm_memory_bytes / MB };

  // Vectors: each reference text alone, against the x86 engine.
  let worst = 0;
  for (const item of reference.items) {
    // A text sentence-transformers truncated is sent with `truncate` (the Worker refuses
    // over-long inputs by default).
    const { status, json } = await post({ input: item.text, prompt_name: item.prompt_name, model: "ruri", truncate: item.truncated });
    assert.equal(status, 200, JSON.stringify(json));
    assert.equal(json.object, "list");
    assert.equal(json.data[0].object, "embedding");
    assert.ok(json.usage.prompt_tokens >= 2);
    const want = x86.get(item.id);
    for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(json.data[0].embedding[i] - want[i]));
  }
  assert.ok(worst <= 1e-6, `max |Δ| ${worst}`);
  // base64 carries the same f32 bytes; a batch keeps its order.
  const b64 = await post({ input: [reference.items[0].text, reference.items[1].text], prompt_name: reference.items[0].prompt_name, encoding_format: "base64" });
  const f32 = new Float32Array(Uint8Array.from(atob(b64.json.data[0].embedding), (c) => c.charCodeAt(0)).buffer);
  assert.deepStrictEqual(Array.from(f32), x86.get(reference.items[0].id).map(Math.fround));
  assert.equal(b64.json.data[1].index, 1);
  // Errors in OpenAI's shape.
  const bad = await post({ input: [] });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, "input");
  const long = "日本の首都は東京です。".repeat(1000);
  const tooLong = await post({ input: long });
  assert.equal(tooLong.status, 400);
  // The Worker's limit: the folder's max_seq_length, capped at 2,048 tokens.
  const limit = Math.min(JSON.parse(readFileSync(join(modelDir, "sentence_bert_config.json"), "utf8")).max_seq_length, 2048);
  assert.match(tooLong.json.error.message, new RegExp(`more than the model.s maximum of ${limit}\\b`));
  assert.equal((await post({ input: long, truncate: true })).status, 200);
  const badTask = await post({ input: "x", prompt_name: "poem" });
  assert.equal(badTask.status, 400);
  assert.match(badTask.json.error.message, /task/);

  // 200 requests in a row, then 50 concurrent.
  const times = [];
  for (let i = 0; i < 200; i++) {
    const s = performance.now();
    const r = await post({ input: queries[i % queries.length], prompt_name: "query" });
    times.push(performance.now() - s);
    assert.equal(r.status, 200);
  }
  const s = performance.now();
  const all = await Promise.all(queries.slice(0, 50).map((q) => post({ input: q, prompt_name: "query" })));
  const concurrentS = (performance.now() - s) / 1e3;
  assert.ok(all.every((r) => r.status === 200 && r.json.data[0].embedding.length === reference.dim));
  const end = { ...vm(), wasm: (await (await fetch(`${url}/stats`)).json()).wasm_memory_bytes / MB };
  times.sort((a, b) => a - b);
  const at = (p) => times[Math.round((times.length - 1) * p)];
  const report = {
    workerd_rss_mb: { before_load: rssBeforeLoad.rss, after_load: afterLoad.rss, end: end.rss, peak: end.hwm },
    wasm_memory_mb: { after_load: afterLoad.wasm, end: end.wasm },
    first_request_ms: firstMs,
    request_ms: { p50: at(0.5), p99: at(0.99), runs: times.length },
    concurrent_50_texts_per_s: 50 / concurrentS,
    max_abs_diff_vs_x86: worst,
  };
  console.log(`workerd: first request (load + first vector) ${firstMs.toFixed(0)} ms; request p50 ${at(0.5).toFixed(2)} ms, p99 ${at(0.99).toFixed(2)} ms; 50 concurrent: ${(50 / concurrentS).toFixed(1)} texts/s`);
  console.log(`workerd: linear memory ${afterLoad.wasm.toFixed(1)} MiB after load, ${end.wasm.toFixed(1)} MiB at the end; process RSS ${rssBeforeLoad.rss.toFixed(0)} → ${afterLoad.rss.toFixed(0)} → ${end.rss.toFixed(0)} MiB, peak ${end.hwm.toFixed(0)} MiB`);
  console.log(`workerd: vectors vs x86 native int8: max |Δ| ${worst}`);
  console.log(JSON.stringify(report));
  console.log("ok: worker test passed");
} finally {
  workerd.kill();
  rmSync(stage, { recursive: true, force: true });
}
