"""ONNX Runtime (MLAS) on the same cases as src/main.rs: MatMulInteger u8 (zero point 128)
× i8 7-bit weights, and fp32 MatMul, both with constant (prepacked) weights; one JSON line per
case, median of `reps` session runs in microseconds (a run's overhead included, ~5-10 us)."""
import json, sys, time
import numpy as np, onnxruntime as ort
from onnx import TensorProto as T, helper as h, numpy_helper as nh

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
rng = np.random.default_rng(0)

def session(nodes, inits, inputs, out, threads):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                     [h.make_tensor_value_info(out, T.INT32 if out == "yi" else T.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)]); m.ir_version = 10
    so = ort.SessionOptions(); so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

def median_us(s, feed):
    for _ in range(max(3, reps // 10)): s.run(None, feed)
    t = []
    for _ in range(reps):
        a = time.perf_counter(); s.run(None, feed); t.append((time.perf_counter() - a) * 1e6)
    return float(np.median(t))

for threads in [1, 2]:
    for k, n in [(256, 768), (256, 256), (256, 2048), (1024, 256)]:
        w = rng.integers(-63, 64, (k, n)).astype(np.int8)
        for m in [700, 10]:
            a = rng.integers(1, 256, (m, k)).astype(np.uint8)
            s = session([h.make_node("MatMulInteger", ["a", "w", "zp"], ["yi"])],
                        [nh.from_array(w, "w"), nh.from_array(np.array(128, np.uint8), "zp")],
                        [("a", T.UINT8, [m, k])], "yi", threads)
            int8 = median_us(s, {"a": a})
            af = ((a.astype(np.float32) - 128) * 0.01)
            s = session([h.make_node("MatMul", ["a", "w"], ["y"])], [nh.from_array(w.astype(np.float32) * 0.01, "w")],
                        [("a", T.FLOAT, [m, k])], "y", threads)
            fp32 = median_us(s, {"a": af})
            print(json.dumps({"engine": "onnxruntime MLAS " + ort.__version__, "k": k, "n": n, "m": m,
                              "threads": threads, "int8_us": round(int8, 1), "fp32_us": round(fp32, 1)}), flush=True)
