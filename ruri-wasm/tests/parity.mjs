// The 30m-shape model in WebAssembly against the native engine on x86 and against Python:
// each reference text alone with its prompt. Needs `tools/testdata/generate.sh 30m` (the model
// and Python's reference) and the x86 vectors of `cargo run --release -p ruri-native
// --example wasm_reference` in RURI_WASM_X86 (tools/wasm/test.sh does both).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { ruri, modelFiles, referencePath, cosine, maxAbsDiff } from "./common.mjs";

// Same integer scheme and the same float steps in the same order: the int8 vector is expected
// bit for bit; 1e-6 is the stated bound.
const X86_MAX_ABS_DIFF = 1e-6;
// int8 against sentence-transformers fp32 on this model: ONNX Runtime's int8 agreement on it
// (`checks.ort_int8_vs_st_fp32_normalized.min_cosine` of the reference: 0.990). Measured
// here: 0.9921, the x86 native engine's value too since the bits are equal.
const INT8_MIN_COSINE = 0.99;

const reference = JSON.parse(readFileSync(referencePath, "utf8"));
const x86Path = process.env.RURI_WASM_X86;
if (!x86Path) throw new Error("set RURI_WASM_X86 to the output of the wasm_reference example");
const x86Report = JSON.parse(readFileSync(x86Path, "utf8"));
const byId = (items) => new Map(items.map((i) => [i.id, i.vector]));
const x86 = byId(x86Report.items);

const files = modelFiles();
// The model folder's sentence_bert_config.json limit, which the x86 engine (ModelDir) and
// sentence-transformers truncate at; the JavaScript API takes it as an option.
const maxLength = reference.max_seq_length;
const embedder = new ruri.Embedder(files.config, files.tokenizer, files.weights, { maxLength });

function alone(e, item) {
  return e.embed([item.text], item.prompt_name)[0];
}

test("the default kernel is simd128, the default attention int8's int13, and the vectors are 256 wide", () => {
  assert.equal(embedder.kernel, "simd128");
  assert.equal(embedder.attention, "int13");
  assert.equal(x86Report.attention_default, "int13");
  assert.equal(embedder.dim, reference.dim);
  const fp32 = new ruri.Embedder(files.config, files.tokenizer, files.weights, { maxLength, precision: "fp32" });
  assert.equal(fp32.attention, "f32");
  assert.equal(fp32.kernel, undefined);
  fp32.free();
});

test("every vector equals the native x86 int8 engine's", () => {
  let worst = 0, identical = 0;
  for (const item of reference.items) {
    const want = x86.get(item.id);
    assert.ok(want, `x86 vector for ${item.id}`);
    const got = alone(embedder, item);
    const d = maxAbsDiff(got, want);
    worst = Math.max(worst, d);
    if (got.every((v, i) => v === Math.fround(want[i]))) identical++;
    assert.ok(d <= X86_MAX_ABS_DIFF, `${item.id}: max |Δ| ${d}`);
  }
  console.log(`wasm vs x86 native int8: max |Δ| ${worst}, ${identical}/${reference.items.length} bit-identical`);
});

test("int8 stays within its bound of sentence-transformers fp32", () => {
  let min = 1;
  for (const item of reference.items) {
    const c = cosine(alone(embedder, item), item.st_fp32.normalized);
    min = Math.min(min, c);
    assert.ok(c >= INT8_MIN_COSINE, `${item.id}: cosine ${c}`);
  }
  console.log(`wasm int8 vs sentence-transformers fp32: min cosine ${min.toFixed(6)}`);
});

