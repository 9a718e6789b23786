// The simd128 int8 kernel (and the scalar one) against sums computed here in JavaScript,
// byte for byte, on shapes with every kind of tail and on the largest sums the model makes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ruri } from "./common.mjs";

// A fixed-seed generator (xorshift32), so that a failure can be replayed.
function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x;
  };
}

// Mostly the extremes (the values that would saturate 16-bit pair sums if a kernel did);
// -128 is outside the symmetric range ruri's quantizer produces.
function matrix(next, len) {
  const m = new Int8Array(len);
  for (let i = 0; i < len; i++) {
    const r = next() % 4;
    m[i] = r === 0 ? -127 : r === 1 ? 127 : Math.max(-127, (next() % 256) - 128);
  }
  return m;
}

function naive(a, w, m, n, k) {
  const c = new Int32Array(m * n);
  for (let r = 0; r < m; r++)
    for (let col = 0; col < n; col++) {
      let s = 0; // exact: |s| ≤ 127² · 3072 < 2⁵³
      for (let kk = 0; kk < k; kk++) s += a[r * k + kk] * w[col * k + kk];
      c[r * n + col] = s;
    }
  return c;
}

for (const kernel of ["simd128", "scalar"]) {
  test(`${kernel} equals the JavaScript sums on random shapes`, () => {
    const next = rng(20241130);
    for (let i = 0; i < 200; i++) {
      const m = 1 + (next() % 19), n = 1 + (next() % 149), k = 1 + (next() % 69);
      const a = matrix(next, m * k), w = matrix(next, n * k);
      const got = ruri.int8Gemm(kernel, a, w, m, n, k);
      assert.ok(got instanceof Int32Array);
      assert.deepStrictEqual(got, naive(a, w, m, n, k), `shape ${m}×${n}×${k}`);
    }
  });

  test(`${kernel} equals the JavaScript sums across row blocks (32 rows) and the model's widths`, () => {
    const next = rng(7);
    for (const [m, n, k] of [[33, 9, 4], [70, 130, 100], [65, 768, 256], [3, 256, 1024]]) {
      const a = matrix(next, m * k), w = matrix(next, n * k);
      assert.deepStrictEqual(ruri.int8Gemm(kernel, a, w, m, n, k), naive(a, w, m, n, k), `shape ${m}×${n}×${k}`);
    }
  });

  test(`${kernel}: the largest sums (K = 3072, all products ±127²) are exact`, () => {
    const [m, n, k] = [7, 70, 3072];
    const a = new Int8Array(m * k).fill(127);
    const w = new Int8Array(n * k).fill(127);
    w.fill(-127, (n * k) / 2);
    const got = ruri.int8Gemm(kernel, a, w, m, n, k);
    assert.equal(got[0], 127 * 127 * 3072);
    assert.deepStrictEqual(got, naive(a, w, m, n, k));
  });
}

test("x86 kernels are refused here with ruri's typed error", () => {
  for (const name of ["avx2", "avx512vnni"]) {
    assert.throws(() => ruri.int8Gemm(name, new Int8Array(4), new Int8Array(4), 1, 1, 4), (e) => {
      assert.equal(e.name, "RuriError");
      assert.equal(e.kind, "InvalidOption");
      assert.match(e.message, /cannot run that int8 kernel/);
      return true;
    });
  }
  assert.throws(() => ruri.int8Gemm("sse9", new Int8Array(4), new Int8Array(4), 1, 1, 4), /unknown int8 kernel/);
  assert.throws(() => ruri.int8Gemm("simd128", new Int8Array(3), new Int8Array(4), 1, 1, 4), /do not match the shape/);
});

