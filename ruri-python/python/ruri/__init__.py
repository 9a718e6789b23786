"""ruri: Ruri v3 Japanese text embeddings on ruri's Rust engine, with sentence-transformers' API.

::

    import ruri
    model = ruri.Embedder("cl-nagoya/ruri-v3-30m")        # or a folder; ruri's own engine, int8
    vectors = model.encode_document(["瑠璃は青い宝石です。"])  # float32, shape (1, 256)

:class:`Embedder` takes sentence-transformers' ``encode`` / ``encode_query`` /
``encode_document`` / ``similarity`` arguments, defaults and return shapes; the arguments it
does not implement raise :class:`UnsupportedArgumentError` (the README lists them). Calls
release the GIL while they tokenize and run, so threads embed concurrently.
"""

from ._errors import (
    InferenceError,
    InputError,
    InputTypeError,
    ModelLoadError,
    RuntimeUnavailableError,
    RuriError,
    UnsupportedArgumentError,
)
from ._ruri import BACKENDS, DEFAULT_BACKEND, HUB, ONNXRUNTIME_VERSION, __version__
from ._embedder import Embedder, onnxruntime_library
from ._quantization import quantize_embeddings

__all__ = [
    "Embedder",
    "onnxruntime_library",
    "quantize_embeddings",
    "BACKENDS",
    "DEFAULT_BACKEND",
    "HUB",
    "ONNXRUNTIME_VERSION",
    "RuriError",
    "ModelLoadError",
    "RuntimeUnavailableError",
    "InputError",
    "InputTypeError",
    "UnsupportedArgumentError",
    "InferenceError",
]
