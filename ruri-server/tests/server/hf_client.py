"""Calls ruri-server through huggingface_hub's InferenceClient, as LangChain's
HuggingFaceEndpointEmbeddings, LlamaIndex and Haystack do for a text-embeddings-inference
endpoint: `InferenceClient(model=URL).feature_extraction(...)`, which posts TEI's `/embed`
body to the URL itself (`POST /`).

Run by `tei.rs` (the Rust test decides every case and checks every answer; nothing is
compared here). stdin: `{"url": ..., "token": ... or null, "cases": [{"text": str | [str],
"kwargs": {...}}, ...]}`; stdout: one JSON object per case, in order: `{"shape", "dtype",
"values"}` or, for an HTTP error, `{"status", "body"}`.
"""

import json
import sys

import huggingface_hub
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError


def main() -> None:
    request = json.load(sys.stdin)
    client = InferenceClient(model=request["url"], token=request["token"], timeout=60)
    answers = []
    for case in request["cases"]:
        try:
            vectors = client.feature_extraction(case["text"], **case["kwargs"])
        except HfHubHTTPError as error:
            response = error.response
            answers.append({"status": response.status_code, "body": response.json()})
            continue
        answers.append(
            {"shape": list(vectors.shape), "dtype": str(vectors.dtype), "values": vectors.tolist()}
        )
    print(json.dumps({"huggingface_hub": huggingface_hub.__version__, "answers": answers}))


if __name__ == "__main__":
    main()