test("embedQuery and embedDocuments add the prompts and keep the order; a batch equals each alone", () => {
  const queries = reference.items.filter((i) => i.prompt_name === "query");
  const documents = reference.items.filter((i) => i.prompt_name === "document");
  assert.ok(queries.length > 0 && documents.length > 1);
  for (const q of queries) {
    const got = embedder.embedQuery(q.text);
    assert.ok(got instanceof Float32Array);
    assert.deepStrictEqual(Array.from(got), Array.from(alone(embedder, q)));
  }
  const batch = embedder.embedDocuments(documents.map((d) => d.text).reverse());
  assert.equal(batch.length, documents.length);
  documents.reverse().forEach((d, i) => {
    assert.deepStrictEqual(Array.from(batch[i]), Array.from(alone(embedder, d)), d.id);
  });
});

function streamed(chunk, options) {
  const loader = new ruri.EmbedderLoader(files.config, files.tokenizer, { maxLength, ...options });
  for (let at = 0; at < files.weights.length; at += chunk) {
    loader.push(files.weights.subarray(at, at + chunk));
  }
  return loader.finish();
}

test("streamed in chunks (EmbedderLoader), the same bits as from one array", () => {
  // Odd sizes straddle the header and the tensors; 2 MiB ones are copied in 1 MiB slices.
  for (const chunk of [65521, 2 << 20]) {
    const e = streamed(chunk);
    for (const item of reference.items.slice(0, 8)) {
      assert.deepStrictEqual(Array.from(alone(e, item)), Array.from(alone(embedder, item)), `${chunk}: ${item.id}`);
    }
    e.free();
  }
});

test("embeddingTable: f32 moves the vectors, within the int8 bound", () => {
  const f32 = streamed(1 << 20, { embeddingTable: "f32" });
  let moved = 0;
  for (const item of reference.items) {
    const got = alone(f32, item);
    if (!got.every((v, i) => v === alone(embedder, item)[i])) moved++;
    assert.ok(cosine(got, item.st_fp32.normalized) >= INT8_MIN_COSINE, item.id);
  }
  assert.ok(moved > 0, "the f32 table gave the int8 table's bits");
  f32.free();
});

// Each attention precision stated (ruri-native's AttentionPrecision): exact integer sums, or
// plain f32 steps in a fixed order, so the x86 engine's bits with the same option, from
// simd128's tiles and from the portable loops (the scalar kernel runs those). int13, the
// default, gives the default's bits; f32 and bf16 move some vector.
for (const attention of ["f32", "int13", "bf16"]) {
  test(`attention ${attention}: every vector equals the x86 engine's with the same option`, () => {
    const want = byId(x86Report.attention[attention]);
    const e = new ruri.Embedder(files.config, files.tokenizer, files.weights, { maxLength, attention });
    const scalar = new ruri.Embedder(files.config, files.tokenizer, files.weights, { maxLength, attention, kernel: "scalar" });
    let moved = 0;
    for (const item of reference.items) {
      const got = alone(e, item);
      assert.deepStrictEqual(Array.from(got), want.get(item.id).map(Math.fround), item.id);
      if (!got.every((v, i) => v === alone(embedder, item)[i])) moved++;
      assert.ok(cosine(got, item.st_fp32.normalized) >= INT8_MIN_COSINE, item.id);
    }
    for (const item of reference.items.slice(0, 6)) {
      assert.deepStrictEqual(Array.from(alone(scalar, item)), Array.from(alone(e, item)), `scalar: ${item.id}`);
    }
    if (attention === embedder.attention) {
      assert.equal(moved, 0, `${attention} stated moved the default's vectors`);
    } else {
      assert.ok(moved > 0, `${attention} gave the default (${embedder.attention}) attention's bits`);
    }
    e.free();
    scalar.free();
  });
}

test("the scalar kernel gives the same bits", () => {
  const scalar = new ruri.Embedder(files.config, files.tokenizer, files.weights, { kernel: "scalar", maxLength });
  assert.equal(scalar.kernel, "scalar");
  for (const item of reference.items.slice(0, 6)) {
    assert.deepStrictEqual(Array.from(alone(scalar, item)), Array.from(alone(embedder, item)), item.id);
  }
  scalar.free();
});

