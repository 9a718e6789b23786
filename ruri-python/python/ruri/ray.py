"""``ruri.ray``: Ruri v3 embeddings as a Ray Data stage, on one machine or a cluster.

:class:`Embed` is a callable class for ``Dataset.map_batches``: Ray Data starts a pool of
actors, each loads the model once (a :class:`ruri.Embedder`) and embeds the batches it is
given; :func:`embed_dataset` is that ``map_batches`` call with ruri's defaults. Needs Ray
(``pip install 'ruri[ray]'``); importing this module without it raises ``ImportError``
saying so. ::

    import ray
    import ruri.ray

    ray.init()                       # or ray.init(address="auto") on a cluster's node
    ds = ray.data.read_parquet("docs.parquet")               # a "text" column
    ds = ds.map_batches(
        ruri.ray.Embed,
        fn_constructor_kwargs={"model": "cl-nagoya/ruri-v3-30m", "task": "document"},
        compute=ray.data.ActorPoolStrategy(size=2),            # two actors ...
        num_cpus=1,                                            # ... of one CPU each
        batch_size=256,                                        # rows per call
    )
    ds.write_parquet("vectors/")     # the input columns and "embedding" (float32, dim wide)

The same code runs on a cluster: start it with ``ray start --head`` on one machine and
``ray start --address=HEAD:6379`` on the others (each with ruri installed), and connect the
driver with ``ray.init(address="auto")`` (or ``RAY_ADDRESS``); Ray Data places the actors on
the nodes' CPUs. Every node needs the model: a path they all see, or a Hub id (each node then
downloads it once into its Hugging Face cache).

Failures: Ray Data restarts an actor that dies (``max_restarts``, default -1: always) and
sends its unfinished batch again (``max_task_retries``, default -1), so a killed worker
neither loses nor duplicates rows (``tests_ray/test_ray.py`` kills one mid-run). Pass them to
``map_batches`` to change them. Embedding is deterministic per backend and precision, so a
retried batch gives the same vectors.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import numpy as np

try:
    import ray
    import ray.data
except ModuleNotFoundError as error:  # pragma: no cover - exercised without Ray installed
    raise ImportError(
        "ruri.ray needs Ray Data, which is not installed: pip install 'ruri[ray]' "
        "(or pip install 'ray[data]')") from error

from ._embedder import Embedder
from ._ruri import DEFAULT_BACKEND
from ._errors import InputError, InputTypeError

__all__ = ["Embed", "embed_dataset"]

_TASKS = ("query", "document")


def _assigned_cpus() -> Optional[int]:
    """The CPUs Ray reserved for this actor (its ``num_cpus``), at least 1; ``None`` outside
    a Ray worker."""
    try:
        context = ray.get_runtime_context()
        cpus = context.get_assigned_resources().get("CPU")
    except Exception:  # not in a worker, or an older Ray without assigned resources
        return None
    if not cpus:
        return None
    return max(1, int(cpus))


class Embed:
    """A Ray Data callable class: adds a column of float32 vectors to each batch.

    Use it as ``ds.map_batches(ruri.ray.Embed, fn_constructor_kwargs={...}, compute=...,
    num_cpus=..., batch_size=...)``; the constructor's arguments go in
    ``fn_constructor_kwargs``. It accepts the three batch formats of ``map_batches``
    (``"numpy"``/``"default"``, ``"pandas"``, ``"pyarrow"``).

    Args:
        model: A model folder every node can read, or a Hugging Face Hub id (as
            :class:`ruri.Embedder`).
        backend: As :class:`ruri.Embedder`: ``None`` (default) is
            :data:`ruri.DEFAULT_BACKEND` (``"native"``); or ``"ort"``, ``"candle"`` (if the
            wheel has it).
        precision: As :class:`ruri.Embedder` (``None``: the backend's default, int8 on native
            and ort).
        task: ``"query"`` (the ``"検索クエリ: "`` prompt, as ``encode_query``),
            ``"document"`` (``"検索文書: "``, as ``encode_document``) or ``None`` (no prompt
            unless ``prompt_name``/``prompt`` is given).
        prompt_name: A name of :attr:`ruri.Embedder.prompts` (``"topic"``, ``""``, …).
        prompt: A prompt text, prepended to every text (wins over ``prompt_name``).
        text_column: The input column of str (default ``"text"``).
        output_column: The column written (default ``"embedding"``): with numpy batches a
            2-D float32 array, which Ray stores as a fixed-shape tensor column of width
            ``dim``; with pandas batches one 1-D float32 array per row; with pyarrow batches a
            ``fixed_size_list<float32>[dim]``.
        normalize: L2-normalize the vectors (default ``False``: raw mean-pooled vectors, as
            ``encode``'s ``normalize_embeddings``).
        encode_batch_size: Texts per model batch inside one call (``encode``'s
            ``batch_size``, default 32). The rows per call are ``map_batches``'
            ``batch_size``.
        truncate_dim: Keep the first dimensions of each vector.
        intra_threads: Threads of one model run (ort and native). Default: the CPUs Ray
            reserved for the actor (``num_cpus``), so actors sharing a node do not
            oversubscribe it; outside Ray, the backend's default.
        **embedder_kwargs: Any other :class:`ruri.Embedder` argument (``whitespace``,
            ``attention``, ``prequantized``, ``revision``, ``cache_folder``,
            ``local_files_only``, ``max_batch_tokens``, …).

    Raises:
        ruri.InputError: An unknown ``task``, or (when called) a batch without
            ``text_column`` or with a non-str value in it (:class:`ruri.InputTypeError`).
        ruri.ModelLoadError: The model cannot be loaded on this node.
    """

    def __init__(self, model: Any, backend: Optional[str] = None,
                 precision: Optional[str] = None, *,
                 task: Optional[str] = None, prompt_name: Optional[str] = None,
                 prompt: Optional[str] = None, text_column: str = "text",
                 output_column: str = "embedding", normalize: bool = False,
                 encode_batch_size: int = 32, truncate_dim: Optional[int] = None,
                 intra_threads: Optional[int] = None, **embedder_kwargs: Any) -> None:
        if task is not None and task not in _TASKS:
            raise InputError(f"task={task!r} is not one of {', '.join(_TASKS)} (or None)")
        for name, value in (("text_column", text_column), ("output_column", output_column)):
            if not isinstance(value, str):
                raise InputTypeError(f"{name} must be a str, got {type(value).__name__}")
        if backend is None:
            backend = DEFAULT_BACKEND
        if intra_threads is None and backend in ("ort", "native"):
            intra_threads = _assigned_cpus()
        if intra_threads is not None:
            embedder_kwargs["intra_threads"] = intra_threads
        self.embedder = Embedder(model, backend, precision, truncate_dim=truncate_dim,
                                 **embedder_kwargs)
        self.task = task
        self.prompt_name = prompt_name
        self.prompt = prompt
        self.text_column = text_column
        self.output_column = output_column
        self.normalize = bool(normalize)
        self.encode_batch_size = encode_batch_size
        # Checked once here rather than failing on the first batch, on every actor.
        self.embedder.encode([], batch_size=encode_batch_size)

    def embed(self, texts: Any) -> np.ndarray:
        """The vectors of ``texts`` (a sequence of str) as this stage computes them: a
        float32 array ``(n, dim)``, also for ``n == 0``."""
        if isinstance(texts, np.ndarray):
            texts = texts.tolist()
        else:
            texts = list(texts)
        if not texts:
            return np.zeros((0, self.embedder.get_sentence_embedding_dimension()), np.float32)
        encode = {"query": self.embedder.encode_query,
                  "document": self.embedder.encode_document}.get(self.task, self.embedder.encode)
        return encode(texts, prompt_name=self.prompt_name, prompt=self.prompt,
                      batch_size=self.encode_batch_size,
                      normalize_embeddings=self.normalize)

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, dict):
            batch = dict(batch)  # the input batch may be a read-only view: add to a copy
            batch[self.output_column] = self.embed(self._column(batch, list(batch)))
            return batch
        try:
            import pyarrow as pa
        except ModuleNotFoundError:  # pragma: no cover - Ray Data depends on pyarrow
            pa = None
        if pa is not None and isinstance(batch, pa.Table):
            vectors = self.embed(self._column(batch, batch.column_names).to_pylist())
            column = pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.reshape(-1), type=pa.float32()), vectors.shape[1])
            if self.output_column in batch.column_names:
                batch = batch.drop_columns([self.output_column])
            return batch.append_column(self.output_column, column)
        # pandas.DataFrame (batch_format="pandas")
        if hasattr(batch, "columns") and hasattr(batch, "assign"):
            vectors = self.embed(self._column(batch, list(batch.columns)).tolist())
            return batch.assign(**{self.output_column: list(vectors)})
        raise InputTypeError(
            f"ruri.ray.Embed takes numpy, pandas or pyarrow batches, got {type(batch).__name__}")

    def _column(self, batch: Any, columns: list) -> Any:
        if self.text_column not in columns:
            raise InputError(
                f"the batch has no column {self.text_column!r} (columns: {columns}); "
                "set text_column")
        return batch[self.text_column]


def embed_dataset(dataset: "ray.data.Dataset", model: Any, *, workers: int = 1,
                  num_cpus: float = 1, batch_size: int = 256,
                  map_batches_kwargs: Optional[Dict[str, Any]] = None,
                  **embed_kwargs: Any) -> "ray.data.Dataset":
    """``dataset`` with a column of vectors: ``map_batches(Embed, ...)`` on a fixed pool of
    ``workers`` actors of ``num_cpus`` CPUs each, ``batch_size`` rows per call.

    ``embed_kwargs`` go to :class:`Embed` (``backend``, ``precision``, ``task``,
    ``text_column``, ``output_column``, ``normalize``, …); ``map_batches_kwargs`` to
    ``Dataset.map_batches`` (e.g. ``{"max_restarts": 3}``). Lazy, as ``map_batches``."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"workers must be a positive integer, got {workers!r}")
    kwargs: Dict[str, Any] = {
        "compute": ray.data.ActorPoolStrategy(size=workers),
        "num_cpus": num_cpus,
        "batch_size": batch_size,
    }
    kwargs.update(map_batches_kwargs or {})
    return dataset.map_batches(Embed, fn_constructor_kwargs={"model": os.fspath(model)
                                                             if isinstance(model, os.PathLike)
                                                             else model, **embed_kwargs},
                               **kwargs)
