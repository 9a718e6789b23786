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
