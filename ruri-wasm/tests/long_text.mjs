// One long text in WebAssembly under node, for BENCHMARKS.md: the time to embed one document
// of about TOKENS tokens (the model's maximum length, 8192 for Ruri v3, when the text is
// longer) with the attention precision ATTENTION (`f32`, `int13`, `bf16`), after a warm-up
// on a short text, and the module's linear memory after it. One measurement a process: run
// it in alternated rounds, as tools/wasm/long_text.sh does. Prints one JSON line.
//
//   node ruri-wasm/tests/long_text.mjs ATTENTION [TOKENS]
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { ruri, repo, modelFiles } from "./common.mjs";

const [attention, tokens = "8192"] = process.argv.slice(2);
if (!attention) throw new Error("usage: long_text.mjs ATTENTION [TOKENS]");
const workload = process.env.RURI_WASM_WORKLOAD ?? join(repo, "testdata", "generated", "bench");
const documents = readFileSync(join(workload, "documents.jsonl"), "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l).text);
// The text examples/compare.rs --long-text embeds: the workload's documents in turn, up to 4
// characters a token (2.7–3.5 on this workload: then truncated to the maximum length).
let text = "";
for (let i = 0; [...text].length < Number(tokens) * 4; i++) text += documents[i % documents.length];

const files = modelFiles();
const embedder = new ruri.Embedder(files.config, files.tokenizer, files.weights, { attention });
embedder.embedDocuments([documents[0]]);
const t = performance.now();
const [vector] = embedder.embedDocuments([text]);
const seconds = (performance.now() - t) / 1000;
if (!(vector.length > 0 && vector.every(Number.isFinite))) throw new Error("no finite vector");
// tools/bench/rounds.py's fields (tools/wasm/long_text.sh adds the round).
const system = `wasm ${attention} attention`;
console.log(JSON.stringify({ system, attention, tokens: Number(tokens), seconds, wasm_mib: ruri.wasmMemoryBytes() / 2 ** 20 }));
