#!/usr/bin/env python3
"""Measure the Python peers of ruri on the fixed workload, each in a fresh subprocess.

    .venv-testdata/bin/python tools/bench/python_peers.py --repeats 5 --out peers.jsonl
    .venv-testdata/bin/python tools/bench/python_peers.py --systems ort_py_int8_sorted --repeats 1 --limit-docs 256
    .venv-testdata/bin/python tools/bench/python_peers.py --rounds 5 --repeats 3 \
        --systems st_fp32,ruri_python_int8,ruri_python_fp32 --out python_rounds.jsonl

Systems (see tools/bench/README.md):
  st_fp32             sentence-transformers, torch CPU fp32, encode(prompt_name="document",
                      batch_size=32) (sentence-transformers sorts by length internally)
  ort_py_fp32_fixed   onnxruntime + tokenizers, onnx/model.onnx, fixed batches of 32 in input
                      order, padded to the longest in the batch
  ort_py_int8_fixed   same, onnx/model_quantized.onnx
  ort_py_int8_sorted  int8, batches of 32 after sorting by token length (output restored to
                      input order)
  ruri_python_int8    the `ruri` Python package (ruri-python/, the Rust engine through PyO3),
                      Embedder(precision="int8", intra_threads=threads), the same calls as
                      st_fp32: encode(prompt_name="document", batch_size=32) (ruri sorts by
                      token length and also caps a batch at 8,192 padded tokens) and
                      encode([q], prompt_name="query")[0]; raw (unnormalized) vectors as
                      st_fp32; whichever graph ruri-ort runs by default on the folder
  ruri_python_fp32    same, precision="fp32"
The ruri_python_* children run under --ruri-python (default target/venv-python/bin/python, the
venv tools/test-python.sh installs the wheel into; same CPython), the others under this
interpreter.
The ONNX peers take `sentence_embedding` (mean pooled) and L2-normalize it in numpy; the
sentence-transformers peer returns its mean-pooled vectors (not normalized; the norm is
negligible work). Queries are embedded one at a time with the query prompt.

Per system, in a child process: cold start (parent's time.time() just before the child
is started -> child's time.time() right after the first vector of a one-query embed:
interpreter start + imports + load + first inference); one warm-up pass over all
documents; --repeats timed passes (median reported); one warm-up pass over the queries,
then one timed pass (p50/p99 per-query latency); peak RSS = the child's ru_maxrss.

Peak RSS is taken by the parent (ru_maxrss from wait4 on that child), the same way for
--external runners (e.g. the Rust one: `--external ruri_ort_int8="target/release/... args"`;
the contract is in tools/bench/README.md).

Output: one JSON object per system, one per line, on stdout and (with --out) to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ["st_fp32", "ort_py_int8_fixed", "ort_py_fp32_fixed", "ort_py_int8_sorted",
           "ruri_python_int8", "ruri_python_fp32"]
# Without --systems: the peers that need only this interpreter (the ruri_python_* ones need the
# wheel's venv, --ruri-python).
DEFAULT_SYSTEMS = SYSTEMS[:4]
MARK = "RURI_BENCH_RESULT "
BATCH = 32
MAX_LEN = 8192
PAD_ID = 3


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def read_jsonl(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def vm_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


# --------------------------------------------------------------------------- child side

class StPeer:
    def __init__(self, model_dir: Path, threads: int):
        import torch
        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        from sentence_transformers import SentenceTransformer
        self.torch = torch
        self.model = SentenceTransformer(str(model_dir), device="cpu")
        self.prompts = self.model.prompts
        self.details = {
            "engine": "sentence-transformers (torch CPU fp32)",
            "torch": torch.__version__,
            "sentence_transformers": __import__("sentence_transformers").__version__,
            "transformers": __import__("transformers").__version__,
            "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": 1,
            "batching": "sentence-transformers encode(): sorted by character length internally",
            "normalized": False,
            "attn_implementation": getattr(self.model[0].auto_model.config, "_attn_implementation", None),
        }

    def documents(self, docs: list[str]):
        return self.model.encode(docs, prompt_name="document", batch_size=BATCH,
                                 show_progress_bar=False, convert_to_numpy=True)

    def query(self, q: str):
        return self.model.encode([q], prompt_name="query", show_progress_bar=False,
                                 convert_to_numpy=True)[0]


class OrtPeer:
    def __init__(self, model_dir: Path, threads: int, quantized: bool, sorted_batches: bool):
        import numpy as np
        import onnxruntime as ort
        from tokenizers import Tokenizer
        self.np = np
        cfg = json.loads((model_dir / "config_sentence_transformers.json").read_text(encoding="utf-8"))
        self.prompts = cfg["prompts"]
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.enable_truncation(max_length=MAX_LEN)
        self.tok.no_padding()  # padded below, to the longest in each batch, with <pad> (3)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        path = model_dir / "onnx" / ("model_quantized.onnx" if quantized else "model.onnx")
        self.sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.sorted = sorted_batches
        self.details = {
            "engine": "onnxruntime (Python) + tokenizers",
            "onnxruntime": ort.__version__,
            "tokenizers": __import__("tokenizers").__version__,
            "model_file": str(path.relative_to(model_dir)),
            "intra_op_threads": threads,
            "inter_op_threads": 1,
            "graph_optimization": "ORT_ENABLE_ALL",
            "batching": ("sorted by token length, batches of 32" if sorted_batches
                         else "fixed batches of 32 in input order"),
            "output": "sentence_embedding, L2-normalized in numpy",
            "normalized": True,
        }

    def _run(self, encs):
        np = self.np
        width = max(len(e.ids) for e in encs)
        ids = np.full((len(encs), width), PAD_ID, dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for r, e in enumerate(encs):
            n = len(e.ids)
            ids[r, :n] = e.ids
            mask[r, :n] = 1
        out = self.sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0]
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def _fixed(self, texts: list[str]):
        return self._run(self.tok.encode_batch(texts))

    def documents(self, docs: list[str]):
        np = self.np
        p = self.prompts["document"]
        texts = [p + d for d in docs]
        if not self.sorted:
            return np.concatenate([self._fixed(texts[i:i + BATCH]) for i in range(0, len(texts), BATCH)])
        encs = self.tok.encode_batch(texts)  # tokenize all, then sort by token length
        lens = np.array([len(e.ids) for e in encs])
        order = np.argsort(lens, kind="stable")
        parts = [self._run([encs[j] for j in order[i:i + BATCH]])
                 for i in range(0, len(order), BATCH)]
        vecs = np.concatenate(parts)
        out = np.empty_like(vecs)
        out[order] = vecs
        return out

    def query(self, q: str):
        return self._fixed([self.prompts["query"] + q])[0]


class RuriPythonPeer:
    """The `ruri` package, called exactly as StPeer calls sentence-transformers."""

    def __init__(self, model_dir: Path, threads: int, precision: str):
        import ruri
        self.model = ruri.Embedder(str(model_dir), precision=precision, intra_threads=threads)
        self.details = {
            "engine": "ruri (Python package, Rust engine via PyO3)",
            "ruri": ruri.__version__,
            "backend": self.model.backend,
            "precision": precision,
            "intra_threads": threads,
            "graph": "ruri-ort's default for the folder (Graph::Auto)",
            "batching": "ruri: sorted by token length, <= 32 texts and <= 8,192 padded tokens",
            "normalized": False,
        }

    def documents(self, docs: list[str]):
        return self.model.encode(docs, prompt_name="document", batch_size=BATCH)

    def query(self, q: str):
        return self.model.encode([q], prompt_name="query")[0]


def make_peer(system: str, model_dir: Path, threads: int):
    if system == "ruri_python_int8":
        return RuriPythonPeer(model_dir, threads, "int8")
    if system == "ruri_python_fp32":
        return RuriPythonPeer(model_dir, threads, "fp32")
    if system == "st_fp32":
        return StPeer(model_dir, threads)
    if system == "ort_py_int8_fixed":
        return OrtPeer(model_dir, threads, quantized=True, sorted_batches=False)
    if system == "ort_py_fp32_fixed":
        return OrtPeer(model_dir, threads, quantized=False, sorted_batches=False)
    if system == "ort_py_int8_sorted":
        return OrtPeer(model_dir, threads, quantized=True, sorted_batches=True)
    raise SystemExit(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


def token_counts(model_dir: Path, prompt: str, texts: list[str]) -> list[int]:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_LEN)
    return [len(e.ids) for e in tok.encode_batch([prompt + t for t in texts])]


def child(args) -> None:
    system = args.child
    queries = read_jsonl(args.workload_dir / "queries.jsonl")

    # Cold start: everything from here (and the interpreter start before it) to the first vector.
    peer = make_peer(system, args.model_dir, args.threads)
    first = peer.query(queries[0])
    first_vector_time = time.time()
    rss_after_first_kb = vm_kb("VmHWM")

    import numpy as np
    docs = read_jsonl(args.workload_dir / "documents.jsonl")
    if args.limit_docs:
        docs = docs[:args.limit_docs]

    peer.documents(docs)  # warm-up pass
    times = []
    vecs = None
    for _ in range(args.repeats):
        t = time.perf_counter()
        vecs = peer.documents(docs)
        times.append(time.perf_counter() - t)
    assert vecs is not None and vecs.shape[0] == len(docs)

    for q in queries:  # warm-up pass
        peer.query(q)
    lat = []
    for q in queries:
        t = time.perf_counter()
        v = peer.query(q)
        lat.append((time.perf_counter() - t) * 1000.0)
    assert v.shape == first.shape

    if args.vectors_dir:
        args.vectors_dir.mkdir(parents=True, exist_ok=True)
        np.save(args.vectors_dir / f"{system}.documents.npy", np.asarray(vecs, dtype=np.float32))

    med = statistics.median(times)
    result = {
        "system": system,
        "texts_per_s": round(len(docs) / med, 2),
        "tokens_per_s": None,  # filled in by the parent (tokenizing here would add to the RSS)
        "p50_ms": round(float(np.percentile(lat, 50)), 3),
        "p99_ms": round(float(np.percentile(lat, 99)), 3),
        "cold_start_s": None,  # filled in by the parent
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),  # parent overrides (wait4)
        "details": {
            **peer.details,
            "language": "python",
            "python": sys.version.split()[0],
            "threads": args.threads,
            "batch_size": BATCH,
            "repeats": args.repeats,
            "warmup_passes": 1,
            "documents": len(docs),
            "queries": len(queries),
            "median_pass_s": med,
            "pass_seconds": [round(x, 4) for x in times],
            "query_ms_mean": round(statistics.fmean(lat), 3),
            "query_ms_max": round(max(lat), 3),
            "peak_rss_after_first_vector_mb": (round(rss_after_first_kb / 1024.0, 1)
                                               if rss_after_first_kb else None),
            "dim": int(np.asarray(first).shape[-1]),
            "timestamp_unix": round(time.time(), 3),
        },
        "first_vector_unix": first_vector_time,
    }
    sys.stdout.write(MARK + json.dumps(result, ensure_ascii=False) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- parent side

def child_env(args) -> dict:
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1", "PYTHONWARNINGS": "ignore",
        "TOKENIZERS_PARALLELISM": "true",
        "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
        # For external runners (tools/bench/README.md): the same settings as the Python peers.
        "RURI_BENCH_MODEL_DIR": str(args.model_dir),
        "RURI_BENCH_WORKLOAD_DIR": str(args.workload_dir),
        "RURI_BENCH_REPEATS": str(args.repeats),
        "RURI_BENCH_THREADS": str(args.threads),
        "RURI_BENCH_LIMIT_DOCS": str(args.limit_docs or 0),
    })
    return env


def run_child(name: str, cmd: list[str], env: dict) -> dict:
    """Start cmd, read its result line, and take cold start and peak RSS from outside.

    cold_start_s = child's first_vector_unix - time.time() taken just before the start;
    peak_rss_mb = ru_maxrss of that child from wait4 (the same method for every system).
    """
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    out = proc.stdout.read()
    proc.stdout.close()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: child exited with {proc.returncode}")
    lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
    if not lines:
        raise SystemExit(f"{name}: child printed no line starting with {MARK!r}")
    res = json.loads(lines[-1][len(MARK):])
    res["system"] = res.get("system") or name
    res.setdefault("details", {})
    if res.get("peak_rss_mb") is not None:
        res["details"]["peak_rss_mb_self_reported"] = res["peak_rss_mb"]
    res["peak_rss_mb"] = round(ru.ru_maxrss / 1024.0, 1)
    fv = res.pop("first_vector_unix", None)
    if fv is None and res.get("cold_start_s") is None:
        raise SystemExit(f"{name}: result has neither first_vector_unix nor cold_start_s")
    if fv is not None:
        res["cold_start_s"] = round(fv - t0, 3)
    return res


def run_system(system: str, args) -> dict:
    python = str(args.ruri_python) if system.startswith("ruri_python") else sys.executable
    cmd = [python, str(Path(__file__).resolve()), "--child", system,
           "--model-dir", str(args.model_dir), "--workload-dir", str(args.workload_dir),
           "--repeats", str(args.repeats), "--threads", str(args.threads)]
    if args.limit_docs:
        cmd += ["--limit-docs", str(args.limit_docs)]
    if args.vectors_dir:
        cmd += ["--vectors-dir", str(args.vectors_dir)]
    return run_child(system, cmd, child_env(args))


def workload_tokens(args) -> dict:
    """Real (unpadded) token counts incl. <s>/</s> and prompt, computed in the parent."""
    docs = read_jsonl(args.workload_dir / "documents.jsonl")
    if args.limit_docs:
        docs = docs[:args.limit_docs]
    queries = read_jsonl(args.workload_dir / "queries.jsonl")
    prompts = json.loads((args.model_dir / "config_sentence_transformers.json")
                         .read_text(encoding="utf-8"))["prompts"]
    d = token_counts(args.model_dir, prompts["document"], docs)
    q = token_counts(args.model_dir, prompts["query"], queries)

    def padded(lens: list[int]) -> int:
        return sum(max(lens[i:i + BATCH]) * len(lens[i:i + BATCH]) for i in range(0, len(lens), BATCH))

    return {
        "document_tokens": sum(d),
        "document_tokens_mean": round(sum(d) / len(d), 3),
        "document_tokens_padded_fixed32": padded(d),
        "document_tokens_padded_sorted32": padded(sorted(d)),
        "query_tokens_mean": round(sum(q) / len(q), 3),
    }


def compare_vectors(systems: list[str], vdir: Path) -> dict:
    import numpy as np
    have = [s for s in systems if (vdir / f"{s}.documents.npy").exists()]
    if len(have) < 2:
        return {}
    ref = np.load(vdir / f"{have[0]}.documents.npy")
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    out = {}
    for s in have[1:]:
        v = np.load(vdir / f"{s}.documents.npy")
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        cos = (ref * v).sum(axis=1)
        out[f"{s} vs {have[0]}"] = {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    return out


def summarize(results: list[dict]) -> str:
    """Median [min-max] of each metric per system over the rounds, and the ratio of medians
    to the first system (all from this run)."""
    keys = [("texts_per_s", "texts/s", 1), ("p50_ms", "p50 ms", 2), ("p99_ms", "p99 ms", 2),
            ("cold_start_s", "cold start s", 2), ("peak_rss_mb", "peak RSS MB", 0)]
    by_system: dict[str, list[dict]] = {}
    for r in results:
        by_system.setdefault(r["system"], []).append(r)
    names = list(by_system)
    med = {(s, k): statistics.median(r[k] for r in by_system[s]) for s in names for k, _, _ in keys}
    rounds = max(len(v) for v in by_system.values())
    lines = [f"Median over {rounds} rounds (each a fresh process, order rotated), [min-max]; "
             f"ratio = median / {names[0]}'s median.", "",
             "| system | " + " | ".join(h for _, h, _ in keys) + " |",
             "|---|" + "---:|" * len(keys)]
    for s in names:
        cells = []
        for k, _, nd in keys:
            vals = [r[k] for r in by_system[s]]
            cell = f"{med[(s, k)]:,.{nd}f} [{min(vals):,.{nd}f}-{max(vals):,.{nd}f}]"
            if s != names[0] and med[(names[0], k)]:
                cell += f" ({med[(s, k)] / med[(names[0], k)]:.2f}x)"
            cells.append(cell)
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help=f"comma-separated subset of {','.join(SYSTEMS)} "
                         f"(default {','.join(DEFAULT_SYSTEMS)})")
    ap.add_argument("--repeats", type=int, default=5, help="timed document passes (median)")
    ap.add_argument("--model-dir", type=Path, default=ROOT / "testdata/generated/ruri-v3-30m-shape")
    ap.add_argument("--workload-dir", type=Path, default=ROOT / "testdata/generated/bench")
    ap.add_argument("--out", type=Path, help="also write the JSON lines here")
    ap.add_argument("--threads", type=int, default=default_threads(),
                    help="torch / onnxruntime intra-op threads (default: all usable cores)")
    ap.add_argument("--limit-docs", type=int, default=0, help="use only the first N documents (dev runs)")
    ap.add_argument("--vectors-dir", type=Path,
                    help="save each system's document vectors here and compare them (sanity check)")
    ap.add_argument("--external", action="append", default=[], metavar="NAME=COMMAND",
                    help="also run an external runner (e.g. the Rust one) under the same "
                         "protocol; repeatable; see tools/bench/README.md")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every system this many times, each in a fresh process, rotating "
                         "the order each round; lines get a \"round\" key and a summary "
                         "(median [min-max], ratios to the first system) goes to stderr")
    ap.add_argument("--ruri-python", type=Path, default=ROOT / "target/venv-python/bin/python",
                    help="interpreter with the ruri package, for the ruri_python_* systems")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--count-tokens", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats < 1 or args.rounds < 1:
        raise SystemExit("--repeats and --rounds must be >= 1")

    if args.child:
        child(args)
        return
    if args.count_tokens:
        print(json.dumps(workload_tokens(args)))
        return

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    externals = []
    for spec in args.external:
        name, sep, command = spec.partition("=")
        if not sep or not name or not command:
            raise SystemExit(f"--external wants NAME=COMMAND, got {spec!r}")
        externals.append((name, shlex.split(command)))
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s!r}; known: {', '.join(SYSTEMS)}")
        if s.startswith("ruri_python") and not args.ruri_python.exists():
            raise SystemExit(f"{s} needs {args.ruri_python} (tools/test-python.sh makes it) "
                             "or --ruri-python PYTHON with the ruri package")
    workload = args.workload_dir / "workload.json"
    wl = json.loads(workload.read_text(encoding="utf-8")) if workload.exists() else {}
    # Token counts come from a short-lived helper process: loading the tokenizer here would
    # grow this process by ~225 MB, and Linux carries the parent's RSS high-water mark into
    # a child's ru_maxrss (fork/vfork + exec), inflating every peak_rss_mb.
    helper = [sys.executable, str(Path(__file__).resolve()), "--count-tokens",
              "--model-dir", str(args.model_dir), "--workload-dir", str(args.workload_dir),
              "--limit-docs", str(args.limit_docs or 0)]
    toks = json.loads(subprocess.run(helper, stdout=subprocess.PIPE, text=True, check=True,
                                     env=child_env(args)).stdout)
    results = []
    out_f = args.out.open("w", encoding="utf-8") if args.out else None
    try:
        base_jobs = [(s, None) for s in systems] + externals
        jobs = []
        for k in range(args.rounds):
            shift = k % len(base_jobs)  # rotate: each system takes each position in turn
            jobs += [(k + 1, j) for j in base_jobs[shift:] + base_jobs[:shift]]
        for round_no, (s, ext_cmd) in jobs:
            print(f"[python_peers] round {round_no}/{args.rounds}: {s} ...", file=sys.stderr,
                  flush=True)
            r = run_system(s, args) if ext_cmd is None else run_child(s, ext_cmd, child_env(args))
            med = r["details"].pop("median_pass_s", None)
            if r.get("tokens_per_s") is None and med:
                r["tokens_per_s"] = round(toks["document_tokens"] / med, 1)
            r["details"].update(toks)
            keys = ["system", "texts_per_s", "tokens_per_s", "p50_ms", "p99_ms", "cold_start_s",
                    "peak_rss_mb"]
            r = {**{k: r.get(k) for k in keys}, **{k: v for k, v in r.items() if k not in keys}}
            if args.rounds > 1:
                r["round"] = round_no
            r["details"]["workload_documents_sha256"] = wl.get("documents", {}).get("sha256")
            r["details"]["workload_queries_sha256"] = wl.get("queries", {}).get("sha256")
            line = json.dumps(r, ensure_ascii=False)
            print(line, flush=True)
            if out_f:
                out_f.write(line + "\n")
                out_f.flush()
            results.append(r)
    finally:
        if out_f:
            out_f.close()
    if args.rounds > 1:
        print(summarize(results), file=sys.stderr)
    if args.vectors_dir:
        cmp = compare_vectors(systems, args.vectors_dir)
        if cmp:
            print("[python_peers] document vectors: " + json.dumps(cmp), file=sys.stderr)


if __name__ == "__main__":
    main()