test("bad input is a RuriError with ruri's message, never a crash", () => {
  const expectError = (f, kind, pattern) =>
    assert.throws(f, (e) => {
      assert.equal(e.name, "RuriError");
      assert.equal(e.kind, kind);
      assert.match(e.message, pattern);
      return true;
    });
  expectError(() => new ruri.Embedder("{", files.tokenizer, files.weights), "InvalidJson", /config\.json/);
  expectError(() => new ruri.Embedder(files.config, "{}", files.weights), "InvalidTokenizer", /tokenizer\.json/);
  // The tokenizer is checked against config.json as a folder's is (the facade's ModelTexts):
  // fewer embedding rows than pieces, and other <s> … </s> ids, before any weight is read.
  const changed = (key, value) => JSON.stringify({ ...JSON.parse(files.config), [key]: value });
  expectError(
    () => new ruri.EmbedderLoader(changed("vocab_size", 100), files.tokenizer),
    "InvalidConfig",
    /tokenizer\.json.*vocab_size is 100/s,
  );
  expectError(
    () => new ruri.EmbedderLoader(changed("bos_token_id", 5), files.tokenizer),
    "InvalidConfig",
    /bos_token_id/,
  );
  expectError(
    () => new ruri.Embedder(files.config, files.tokenizer, files.weights.subarray(0, 1000)),
    "InvalidConfig",
    /model\.safetensors/,
  );
  expectError(() => new ruri.Embedder(files.config, files.tokenizer, new Uint8Array(0)), "InvalidConfig", /model\.safetensors/);
  expectError(() => new ruri.Embedder(files.config, files.tokenizer, "weights"), "InvalidOption", /weights/);
  expectError(
    () => new ruri.Embedder(files.config, files.tokenizer, files.weights, { kernel: "avx2" }),
    "InvalidOption",
    /kernel/,
  );
  expectError(() => embedder.embed(["x"], "poem"), "InvalidOption", /task/);
  expectError(
    () => new ruri.Embedder(files.config, files.tokenizer, files.weights, { embeddingTable: "fp16" }),
    "InvalidOption",
    /embeddingTable/,
  );
  // The engine's precisions only, refused before config.json is read.
  expectError(() => new ruri.Embedder("{", files.tokenizer, files.weights, { precision: "fp16" }), "InvalidOption", /precision.*fp16/s);
  expectError(
    () => new ruri.Embedder(files.config, files.tokenizer, files.weights, { attention: "int8" }),
    "InvalidOption",
    /attention.*int8.*known: f32, bf16, int13/s,
  );
  // A stream cut short fails in finish(), as the same bytes in one array fail.
  const cut = new ruri.EmbedderLoader(files.config, files.tokenizer);
  cut.push(files.weights.subarray(0, files.weights.length - 1));
  expectError(() => cut.finish(), "InvalidConfig", /model\.safetensors.*does not fit/s);
  expectError(
    () => new ruri.Embedder(files.config, files.tokenizer, files.weights.subarray(0, files.weights.length - 1)),
    "InvalidConfig",
    /does not fit/,
  );
  expectError(() => cut.finish(), "InvalidOption", /finish/);
  expectError(() => cut.push(new Uint8Array(4)), "InvalidOption", /finish/);
  const broken = new ruri.EmbedderLoader(files.config, files.tokenizer);
  expectError(() => broken.push(new Uint8Array([4, 0, 0, 0, 0, 0, 0, 0, 123, 110, 111, 33])), "InvalidConfig", /not JSON/);
  expectError(() => broken.push("bytes"), "InvalidOption", /weights/);
  for (const maxLength of [0, 2.5, "8"]) {
    expectError(
      () => new ruri.Embedder(files.config, files.tokenizer, files.weights, { maxLength }),
      "InvalidOption",
      /maxLength/,
    );
  }
  // The embedder still works after the errors.
  assert.equal(embedder.embedQuery("瑠璃色").length, reference.dim);
});
