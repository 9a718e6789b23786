// ruri's int8 file (`model.ruri-int8.safetensors`) in WebAssembly: `quantize` writes it from
// model.safetensors (the same bytes as x86's `ruri quantize` when RURI_WASM_INT8_FILE names
// that file), and the Embedder and the EmbedderLoader read it to the same vectors, bit for bit,
// as model.safetensors quantized at load with the same options; other options are refused.
// Runs on the model of RURI_WASM_MODEL (CI: the committed tiny model).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { ruri, modelFiles, referencePath } from "./common.mjs";

const reference = JSON.parse(readFileSync(referencePath, "utf8"));
const files = modelFiles();
const maxLength = reference.max_seq_length;
const items = reference.items.slice(0, 12);

const bits = (e) => items.map((item) => Array.from(new Uint32Array(e.embed([item.text], item.prompt_name)[0].buffer)));
const streamed = (bytes, chunk, options) => {
  const loader = new ruri.EmbedderLoader(files.config, files.tokenizer, { maxLength, ...options });
  for (let at = 0; at < bytes.length; at += chunk) loader.push(bytes.subarray(at, at + chunk));
  return loader.finish();
};
const expectError = (f, kind, pattern) =>
  assert.throws(f, (e) => {
    assert.equal(e.name, "RuriError");
    assert.equal(e.kind, kind, e.message);
    assert.match(e.message, pattern);
    return true;
  });

for (const embeddingTable of ["int8", "f32"]) {
  test(`embeddingTable ${embeddingTable}: the int8 file gives the fp32 file's bits`, () => {
    const options = { maxLength, embeddingTable };
    const file = ruri.quantize(files.config, files.weights, { embeddingTable });
    assert.ok(file instanceof Uint8Array);
    assert.ok(file.length < files.weights.length, `${file.length} bytes against ${files.weights.length}`);
    const header = JSON.parse(Buffer.from(file.subarray(8, 8 + Number(new DataView(file.buffer, file.byteOffset).getBigUint64(0, true)))).toString());
    assert.equal(header.__metadata__.format, "ruri-int8");
    assert.equal(header.__metadata__.embedding_table, embeddingTable);
    const fromFp32 = new ruri.Embedder(files.config, files.tokenizer, files.weights, options);
    const want = bits(fromFp32);
    fromFp32.free();
    const fromArray = new ruri.Embedder(files.config, files.tokenizer, file, options);
    assert.deepStrictEqual(bits(fromArray), want, "one array");
    fromArray.free();
    // Odd chunks straddle the header and the tensors.
    for (const chunk of [65521, 1 << 20]) {
      const e = streamed(file, chunk, { embeddingTable });
      assert.deepStrictEqual(bits(e), want, `chunks of ${chunk}`);
      e.free();
    }
    const scalar = new ruri.Embedder(files.config, files.tokenizer, file, { ...options, kernel: "scalar" });
    assert.deepStrictEqual(bits(scalar), want, "scalar kernel");
    scalar.free();
  });
}

test("the file is x86's, byte for byte", { skip: !process.env.RURI_WASM_INT8_FILE && "set RURI_WASM_INT8_FILE to `ruri quantize`'s file" }, () => {
  const x86 = readFileSync(process.env.RURI_WASM_INT8_FILE);
  const file = ruri.quantize(files.config, files.weights);
  assert.equal(file.length, x86.length);
  assert.ok(Buffer.from(file).equals(x86), "the bytes differ");
});

test("a perturbed scale changes the vectors (the test above can fail)", () => {
  const file = ruri.quantize(files.config, files.weights);
  const length = Number(new DataView(file.buffer, file.byteOffset).getBigUint64(0, true));
  const header = JSON.parse(Buffer.from(file.subarray(8, 8 + length)).toString());
  const at = 8 + length + header["layers.1.attn.Wqkv.weight_scale"].data_offsets[0] + 4 * 7;
  const view = new DataView(file.buffer, file.byteOffset);
  const want = bits(new ruri.Embedder(files.config, files.tokenizer, file, { maxLength }));
  view.setFloat32(at, view.getFloat32(at, true) * 1.001, true);
  assert.notDeepStrictEqual(bits(new ruri.Embedder(files.config, files.tokenizer, file, { maxLength })), want);
});

test("options other than the file's, and broken files, are RuriErrors", () => {
  const file = ruri.quantize(files.config, files.weights);
  expectError(() => new ruri.Embedder(files.config, files.tokenizer, file, { embeddingTable: "f32" }), "WeightsMismatch", /embedding_table = int8.*f32/);
  expectError(() => new ruri.Embedder(files.config, files.tokenizer, file, { precision: "fp32" }), "WeightsMismatch", /precision/);
  const config = JSON.parse(files.config);
  config.vocab_size += 1;
  expectError(() => new ruri.Embedder(JSON.stringify(config), files.tokenizer, file), "WeightsMismatch", /vocab_size/);
  expectError(() => new ruri.Embedder(files.config, files.tokenizer, file.subarray(0, file.length - 1)), "InvalidConfig", /does not fit|cut short/);
  expectError(() => ruri.quantize(files.config, file), "InvalidConfig", /already/);
  expectError(() => ruri.quantize(files.config, files.weights, { outlierChannels: "yes" }), "InvalidOption", /outlierChannels/);
});
