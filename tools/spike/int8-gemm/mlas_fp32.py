"""ONNX Runtime (MLAS) fp32 MatMul with constant weights, one intra-op thread, on the shapes of
ruri-native's kernels bench (benches/kernels.rs); prints one JSON line per shape with the median
G MAC/s. Compare with `cargo bench -p ruri-native --bench kernels -- fp32_gemm`, alternating the
two in fresh processes. Needs onnxruntime, onnx and numpy (the test-data venv has them)."""
import json, sys, time
import numpy as np, onnxruntime as ort
from onnx import TensorProto as T, helper as h, numpy_helper as nh
rng = np.random.default_rng(0)
def session(w, m, k, threads=1):
    g = h.make_graph([h.make_node("MatMul", ["a", "w"], ["y"])], "g",
                     [h.make_tensor_value_info("a", T.FLOAT, [m, k])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(w, "w")])
    mo = h.make_model(g, opset_imports=[h.make_opsetid("", 21)]); mo.ir_version = 10
    so = ort.SessionOptions(); so.intra_op_num_threads = threads
    return ort.InferenceSession(mo.SerializeToString(), so, providers=["CPUExecutionProvider"])
shapes = [("wqkv", 900, 768, 256), ("attn_wo", 900, 256, 256), ("wi", 900, 2048, 256),
          ("mlp_wo", 900, 256, 1024), ("wi_query", 28, 2048, 256), ("square", 1024, 1024, 1024)]
for name, m, n, k in shapes:
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    s = session(w, m, k)
    reps = max(20, int(2e9 / (m * n * k)))
    for _ in range(reps // 5 + 3): s.run(None, {"a": a})
    t = []
    for _ in range(reps):
        t0 = time.perf_counter(); s.run(None, {"a": a}); t.append(time.perf_counter() - t0)
    med = float(np.median(t))
    print(json.dumps({"engine": "mlas", "shape": name, "gmacs": m * n * k / med / 1e9}), flush=True)
