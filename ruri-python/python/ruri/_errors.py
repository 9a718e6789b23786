"""ruri's exceptions: one base class, :class:`RuriError`, and a subclass per kind of failure.

Errors from the Rust engine keep ruri's message (the ``ruri::Error`` text, then each cause on
its own ``caused by:`` line). Where sentence-transformers raises a built-in exception for the
same mistake, the ruri class also derives from it, so ``except ValueError`` code keeps working.

::

    RuriError
    ├── ModelLoadError            the folder is missing, incomplete or unusable
    ├── RuntimeUnavailableError   the ONNX Runtime library cannot be found or loaded
    ├── InputError (ValueError)   a text or an option the engine refuses
    │   ├── InputTypeError (TypeError)        an input that is not a str (None, bytes, int…)
    │   └── UnsupportedArgumentError          a sentence-transformers argument ruri lacks
    └── InferenceError (RuntimeError)         the backend failed while embedding
"""

from __future__ import annotations

__all__ = [
    "RuriError",
    "ModelLoadError",
    "RuntimeUnavailableError",
    "InputError",
    "InputTypeError",
    "UnsupportedArgumentError",
    "InferenceError",
]


class RuriError(Exception):
    """Base class of every error ruri raises."""


class ModelLoadError(RuriError):
    """The model folder cannot be loaded: a missing file (``missing file …``, ``no int8 ONNX
    file in …``), unreadable or invalid JSON, a configuration or tokenizer ruri cannot use, a
    model kind it does not run (a reranker, CLS pooling…), or a backend that refuses the
    weights."""


class RuntimeUnavailableError(RuriError):
    """The ONNX Runtime shared library could not be found or loaded (``backend="ort"``). The
    ``onnxruntime`` wheel of the ``ort`` extra (``pip install 'ruri[ort]'``) provides it; the
    message says what else works."""


class InputError(RuriError, ValueError):
    """A text or an option the engine refuses: an unknown prompt name, a text over the
    maximum length under an error policy, an invalid option value. Also a ``ValueError``, as
    sentence-transformers raises for the same mistakes."""


class InputTypeError(InputError, TypeError):
    """An input that is not a ``str`` (``None``, ``bytes``, a number…) where texts are
    expected. Both a ``TypeError`` and, as in sentence-transformers, a ``ValueError``."""


class UnsupportedArgumentError(InputError):
    """A sentence-transformers argument or value ruri does not implement (``output_value``,
    ``convert_to_tensor=True``, quantized ``precision``, a non-CPU ``device``, multi-process
    ``pool``…): raised rather than silently ignored."""


class InferenceError(RuriError, RuntimeError):
    """The backend failed while embedding (an ONNX Runtime or candle error, or an output of
    the wrong shape)."""
