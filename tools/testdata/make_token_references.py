#!/usr/bin/env python3
"""Token references for `POST /tokenize`: what text-embeddings-inference answers for each
committed input, computed with Python's `tokenizers` (the engine TEI runs, in its Python
binding) on the tiny model's `tokenizer.json`.

  make_token_references.py --model-dir testdata/tiny --model-dir-label testdata/tiny \
      --inputs testdata/inputs.json testdata/hostile_inputs.json \
      --max-chars 300 --out testdata/reference/tiny_tokens.json

TEI's `/tokenize` (router/src/http/server.rs, core/src/tokenization.rs `into_tokens`):
prompt + text is encoded with `add_special_tokens` as asked and no truncation; each token is
`{id, text, special, start, stop}` where `special` is the special-tokens mask, a special token
has its vocabulary string as `text` and no offsets, and any other token has the UTF-8 *byte*
offsets of its span in prompt + text and those bytes (decoded with replacement) as `text`.
Python's binding reports character offsets; they are turned into byte offsets here.

Versions: tools/testdata/requirements.txt (tokenizers 0.23.3). Nothing here is random.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tokenizers


def tei_tokens(tokenizer: tokenizers.Tokenizer, text: str, add_special_tokens: bool) -> list[dict]:
    encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    data = text.encode("utf-8")
    # Character offset -> byte offset in `text` (one entry past the end).
    byte_at = [0]
    for ch in text:
        byte_at.append(byte_at[-1] + len(ch.encode("utf-8")))
    tokens = []
    for id_, (start, stop), special, piece in zip(
        encoding.ids, encoding.offsets, encoding.special_tokens_mask, encoding.tokens
    ):
        if special == 1:
            tokens.append({"id": id_, "text": piece, "special": True, "start": None, "stop": None})
        else:
            b_start, b_stop = byte_at[start], byte_at[stop]
            tokens.append(
                {
                    "id": id_,
                    "text": data[b_start:b_stop].decode("utf-8", errors="replace"),
                    "special": False,
                    "start": b_start,
                    "stop": b_stop,
                }
            )
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--model-dir-label", required=True)
    parser.add_argument("--inputs", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    # The long inputs (thousands of tokens) would make the file megabytes without testing
    # anything the shorter ones do not.
    parser.add_argument("--max-chars", type=int, default=300, help="skip longer texts")
    args = parser.parse_args()

    tokenizer = tokenizers.Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    st_config = json.loads((args.model_dir / "config_sentence_transformers.json").read_text("utf-8"))
    prompts = st_config["prompts"]

    items = []
    for path in args.inputs:
        for item in json.loads(path.read_text("utf-8")):
            if len(item["text"]) > args.max_chars:
                continue
            prompt = prompts[item["prompt_name"]]
            for add_special_tokens in (True, False):
                items.append(
                    {
                        "id": item["id"],
                        "prompt_name": item["prompt_name"],
                        "prompt": prompt,
                        "text": item["text"],
                        "add_special_tokens": add_special_tokens,
                        "tokens": tei_tokens(tokenizer, prompt + item["text"], add_special_tokens),
                    }
                )
    out = {
        "generator": "tools/testdata/make_token_references.py",
        "tokenizers": tokenizers.__version__,
        "model_dir": args.model_dir_label,
        "inputs": [str(p) for p in args.inputs],
        "max_chars": args.max_chars,
        "items": items,
    }
    args.out.write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n", "utf-8")


if __name__ == "__main__":
    main()