// int13 attention's two products (ruri-native's AttentionPrecision::Int13): the simd128
// tiles and the portable loops against exact sums computed here. Each row of q and k, and
// each channel of v, holds ±4,095 · 2^e, so the engine's quantization keeps the integers
// (the row divided by 2^e exactly) with the scale 2^e, and a score is the dot product rounded
// to f32 times the two scales (powers of two: exact). Modes: random values; extremes (every
// value ±4,095); the largest sums (every value and weight 4,095: an i32 chunk at its fullest).
function int13Operands(next, rows, keys, d, mode) {
  const value = () =>
    mode === "largest" ? 4095 : mode === "extremes" ? (next() % 2 ? 4095 : -4095) : (next() % 8191) - 4095;
  const sign = () => (mode === "largest" || next() % 2 ? 1 : -1);
  const rowsOf = (n) => {
    const x = new Float32Array(n * d).map(value);
    const scales = new Float32Array(n).map(() => (mode === "random" ? 2 ** (next() % 4) : 1));
    for (let r = 0; r < n; r++) {
      x[r * d + (next() % d)] = 4095 * sign();
      for (let c = 0; c < d; c++) x[r * d + c] *= scales[r];
    }
    return { x, scales };
  };
  const q = rowsOf(rows), k = rowsOf(keys);
  const v = new Float32Array(keys * d).map(value);
  for (let c = 0; c < d && keys > 0; c++) v[(next() % keys) * d + c] = 4095 * sign();
  const p = new Uint16Array(rows * keys).map(() => (mode === "largest" ? 4095 : next() % 4096));
  return { q, k, v, p };
}

function int13Exact({ q, k, v, p }, rows, keys, d) {
  const scores = new Float32Array(rows * keys), sums = new BigInt64Array(rows * d);
  for (let r = 0; r < rows; r++) {
    for (let j = 0; j < keys; j++) {
      let dot = 0; // exact: |dot| ≤ d · 4095² < 2⁵³
      for (let c = 0; c < d; c++) dot += (q.x[r * d + c] / q.scales[r]) * (k.x[j * d + c] / k.scales[j]);
      scores[r * keys + j] = Math.fround(dot) * k.scales[j] * q.scales[r];
    }
    for (let c = 0; c < d; c++) {
      let s = 0; // exact: ≤ keys · 4095² < 2⁵³
      for (let j = 0; j < keys; j++) s += p[r * keys + j] * v[j * d + c];
      sums[r * d + c] = BigInt(s);
    }
  }
  return { scores, sums };
}

for (const products of ["simd128", "portable"]) {
  test(`int13 ${products}: scores and weighted sums equal the exact JavaScript sums`, () => {
    const next = rng(20261207);
    // Heads of the model (64), the tiles' widest (128), ones that leave a tail of channels
    // (4, 24: the simd128 tiles take multiples of 4) or run the portable loops (2, 6, 160),
    // keys across groups of 16 and past one and two chunks of 64 pairs.
    const shapes = [[1, 1, 64], [5, 23, 64], [9, 150, 64], [3, 300, 128], [2, 17, 24], [4, 33, 4], [3, 9, 2], [2, 31, 6], [3, 20, 160]];
    for (let i = 0; i < 30; i++) shapes.push([1 + (next() % 7), 1 + (next() % 90), 2 * (1 + (next() % 40))]);
    for (const mode of ["random", "extremes", "largest"]) {
      for (const [rows, keys, d] of shapes) {
        const operands = int13Operands(next, rows, keys, d, mode);
        const { q, k, v, p } = operands;
        const [scores, sums] = ruri.int13Products(products, q.x, k.x, v, p, rows, keys, d);
        assert.ok(scores instanceof Float32Array && sums instanceof BigInt64Array);
        const want = int13Exact(operands, rows, keys, d);
        const shape = `${rows}×${keys}×${d}, ${mode}`;
        assert.deepStrictEqual(scores, want.scores, `scores, ${shape}`);
        assert.deepStrictEqual(sums, want.sums, `sums, ${shape}`);
      }
    }
  });
}

test("int13: x86 tiles are refused here, and so are shapes that do not match", () => {
  const one = new Float32Array([4095, 0]);
  for (const products of ["avx2", "avx512vnni", "int8"]) {
    assert.throws(() => ruri.int13Products(products, one, one, one, new Uint16Array(1), 1, 1, 2), (e) => {
      assert.equal(e.name, "RuriError");
      assert.equal(e.kind, "InvalidOption");
      assert.match(e.message, /int13Products/);
      return true;
    });
  }
  assert.throws(() => ruri.int13Products("simd128", one, one, one, new Uint16Array(1), 1, 1, 3), /do not match the shape/);
  assert.throws(() => ruri.int13Products("simd128", one, one, one, new Uint16Array([4096]), 1, 1, 2), /do not match the shape/);
});
