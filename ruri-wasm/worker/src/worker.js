// An example Cloudflare Worker: ruri-v3 embeddings in the isolate, `POST /v1/embeddings` in
// OpenAI's shape (as ruri-server: `input` a string or an array of strings, `model` ignored,
// `encoding_format` "float" or "base64", `dimensions`; extensions `prompt_name` ("query",
// "document", "topic", "") and `truncate`), plus `GET /stats` (linear memory, kernel) and
// `GET /health` (answers without loading the model).
//
// The model is loaded once per isolate, on the first request. Its text files are modules
// of the Worker; model.safetensors (147 MB for the 30m shape, over every Workers bundle
// limit) is streamed from the `WEIGHTS` binding, a Fetcher (a service binding: under workerd
// a disk service, test.mjs's config.capnp), into an EmbedderLoader that prepares each
// tensor as its bytes arrive: the file is never held whole, in the JS heap or in linear
// memory. In production bind an R2 bucket instead and stream its object's body the same way
// (`(await env.MODEL.get("model.safetensors")).body`).
import { initSync, EmbedderLoader, wasmMemoryBytes } from "./ruri_wasm.js";
import wasmModule from "./ruri_wasm_bg.wasm";
import configJson from "./model/config.json";
import tokenizerJson from "./model/tokenizer.json";
import sentenceBertConfig from "./model/sentence_bert_config.json";

let embedder = null;
let loading = null;
const MODEL_NAME = "ruri-v3-30m";
// Linear memory never shrinks, and the engine's scratch grows with the longest text it has
// seen (30m shape: +0 MiB up to 512 tokens, +3 at 1,024, +13 at 2,048, +78 at 8,192), so a
// Worker caps the length (longer inputs: 400, or truncated with `"truncate": true`).
const MAX_TOKENS = 2048;
// The model folder's limit (sentence_bert_config.json's max_seq_length, where
// sentence-transformers and the x86 engine truncate), capped at MAX_TOKENS.
const MAX_LENGTH = Math.min(JSON.parse(sentenceBertConfig).max_seq_length ?? MAX_TOKENS, MAX_TOKENS);

// Reads `body` into `loader` through one reused 1 MiB buffer (a BYOB reader), so that the
// load leaves no chunk of the file behind for the garbage collector to count; a body
// without BYOB support is read chunk by chunk.
async function pushAll(body, loader) {
  let reader;
  try {
    reader = body.getReader({ mode: "byob" });
  } catch {
    for await (const chunk of body) loader.push(chunk);
    return;
  }
  let buffer = new ArrayBuffer(1 << 20);
  for (;;) {
    const { value, done } = await reader.read(new Uint8Array(buffer));
    if (done) return;
    loader.push(value);
    buffer = value.buffer;
  }
}

async function load(env) {
  initSync({ module: wasmModule });
  const loader = new EmbedderLoader(configJson, tokenizerJson, { maxLength: MAX_LENGTH });
  try {
    const response = await env.WEIGHTS.fetch("http://weights/model.safetensors");
    if (!response.ok) throw new Error(`model.safetensors: HTTP ${response.status}`);
    await pushAll(response.body, loader);
    const e = loader.finish();
    e.embedQuery(""); // the first vector is part of the load
    return e;
  } finally {
    loader.free();
  }
}

function error(status, message, type, param = null) {
  return Response.json({ error: { message, type, param, code: null } }, { status });
}

function base64(vector) {
  const bytes = new Uint8Array(vector.buffer, vector.byteOffset, vector.byteLength);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

async function embeddings(request) {
  let body;
  try {
    body = await request.json();
  } catch {
    return error(400, "the body is not JSON", "invalid_request_error");
  }
  const input = typeof body?.input === "string" ? [body.input] : body?.input;
  if (!Array.isArray(input) || input.length === 0 || !input.every((t) => typeof t === "string")) {
    return error(400, "`input` must be a string or a non-empty array of strings", "invalid_request_error", "input");
  }
  const format = body.encoding_format ?? "float";
  if (format !== "float" && format !== "base64") {
    return error(400, "`encoding_format` must be \"float\" or \"base64\"", "invalid_request_error", "encoding_format");
  }
  const dims = body.dimensions;
  if (dims !== undefined && !(Number.isInteger(dims) && dims >= 1 && dims <= embedder.dim)) {
    return error(400, `\`dimensions\` must be a whole number from 1 to ${embedder.dim}`, "invalid_request_error", "dimensions");
  }
  let out;
  try {
    out = embedder.embedRequest(input, body.prompt_name ?? "", body.truncate === true);
  } catch (e) {
    const client = e.kind === "InputTooLong" || e.kind === "InvalidOption" || e.kind === "Tokenizer";
    return error(client ? 400 : 500, e.message, client ? "invalid_request_error" : "server_error");
  }
  const data = out.vectors.map((v, index) => {
    if (dims !== undefined && dims < v.length) {
      // Cut, then normalize again (as ruri-server and OpenAI's `dimensions`).
      v = v.slice(0, dims);
      let n = 0;
      for (const x of v) n += x * x;
      n = Math.sqrt(n);
      if (n > 0) for (let i = 0; i < v.length; i++) v[i] /= n;
    }
    return { object: "embedding", index, embedding: format === "base64" ? base64(v) : Array.from(v) };
  });
  return Response.json({
    object: "list",
    data,
    model: MODEL_NAME,
    usage: { prompt_tokens: out.tokens, total_tokens: out.tokens },
  });
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    if (url.pathname === "/health") return new Response("ok"); // answers before the model loads
    if (embedder === null) {
      // Requests that arrive while the model streams in wait for the same load.
      loading ??= load(env);
      try {
        embedder = await loading;
      } catch (e) {
        loading = null;
        return error(500, `loading the model failed: ${e.message}`, "server_error");
      }
    }
    if (url.pathname === "/v1/embeddings") {
      return request.method === "POST" ? embeddings(request) : error(405, "use POST", "invalid_request_error");
    }
    if (url.pathname === "/stats") {
      return Response.json({ wasm_memory_bytes: wasmMemoryBytes(), kernel: embedder.kernel });
    }
    return error(404, `no route ${url.pathname}`, "invalid_request_error");
  },
};
