"""Bad input raises ruri's typed exceptions (with ruri's messages), never crashes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ruri
from conftest import TINY


@pytest.mark.parametrize("bad,index,kind", [
    (["瑠璃", 1], 1, "int"),
    (["瑠璃", None], 1, "NoneType"),
    ([b"bytes"], 0, "bytes"),
    ([["nested"]], 0, "list"),
    (np.array([1.0, 2.0]), 0, "float"),
])
def test_non_str_items_raise_input_type_error(ort_int8, bad, index, kind):
    with pytest.raises(ruri.InputTypeError, match=rf"sentences\[{index}\] is of type {kind}") as e:
        ort_int8.encode(bad)
    # Catchable as sentence-transformers' ValueError and as a TypeError.
    assert isinstance(e.value, ValueError) and isinstance(e.value, TypeError)
    assert isinstance(e.value, ruri.RuriError)


@pytest.mark.parametrize("bad", [None, 42, b"bytes", {"text": "x"}, np.array([["a"]])])
def test_non_text_sentences_raise_input_type_error(ort_int8, bad):
    with pytest.raises(ruri.InputTypeError):
        ort_int8.encode(bad)


def test_lone_surrogate_is_an_input_error(ort_int8):
    with pytest.raises(ruri.InputError, match=r"sentences\[1\] is not valid Unicode"):
        ort_int8.encode(["ok", "\ud800"])


def test_unknown_prompt_name_has_ruris_message(ort_int8):
    with pytest.raises(ruri.InputError,
                       match="invalid option prompt_name = nope: no prompt of that name") as e:
        ort_int8.encode(["瑠璃"], prompt_name="nope")
    assert isinstance(e.value, ValueError)
    with pytest.raises(ruri.InputError):
        ort_int8.encode([], prompt_name="nope")  # checked even for no texts, as in ST


@pytest.mark.parametrize("kwargs", [
    {"output_value": "token_embeddings"},
    {"output_value": None},
    {"convert_to_tensor": True},
    {"device": "cuda"},
    {"show_progress_bar": True},
    {"pool": {}},
    {"chunk_size": 8},
    {"unknown_kwarg": 1},
])
def test_unsupported_sentence_transformers_arguments_raise(ort_int8, kwargs):
    with pytest.raises(ruri.UnsupportedArgumentError) as e:
        ort_int8.encode(["瑠璃"], **kwargs)
    assert isinstance(e.value, ValueError)
    with pytest.raises(ruri.UnsupportedArgumentError):
        ort_int8.encode_query("瑠璃", **kwargs)


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"batch_size": -1},
                                    {"truncate_dim": 0}])
def test_bad_numbers_raise_value_errors(ort_int8, kwargs):
    with pytest.raises(ruri.InputError, match="must be a positive integer"):
        ort_int8.encode(["瑠璃"], **kwargs)
    with pytest.raises(ruri.InputTypeError):
        ort_int8.encode(["瑠璃"], batch_size="32")


def test_accepted_no_op_arguments(ort_int8):
    v = ort_int8.encode(["瑠璃"])
    for kwargs in ({"show_progress_bar": False}, {"device": "cpu"}, {"task": "query"},
                   {"precision": "float32"}, {"output_value": "sentence_embedding"}):
        np.testing.assert_array_equal(ort_int8.encode(["瑠璃"], **kwargs), v)


def test_setting_max_seq_length_is_refused(ort_int8):
    with pytest.raises(ruri.UnsupportedArgumentError):
        ort_int8.max_seq_length = 128


def test_missing_folder(tmp_path):
    # Neither a folder nor a Hub id (org/name).
    with pytest.raises(ruri.ModelLoadError, match="missing file"):
        ruri.Embedder(tmp_path / "nowhere")


def test_empty_folder_names_the_missing_file(tmp_path):
    with pytest.raises(ruri.ModelLoadError, match=r"missing file .*config\.json"):
        ruri.Embedder(tmp_path)


def copy_tiny(tmp_path, keep=lambda name: True):
    folder = tmp_path / "tiny"
    shutil.copytree(TINY, folder, ignore=lambda d, names: [n for n in names if not keep(n)])
    return folder


def test_invalid_json(tmp_path):
    folder = copy_tiny(tmp_path)
    (folder / "config.json").write_text("{ not json", encoding="utf-8")
    with pytest.raises(ruri.ModelLoadError, match="invalid JSON in .*config.json"):
        ruri.Embedder(folder)


def test_folder_without_model_files(tmp_path):
    folder = copy_tiny(tmp_path, keep=lambda n: n not in ("onnx", "model.safetensors"))
    for backend in ("ort", "candle"):
        if backend in ruri.BACKENDS:
            with pytest.raises(ruri.ModelLoadError):
                ruri.Embedder(folder, backend=backend)
    # The default (native) reads model.safetensors: with no ONNX file either, the plain
    # missing file.
    for backend in (None, "native"):
        with pytest.raises(ruri.ModelLoadError, match=r"missing file .*model\.safetensors"):
            ruri.Embedder(folder, backend=backend)


def test_prequantized_reads_ruris_int8_file_and_only_on_native_int8(tmp_path):
    # The tiny folder has no model.ruri-int8.safetensors: asked for, it is the missing file
    # (the option reaches the loader; the vectors it gives are tested in Rust, in
    # ruri-native/tests/prequant.rs and ruri-cli/tests/quantize.rs).
    folder = copy_tiny(tmp_path)
    with pytest.raises(ruri.ModelLoadError, match=r"missing file .*model\.ruri-int8\.safetensors"):
        ruri.Embedder(folder, backend="native", precision="int8", prequantized=True)
    # Without it, the same folder loads.
    assert ruri.Embedder(folder, backend="native", precision="int8").encode("x").shape == (64,)
    for kwargs in ({"backend": "native", "precision": "fp32"}, {"backend": "ort"}):
        with pytest.raises(ruri.InputError, match="prequantized"):
            ruri.Embedder(folder, prequantized=True, **kwargs)


def test_bf16_and_int13_attention_load_on_native_only():
    # The option reaches the engine (`attention` is what it reports); the vectors it gives
    # are tested in Rust (tests/attention.rs, ruri-native's own tests).
    for precision in ("int8", "fp32"):
        for attention in ("bf16", "int13"):
            model = ruri.Embedder(TINY, backend="native", precision=precision, attention=attention)
            assert model.attention == attention
            vector = model.encode("瑠璃色はどんな色？")
            assert vector.shape == (model.get_sentence_embedding_dimension(),)
            assert np.isfinite(vector).all()
            assert f"attention='{attention}'" in repr(model)
    # Unnamed: int13 at int8 (the package's default precision), f32 at fp32 and elsewhere.
    default = ruri.Embedder(TINY, backend="native")
    assert (default.precision, default.attention) == ("int8", "int13")
    assert "attention='int13'" in repr(default)
    assert ruri.Embedder(TINY, backend="native", precision="fp32").attention == "f32"
    assert ruri.Embedder(TINY, backend="native", attention="f32").attention == "f32"
    assert ruri.Embedder(TINY, backend="ort", attention=None).attention == "f32"
    assert ruri.Embedder(TINY, backend="native", attention="bfloat16").attention == "bf16"
    with pytest.raises(ruri.InputError, match=r"invalid option attention = bf16"):
        ruri.Embedder(TINY, backend="ort", attention="bf16")
    with pytest.raises(ruri.InputError, match=r"invalid option attention = int13"):
        ruri.Embedder(TINY, backend="ort", attention="int13")
    with pytest.raises(ruri.InputError, match=r"attention = int8: .*known: f32, bf16, int13"):
        ruri.Embedder(TINY, attention="int8")
    with pytest.raises(ruri.InputTypeError, match="attention must be a str or None"):
        ruri.Embedder(TINY, attention=13)


def test_an_onnx_only_folder_needs_backend_ort_and_the_error_says_so(tmp_path):
    folder = copy_tiny(tmp_path, keep=lambda n: n != "model.safetensors")
    for kwargs in ({}, {"backend": "native"}, {"backend": "native", "precision": "fp32"}):
        with pytest.raises(ruri.ModelLoadError) as e:
            ruri.Embedder(folder, **kwargs)
        message = str(e.value)
        assert "no model.safetensors, which backend native reads" in message, message
        assert 'backend="ort"' in message and "onnx/model_quantized.onnx" in message, message
    # The fix it names: ort runs the folder's ONNX files.
    model = ruri.Embedder(folder, backend="ort")
    assert (model.backend, model.precision) == ("ort", "int8")
    assert model.encode(["瑠璃"]).shape == (1, 64)


def test_corrupt_onnx_file_is_a_load_error(tmp_path):
    folder = copy_tiny(tmp_path, keep=lambda n: n != "model.safetensors")
    (folder / "onnx" / "model.onnx").write_bytes(b"\x08\x07garbage" * 100)
    with pytest.raises(ruri.ModelLoadError):
        ruri.Embedder(folder, backend="ort", precision="fp32")


def test_corrupt_safetensors_is_a_load_error_on_candle(tmp_path):
    if "candle" not in ruri.BACKENDS:
        pytest.skip("no candle backend")
    folder = copy_tiny(tmp_path)
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ruri.ModelLoadError):
        ruri.Embedder(folder, backend="candle")


@pytest.mark.parametrize("kwargs,error", [
    ({"backend": "torch"}, ruri.InputError),
    ({"precision": "int4"}, ruri.InputError),
    ({"backend": "candle", "precision": "int8"}, ruri.InputError),
    ({"whitespace": "trim"}, ruri.InputError),
    ({"device": "cuda:0"}, ruri.UnsupportedArgumentError),
    ({"revision": "main"}, ruri.InputError),  # a folder has no revisions
    ({"backend": "candle", "sessions": 2}, ruri.UnsupportedArgumentError),
    ({"sessions": 2}, ruri.UnsupportedArgumentError),  # the default backend, native, has none
    ({"runtime_path": "/lib/libonnxruntime.so"}, ruri.UnsupportedArgumentError),
    ({"backend": "ort", "sessions": 0}, ruri.InputError),
    ({"max_batch_tokens": 0}, ruri.InputError),
    ({"backend": 3}, ruri.InputTypeError),
])
def test_bad_constructor_arguments(kwargs, error):
    with pytest.raises(error):
        ruri.Embedder(TINY, **kwargs)


def test_model_must_be_a_path():
    with pytest.raises(ruri.InputTypeError):
        ruri.Embedder(None)


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_missing_onnx_runtime_is_a_typed_error_in_a_fresh_process():
    code = (
        "import ruri\n"
        "try:\n"
        f"    ruri.Embedder({str(TINY)!r}, backend='ort', precision='fp32')\n"
        "except ruri.RuntimeUnavailableError as e:\n"
        "    print('RuntimeUnavailableError', str(e).splitlines()[0])\n"
    )
    done = run_python(code, ORT_DYLIB_PATH="/nonexistent/libonnxruntime.so")
    assert done.returncode == 0, done.stderr
    assert "RuntimeUnavailableError ONNX Runtime could not be loaded" in done.stdout


def test_ort_without_the_onnxruntime_wheel_names_the_extra(tmp_path):
    # The wheel hidden (find_spec raises for a None entry in sys.modules), nothing in ruri's
    # own folder, no ORT_DYLIB_PATH: the error says which extra installs the library.
    code = (
        "import sys\n"
        "sys.modules['onnxruntime'] = None\n"
        "import ruri\n"
        "assert ruri.onnxruntime_library() is None\n"
        "try:\n"
        f"    ruri.Embedder({str(TINY)!r}, backend='ort', precision='fp32')\n"
        "except ruri.RuntimeUnavailableError as e:\n"
        "    print('RuntimeUnavailableError', str(e).splitlines()[-1])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DYLIB_PATH", "LD_LIBRARY_PATH")}
    env["RURI_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "RuntimeUnavailableError" in done.stdout, done.stdout
    assert "pip install 'ruri[ort]'" in done.stdout, done.stdout


def test_the_default_backend_needs_no_onnx_runtime_in_a_fresh_process():
    code = (
        "import ruri\n"
        f"m = ruri.Embedder({str(TINY)!r})\n"
        "print(m.backend, m.precision, m.encode(['瑠璃']).shape)\n"
        "print(ruri._ruri.Engine.loaded_runtime_path())\n"
        "try:\n"
        f"    ruri.Embedder({str(TINY)!r}, backend='ort')\n"
        "except ruri.RuntimeUnavailableError:\n"
        "    print('ort: RuntimeUnavailableError')\n"
    )
    done = run_python(code, ORT_DYLIB_PATH="/nonexistent/libonnxruntime.so")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["native int8 (1, 64)", "None",
                                        "ort: RuntimeUnavailableError"], done.stdout


def test_hostile_texts_never_crash_the_process():
    code = (
        "import ruri\n"
        f"m = ruri.Embedder({str(TINY)!r})\n"
        "texts = ['', ' ', '\\x00' * 5000, '\\u0301' * 3, '<s></s><pad>', '瑠' * 100000,\n"
        "         '\\U0010ffff' * 50, '\\n\\t\\r' * 1000]\n"
        "v = m.encode(texts, normalize_embeddings=True)\n"
        "print(v.shape)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(8, 64)"


# The loader's own refusal (ruri::EmbedderConfig::validate), word for word what ruri-server
# prints for --precision bf16 and --backend candle --precision int8
# (ruri-server/tests/front_ends.rs checks that the two front ends agree).
@pytest.mark.parametrize("kwargs,message", [
    ({"backend": "ort", "precision": "bf16"},
     "invalid option precision = bf16: ONNX Runtime runs fp32, int8 and fp16; "
     "bf16 needs backend candle"),
    ({"precision": "bf16"},
     "invalid option precision = bf16: the native engine runs fp32 and int8; fp16 and bf16 "
     "need backend candle (or ort for fp16)"),
    ({"backend": "candle", "precision": "int8"},
     "invalid option precision = int8: candle runs fp32, bf16 and fp16; "
     "int8 needs backend ort or native"),
])
def test_unsupported_combinations_get_the_loaders_error(kwargs, message):
    with pytest.raises(ruri.InputError) as e:
        ruri.Embedder(TINY, **kwargs)
    assert str(e.value) == message
