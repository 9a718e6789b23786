// Shared by the node tests: the bound package, the model files, the reference vectors.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, "..", "..");
// pkg/node is CommonJS (wasm-bindgen --target nodejs).
export const ruri = createRequire(import.meta.url)(join(here, "..", "pkg", "node", "ruri_wasm.js"));

// The 30m-shape model (`tools/testdata/generate.sh 30m`) and Python's reference for it.
export const modelDir =
  process.env.RURI_WASM_MODEL ?? join(repo, "testdata", "generated", "ruri-v3-30m-shape");
export const referencePath =
  process.env.RURI_WASM_REFERENCE ??
  join(repo, "testdata", "generated", "reference", "ruri-v3-30m-shape.json");

export function modelFiles(dir = modelDir) {
  return {
    config: readFileSync(join(dir, "config.json"), "utf8"),
    tokenizer: readFileSync(join(dir, "tokenizer.json"), "utf8"),
    weights: readFileSync(join(dir, "model.safetensors")), // a Buffer is a Uint8Array
  };
}

export function cosine(a, b) {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return ab / Math.sqrt(aa * bb);
}

export function maxAbsDiff(a, b) {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}
