"""Type stubs of the extension module ``ruri._ruri`` (ruri-python/src/lib.rs)."""

from typing import Any, Dict, List, Optional

import numpy as np
import numpy.typing as npt

__version__: str
BACKENDS: List[str]
DEFAULT_BACKEND: str
ONNXRUNTIME_VERSION: str
HUB: bool

class Engine:
    """A loaded model: ruri's TextEmbedder. Use ``ruri.Embedder``, which checks arguments."""

    def __init__(
        self,
        model: str,
        backend: str,
        precision: str,
        whitespace: str,
        runtime_path: Optional[str] = None,
        intra_threads: Optional[int] = None,
        sessions: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
        revision: Optional[str] = None,
        cache_folder: Optional[str] = None,
        token: Optional[str] = None,
        local_files_only: bool = False,
        prequantized: bool = False,
        attention: Optional[str] = None,
    ) -> None: ...
    def embed(
        self,
        sentences: List[str],
        prompt: Optional[str] = None,
        prompt_name: Optional[str] = None,
        normalize: bool = False,
        batch_size: int = 32,
        truncate_dim: Optional[int] = None,
    ) -> npt.NDArray[np.float32]: ...
    def token_counts(self, sentences: List[str], prompt: Optional[str] = None) -> List[int]: ...
    @property
    def dim(self) -> int: ...
    @property
    def max_length(self) -> int: ...
    @property
    def prompts(self) -> Dict[str, str]: ...
    @property
    def default_prompt_name(self) -> Optional[str]: ...
    @property
    def model(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def whitespace(self) -> str: ...
    @property
    def attention(self) -> str: ...
    @staticmethod
    def loaded_runtime_path() -> Optional[str]: ...

def quantize(
    vectors: npt.NDArray[np.float32],
    precision: str,
    ranges: Optional[npt.NDArray[np.float32]] = None,
    calibration: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[Any]: ...
