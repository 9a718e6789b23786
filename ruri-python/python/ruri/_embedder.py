"""``ruri.Embedder``: sentence-transformers' ``encode`` API over ruri's Rust engine."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence, Union

import numpy as np

from . import _ruri
from ._errors import (InputError, InputTypeError, RuntimeUnavailableError,
                      UnsupportedArgumentError)
from ._quantization import PRECISIONS, quantize_embeddings

__all__ = ["Embedder", "onnxruntime_library"]

logger = logging.getLogger("ruri")

Sentences = Union[str, Sequence[str], np.ndarray]

_DEFAULT_PRECISION = {"ort": "int8", "candle": "fp32", "native": "int8"}
_LIBRARY_PATTERNS = ("libonnxruntime.so.*", "libonnxruntime.so", "libonnxruntime.*.dylib",
                     "libonnxruntime.dylib", "onnxruntime.dll")


def onnxruntime_library() -> Optional[str]:
    """The ONNX Runtime shared library inside the installed ``onnxruntime`` wheel
    (``onnxruntime/capi/libonnxruntime.so.<version>``), or ``None`` if that package is not
    installed. Found without importing ``onnxruntime``."""
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        capi = Path(location) / "capi"
        for pattern in _LIBRARY_PATTERNS:
            hits = sorted(p for p in capi.glob(pattern) if p.is_file())
            if hits:
                return str(hits[-1])
    return None


def _check_positive_int(name: str, value: Any, allow_none: bool = True) -> Optional[int]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise InputError(f"{name} must be a positive integer, got {value}.")
    return int(value)


def _check_optional_str(name: str, value: Any) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise InputTypeError(f"{name} must be a str or None, got {type(value).__name__}")
    return value


def _as_text_list(sentences: Any) -> "tuple[list, bool]":
    """The texts as a list, and whether a single str was given (sentence-transformers'
    is_singular_input for text). Item types are checked by the engine, which names the
    offending index."""
    if isinstance(sentences, str):
        return [sentences], True
    if isinstance(sentences, list):
        return sentences, False
    if isinstance(sentences, np.ndarray):
        if sentences.ndim != 1:
            raise InputTypeError(
                f"sentences must be a str or a 1-D sequence of str, got a {sentences.ndim}-D array")
        return sentences.tolist(), False
    if sentences is None or isinstance(sentences, (bytes, bytearray, dict)) \
            or not isinstance(sentences, Iterable):
        raise InputTypeError(
            f"sentences must be a str or a sequence of str, got {type(sentences).__name__}")
    return list(sentences), False


class Embedder:
    """A Ruri v3 model on ruri's Rust engine, used like ``sentence_transformers.SentenceTransformer``.

    Args:
        model: A model folder (sentence-transformers layout: ``config.json``,
            ``tokenizer.json``, ``modules.json``, ``model.safetensors`` and/or ``onnx/*.onnx``;
            or an ONNX port such as sirasagi62/ruri-v3-30m-ONNX), or a Hugging Face Hub model
            id (``"cl-nagoya/ruri-v3-30m"``), downloaded into the standard Hugging Face cache
            (only the files the backend runs) or found there. An existing folder wins over an
            id of the same spelling.
        backend: ``None`` (default): :data:`ruri.DEFAULT_BACKEND`, the best backend of the
            build, ``"native"`` in the published wheel. ``"native"``: ruri's own pure-Rust
            engine (reads model.safetensors; no ONNX Runtime). ``"ort"``: ONNX Runtime (reads
            model.safetensors or the folder's ONNX files; a model with ONNX files only, such
            as an ONNX port, needs it). ``"candle"`` (reads model.safetensors; only in a
            build with it).
        precision: native: ``"int8"`` (default; exact integer kernels), ``"fp32"``. ort:
            ``"int8"`` (default; quantized at load from model.safetensors, else the
            quantized ONNX file), ``"fp32"``, ``"fp16"``. candle: ``"fp32"`` (default),
            ``"bf16"``, ``"fp16"``.
        whitespace: ``"keep"`` (default): prompt + text are tokenized as given, as
            sentence-transformers >= 5.4 does. ``"strip"``: stripped like Python's
            ``str.strip()``, as sentence-transformers 2.x-5.3 did (the versions Ruri v3 was
            trained and evaluated with; choose it to match an index built with them).
        device: ``None`` or ``"cpu"`` (ruri's Python package runs on the CPU).
        truncate_dim: Keep only the first ``truncate_dim`` dimensions of every vector
            (sentence-transformers' Matryoshka option); ``encode`` may override it.
        revision: A Hub branch, tag or commit (default ``"main"``); Hub ids only.
        cache_folder: The Hub cache (default: ``HF_HUB_CACHE`` / ``HF_HOME``, as
            ``huggingface_hub``).
        token: A Hub token (default: ``HF_TOKEN``, else the token file).
        local_files_only: Use the cache only, never the network (as ``HF_HUB_OFFLINE=1``).
        runtime_path: The ONNX Runtime shared library to load. Default: ``ORT_DYLIB_PATH``
            if set, else the library of the installed ``onnxruntime`` wheel, else ruri's own
            search (``~/.cache/ruri/onnxruntime-<version>/``, the system path).
        intra_threads: native: worker threads (default: one per core); ort: threads per
            session inside an operator (default: one per physical core).
        sessions: ort only: sessions run at once (default 1).
        max_batch_tokens: The padded-token budget per batch (default 8192).
        prequantized: native at int8 only: read ruri's int8 file,
            ``model.ruri-int8.safetensors`` (written by ``ruri quantize MODEL_DIR``), instead
            of quantizing ``model.safetensors`` at load: the same vectors, a faster load.
        attention: How attention's two products are computed: ``"f32"``, ``"bf16"`` (native
            only, at either precision): bfloat16 with float32 sums, about half the attention
            time on long texts on CPUs with AVX-512 BF16, or ``"int13"`` (native only): 13-bit
            integers with exact sums, the same speed as ``"f32"`` on short texts and half its
            attention time on long ones on CPUs with AVX-512 VNNI, closer to ``"f32"`` than
            ``"bf16"``; either gives the same vectors on every CPU, a little further from
            sentence-transformers'. Default (``None``): ``"int13"`` on native at int8 (the
            default backend and precision), else ``"f32"``.

    Raises:
        ModelLoadError: The folder is missing or unusable; the Hub id is unknown, not cached
            offline, or unreachable.
        RuntimeUnavailableError: ONNX Runtime cannot be loaded.
        InputError: An unknown backend, precision, whitespace policy or attention;
            ``prequantized`` with another backend or precision; ``attention="bf16"`` or
            ``"int13"`` with another backend.
        UnsupportedArgumentError: A non-CPU ``device``, or an ort-only option
            (``runtime_path``, ``sessions``; with candle also ``intra_threads``) on another
            backend, the default one included.
    """

    def __init__(
        self,
        model: Union[str, "os.PathLike[str]"],
        backend: Optional[str] = None,
        precision: Optional[str] = None,
        *,
        whitespace: str = "keep",
        device: Optional[str] = None,
        truncate_dim: Optional[int] = None,
        revision: Optional[str] = None,
        cache_folder: Optional[Union[str, "os.PathLike[str]"]] = None,
        token: Optional[str] = None,
        local_files_only: bool = False,
        runtime_path: Optional[Union[str, "os.PathLike[str]"]] = None,
        intra_threads: Optional[int] = None,
        sessions: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
        prequantized: bool = False,
        attention: Optional[str] = None,
    ) -> None:
        if not isinstance(model, (str, os.PathLike)):
            raise InputTypeError(
                f"model must be a folder path or a Hub id, got {type(model).__name__}")
        if backend is None:
            backend = _ruri.DEFAULT_BACKEND
        for name, value in (("backend", backend), ("whitespace", whitespace)):
            if not isinstance(value, str):
                raise InputTypeError(f"{name} must be a str, got {type(value).__name__}")
        for name, value in (("precision", precision), ("revision", revision),
                            ("token", token), ("attention", attention)):
            _check_optional_str(name, value)
        if device is not None and device != "cpu":
            raise UnsupportedArgumentError(
                f"device={device!r} is not supported: ruri's Python package runs on the CPU "
                "(device=None or 'cpu')")
        if backend != "ort":
            ort_only = [("runtime_path", runtime_path), ("sessions", sessions)]
            if backend != "native":
                ort_only.append(("intra_threads", intra_threads))
            for name, value in ort_only:
                if value is not None:
                    raise UnsupportedArgumentError(
                        f"{name} is an option of the ort backend, not of {backend!r}")
        self.truncate_dim = _check_positive_int("truncate_dim", truncate_dim)
        intra_threads = _check_positive_int("intra_threads", intra_threads)
        sessions = _check_positive_int("sessions", sessions)
        max_batch_tokens = _check_positive_int("max_batch_tokens", max_batch_tokens)
        path = os.fspath(model)
        if revision is not None and not _ruri.HUB:
            raise UnsupportedArgumentError("revision: this build of ruri has no Hub support")
        if precision is None:
            precision = _DEFAULT_PRECISION.get(backend, "fp32")
        # The ort backend's library: the onnxruntime wheel's (the `ort` extra), unless named.
        wheel_missing = False
        if runtime_path is None and backend == "ort" and not os.environ.get("ORT_DYLIB_PATH"):
            runtime_path = onnxruntime_library()
            wheel_missing = runtime_path is None
        try:
            self._engine = _ruri.Engine(
                path, backend, precision, whitespace,
                runtime_path=None if runtime_path is None else os.fspath(runtime_path),
                intra_threads=intra_threads, sessions=sessions,
                max_batch_tokens=max_batch_tokens, revision=revision,
                cache_folder=None if cache_folder is None else os.fspath(cache_folder),
                token=token, local_files_only=bool(local_files_only),
                prequantized=bool(prequantized), attention=attention,
            )
        except RuntimeUnavailableError as e:
            if not wheel_missing:
                raise
            raise RuntimeUnavailableError(
                f"{e}\nThe onnxruntime package is not installed: `pip install 'ruri[ort]'` "
                "installs the library backend='ort' loads.") from e

    # ------------------------------------------------------------------ sentence-transformers API

    def encode(
        self,
        sentences: Optional[Sentences] = None,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        output_value: Optional[str] = "sentence_embedding",
        precision: str = "float32",
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device: Optional[str] = None,
        normalize_embeddings: bool = False,
        truncate_dim: Optional[int] = None,
        pool: Optional[dict] = None,
        chunk_size: Optional[int] = None,
        **kwargs: Any,
    ) -> Union[np.ndarray, List[np.ndarray]]:
        """Embeds ``sentences`` as ``SentenceTransformer.encode`` does.

        Args:
            sentences: A str, or a list (tuple, 1-D array, any iterable) of str. Also accepted
                as ``inputs=`` (sentence-transformers 6's name).
            prompt_name: A name in :attr:`prompts` (``"query"``, ``"document"``,
                ``"topic"``, ``""`` for Ruri v3); ignored when ``prompt`` is given. Without
                either, the model's ``default_prompt_name`` applies (none for Ruri v3).
            prompt: A prompt text prepended to every sentence.
            batch_size: Most texts per batch (ruri also caps each batch's padded tokens, see
                ``max_batch_tokens``). Must be positive.
            show_progress_bar: ``None`` or ``False`` (no progress bar is drawn).
            output_value: Only ``"sentence_embedding"``.
            precision: ``"float32"`` (default), or ``"int8"``, ``"uint8"``, ``"binary"``,
                ``"ubinary"``: the vectors quantized as sentence-transformers does
                (:func:`ruri.quantize_embeddings`, int8/uint8 ranges from this call's vectors).
            convert_to_numpy: ``True`` (default): one float32 array. ``False``: a list of 1-D
                float32 arrays (sentence-transformers gives torch tensors there).
            convert_to_tensor: Only ``False``.
            device: ``None`` or ``"cpu"``.
            normalize_embeddings: L2-normalize the vectors (default ``False``: raw
                mean-pooled vectors, as sentence-transformers).
            truncate_dim: Keep the first ``truncate_dim`` dimensions (before normalization).
            pool, chunk_size: Only ``None`` (no multi-process encoding).
            **kwargs: ``task`` (as encode_query/encode_document pass; Ruri v3 has no Router,
                so it changes nothing, as in sentence-transformers) and ``inputs``. Any other
                keyword raises :class:`UnsupportedArgumentError`.

        Returns:
            For a str, a float32 array of shape ``(dim,)``; for a list of n texts, shape
            ``(n, dim)``; for an empty list, ``np.array([])`` (shape ``(0,)``), exactly as
            sentence-transformers returns.

        Raises:
            InputTypeError: ``sentences`` or one of its items is not a str.
            InputError: An unknown ``prompt_name``, a non-positive ``batch_size``, a text the
                tokenizer refuses.
            UnsupportedArgumentError: An argument or value listed above as unsupported.
            InferenceError: The backend failed.
        """
        if "inputs" in kwargs:
            if sentences is not None:
                raise InputTypeError("pass the texts as sentences or as inputs, not both")
            sentences = kwargs.pop("inputs")
        task = kwargs.pop("task", None)
        if task is not None and not isinstance(task, str):
            raise InputTypeError(f"task must be a str or None, got {type(task).__name__}")
        if kwargs:
            raise UnsupportedArgumentError(
                f"Embedder.encode() has been called with keyword arguments ruri does not "
                f"support: {sorted(kwargs)}")
        self._check_unsupported(show_progress_bar, output_value, precision, convert_to_tensor,
                                device, pool, chunk_size)
        batch_size = _check_positive_int("batch_size", batch_size, allow_none=False)
        truncate_dim = _check_positive_int("truncate_dim", truncate_dim)
        if truncate_dim is None:
            truncate_dim = self.truncate_dim
        _check_optional_str("prompt_name", prompt_name)
        _check_optional_str("prompt", prompt)
        if prompt is not None and prompt_name is not None:
            logger.warning("Provide either a `prompt`, a `prompt_name`, or neither, but not both. "
                           "Ignoring the `prompt_name` in favor of `prompt`.")
            prompt_name = None
        texts, singular = _as_text_list(sentences)
        if precision not in PRECISIONS:
            raise InputError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
        vectors = self._engine.embed(texts, prompt=prompt, prompt_name=prompt_name,
                                     normalize=bool(normalize_embeddings),
                                     batch_size=batch_size, truncate_dim=truncate_dim)
        if texts and precision != "float32":
            # As sentence-transformers: the ranges of int8/uint8 come from this call's vectors.
            vectors = quantize_embeddings(vectors, precision)
        if singular:
            return vectors[0]
        if not convert_to_numpy:
            return list(vectors)
        if not texts:
            # sentence-transformers: `np.array([])` for no inputs (float64, shape (0,)).
            return np.array([])
        return vectors

    def encode_query(self, sentences: Optional[Sentences] = None, prompt_name: Optional[str] = None,
                     prompt: Optional[str] = None, **kwargs: Any) -> Union[np.ndarray, List[np.ndarray]]:
        """:meth:`encode` with the ``"query"`` prompt (``"検索クエリ: "`` for Ruri v3) unless
        ``prompt_name`` or ``prompt`` is given, as sentence-transformers 5.x."""
        if prompt_name is None and prompt is None and "query" in self.prompts:
            prompt_name = "query"
        kwargs.setdefault("task", "query")
        return self.encode(sentences, prompt_name=prompt_name, prompt=prompt, **kwargs)

    def encode_document(self, sentences: Optional[Sentences] = None,
                        prompt_name: Optional[str] = None, prompt: Optional[str] = None,
                        **kwargs: Any) -> Union[np.ndarray, List[np.ndarray]]:
        """:meth:`encode` with the first of the ``"document"``, ``"passage"``, ``"corpus"``
        prompts the model has (``"検索文書: "`` for Ruri v3) unless ``prompt_name`` or
        ``prompt`` is given, as sentence-transformers 5.x."""
        if prompt_name is None and prompt is None:
            prompts = self.prompts
            for candidate in ("document", "passage", "corpus"):
                if candidate in prompts:
                    prompt_name = candidate
                    break
        kwargs.setdefault("task", "document")
        return self.encode(sentences, prompt_name=prompt_name, prompt=prompt, **kwargs)

    def similarity(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """Cosine similarity of every vector of ``embeddings1`` with every vector of
        ``embeddings2`` (each a 1-D or 2-D array, or a list of 1-D arrays): a float32 array of
        shape ``(n1, n2)``. sentence-transformers' default (``similarity_fn_name="cosine"``,
        Ruri's), returned as NumPy instead of a torch tensor."""
        a = _unit_rows(embeddings1, "embeddings1")
        b = _unit_rows(embeddings2, "embeddings2")
        return a @ b.T

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """Cosine similarity of ``embeddings1[i]`` with ``embeddings2[i]``: shape ``(n,)``."""
        a = _unit_rows(embeddings1, "embeddings1")
        b = _unit_rows(embeddings2, "embeddings2")
        if a.shape != b.shape:
            raise InputError(f"shapes differ: {a.shape} and {b.shape}")
        return np.einsum("ij,ij->i", a, b)

    def get_sentence_embedding_dimension(self) -> int:
        """Width of the vectors ``encode`` returns (``truncate_dim`` if set and smaller)."""
        dim = self._engine.dim
        return dim if self.truncate_dim is None else min(dim, self.truncate_dim)

    get_embedding_dimension = get_sentence_embedding_dimension

    @property
    def max_seq_length(self) -> int:
        """The longest input in tokens (prompt and special tokens included); longer ones are
        truncated, as sentence-transformers does. Read-only in ruri."""
        return self._engine.max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        raise UnsupportedArgumentError(
            "max_seq_length cannot be changed on a loaded ruri model (it comes from the "
            "folder's sentence_bert_config.json / tokenizer configuration)")

    def get_max_seq_length(self) -> int:
        """:attr:`max_seq_length`."""
        return self.max_seq_length

    @property
    def prompts(self) -> "dict[str, str]":
        """The named prompts: config_sentence_transformers.json's over Ruri v3's
        (``query``, ``document``, ``topic``, ``""``)."""
        return self._engine.prompts

    @property
    def default_prompt_name(self) -> Optional[str]:
        """config_sentence_transformers.json's ``default_prompt_name`` (``None`` for Ruri v3)."""
        return self._engine.default_prompt_name

    similarity_fn_name = "cosine"
    """The similarity :meth:`similarity` computes."""

    @property
    def device(self) -> str:
        """Always ``"cpu"``."""
        return "cpu"

    # ------------------------------------------------------------------ ruri's own

    @property
    def backend(self) -> str:
        """``"ort"`` or ``"candle"``."""
        return self._engine.backend

    @property
    def precision(self) -> str:
        """The model precision asked for (``"int8"``, ``"fp32"``, …)."""
        return self._engine.precision

    @property
    def whitespace(self) -> str:
        """``"keep"`` or ``"strip"``."""
        return self._engine.whitespace

    @property
    def attention(self) -> str:
        """How attention's products are computed: ``"f32"``, ``"bf16"`` or ``"int13"``."""
        return self._engine.attention

    @property
    def model_path(self) -> str:
        """The model as given: a folder or a Hub id."""
        return self._engine.model

    def token_counts(self, sentences: Sentences, prompt: Optional[str] = None) -> List[int]:
        """Tokens each text feeds the model (prompt and special tokens included, after
        truncation to :attr:`max_seq_length`)."""
        _check_optional_str("prompt", prompt)
        texts, _ = _as_text_list(sentences)
        return self._engine.token_counts(texts, prompt=prompt)

    def __repr__(self) -> str:
        return (f"ruri.Embedder({self.model_path!r}, backend={self.backend!r}, "
                f"precision={self.precision!r}, whitespace={self.whitespace!r}, "
                f"attention={self.attention!r}, "
                f"dim={self._engine.dim}, max_seq_length={self.max_seq_length})")

    @staticmethod
    def _check_unsupported(show_progress_bar: Any, output_value: Any, precision: Any,
                           convert_to_tensor: Any, device: Any, pool: Any, chunk_size: Any) -> None:
        def refuse(what: str) -> None:
            raise UnsupportedArgumentError(what)

        if show_progress_bar:
            refuse("show_progress_bar=True is not supported: ruri embeds a call in one Rust "
                   "call and draws no progress bar (pass None or False)")
        if output_value != "sentence_embedding":
            refuse(f"output_value={output_value!r} is not supported: ruri returns sentence "
                   "embeddings only (output_value='sentence_embedding')")
        if convert_to_tensor:
            refuse("convert_to_tensor=True is not supported: ruri returns NumPy arrays "
                   "(torch.from_numpy(array) wraps one without a copy)")
        if device is not None and device != "cpu":
            refuse(f"device={device!r} is not supported: ruri's Python package runs on the CPU")
        if pool is not None or chunk_size is not None:
            refuse("multi-process encoding (pool, chunk_size) is not supported: call encode "
                   "from several threads instead (it releases the GIL)")


def _unit_rows(embeddings: Any, name: str) -> np.ndarray:
    if isinstance(embeddings, (list, tuple)) and embeddings and not np.isscalar(embeddings[0]):
        embeddings = np.stack([np.asarray(e) for e in embeddings])
    array = np.asarray(embeddings)
    if array.dtype.kind not in "fiu":
        raise InputTypeError(f"{name} must hold numbers, got dtype {array.dtype}")
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise InputError(f"{name} must be 1-D or 2-D, got {array.ndim}-D")
    if array.dtype.kind != "f":
        array = array.astype(np.float32)
    # torch.nn.functional.normalize's eps, as sentence-transformers' cos_sim.
    norms = np.maximum(np.linalg.norm(array, axis=1, keepdims=True), 1e-12)
    return array / norms
