#!/usr/bin/env python3
"""Whitespace references: what sentence-transformers feeds the model for inputs with leading,
trailing, internal and only whitespace, in a version that strips every input (5.3.0,
`.venv-testdata-st53`) and one that keeps it (6.2.0, `.venv-testdata`).

sentence-transformers 2.x-5.3 run `str(s).strip()` on prompt + text in
`Transformer.tokenize` (the prompt is prepended in `encode()` first, so the prompt's own
trailing space goes too when the text is empty or whitespace); 5.4.0 and 6.x do not.

  make_whitespace_references.py --write-inputs testdata/whitespace_inputs.json
  make_whitespace_references.py --model-dir testdata/tiny --model-dir-label testdata/tiny \
      --inputs testdata/whitespace_inputs.json --behaviour keep|strip --out FILE --command CMD

The reference format is the one of testdata/reference/tiny.json (make_references.py) without
the ONNX fields, plus `behaviour`, `python_whitespace`, `python_version` at the top and
`tokenized_text` per item (the exact string tokenizer.json was given). `--behaviour` is what
the installed sentence-transformers must do; the script checks it by behaviour first and
fails if the environment is the wrong one. Run by tools/testdata/generate_whitespace.sh.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys
from pathlib import Path

PROMPTS = {"query": "検索クエリ: ", "document": "検索文書: ", "topic": "トピック: ", "": ""}
PROMPT_NAMES = ["", "query", "document", "topic"]
# Characters Python's str.strip() does NOT remove but that look like (or act as) whitespace.
LOOKALIKES = {
    0x200B: "zero_width_space",
    0x180E: "mongolian_vowel_separator",
    0xFEFF: "bom",
    0x2060: "word_joiner",
    0x00AD: "soft_hyphen",
}
SHORT_TEXTS = ["瑠璃色の空", "猫が昼寝をしている", "東京の天気", "図書館で本を借りる"]


def python_whitespace() -> list[int]:
    """Every code point str.strip() (no argument) removes, checked both ways."""
    by_isspace = [c for c in range(0x110000) if chr(c).isspace()]
    by_strip = [c for c in range(0x110000) if (chr(c) + "a" + chr(c)).strip() == "a"]
    assert by_isspace == by_strip, (by_isspace, by_strip)
    return by_isspace


# ---------------------------------------------------------------------------------------
# Inputs


def make_inputs() -> list[dict]:
    ws = python_whitespace()
    items: list[dict] = []

    def add(id_: str, prompt_name: str, text: str) -> None:
        assert prompt_name in PROMPTS and all(i["id"] != id_ for i in items), id_
        items.append({"id": id_, "prompt_name": prompt_name, "text": text})

    # Every character str.strip() removes, leading and trailing; prompts rotated.
    for k, c in enumerate(ws):
        ch = chr(c)
        add(f"strip_u{c:04x}", PROMPT_NAMES[k % 4], ch + SHORT_TEXTS[k % len(SHORT_TEXTS)] + ch)
    # The same characters with no prompt, so each is also stripped where it leads the whole
    # string (after a prompt a leading one is inside prompt + text and stays).
    for k, c in enumerate(ws):
        ch = chr(c)
        add(f"strip_u{c:04x}_alone", "", ch + SHORT_TEXTS[(k + 1) % len(SHORT_TEXTS)] + ch)
    # Lookalikes str.strip() keeps, leading and trailing.
    for k, (c, name) in enumerate(LOOKALIKES.items()):
        ch = chr(c)
        add(f"keep_{name}", PROMPT_NAMES[k % 4], ch + SHORT_TEXTS[k % len(SHORT_TEXTS)] + ch)
    # A lookalike outside whitespace stops the strip; inside it, only the spaces go.
    add("zwsp_outside_spaces", "", "\u200b 瑠璃色の空 \u200b")
    add("spaces_outside_zwsp", "query", " \u200b瑠璃色の空\u200b ")
    add("only_zwsp", "", "\u200b")
    add("only_bom", "document", "\ufeff")
    add("ideographic_spaces_around_zwsp", "", "\u3000\u200b\u3000")
    # Empty and whitespace-only texts with every prompt: stripping prompt + text also takes
    # the prompt's own trailing space.
    only = [
        ("empty", ""),
        ("space", " "),
        ("newline", "\n"),
        ("ideographic_space", "\u3000"),
        ("crlf_tab", "\r\n\t"),
        ("all_whitespace", "".join(chr(c) for c in ws)),
    ]
    for name, text in only:
        for p in PROMPT_NAMES:
            add(f"{name}_{p or 'plain'}", p, text)
    # Internal whitespace: kept by both.
    add("internal_whitespace", "", "瑠璃 色の\u3000空\tと\n海、  二つの\r\nスペース")
    add("internal_whitespace_query", "query", "東京\u3000の 天気\tは？")
    # A document as read from a file: one trailing newline.
    add("document_trailing_newline", "document",
        "日本の首都は東京です。東京は政治と経済の中心地です。\n")
    add("document_indented_paragraphs", "document",
        "  字下げした段落です。\n\n  二つ目の段落です。\n\n")
    # Long-ish, whitespace at both ends.
    body = ("新しい図書館は駅から歩いて五分のところにあり、夜九時まで開いています。"
            "文章の意味を数値のベクトルで表すと、似た内容の文書を素早く探せるようになります。\n"
            "今朝は少し早起きして、近所の公園を三十分ほど散歩しました。"
            "桜の花びらが風に舞って、川の水面をゆっくりと流れていきます。 ")
    add("long_both_ends", "document", "\n\u3000 " + body * 3 + "\t\n\n")
    add("long_both_ends_plain", "", " \r\n" + body * 2 + "\u3000\u3000")
    return items


def visible_json(obj) -> str:
    """JSON with the non-ASCII text readable but every invisible or whitespace character
    other than the ASCII space escaped, so the files show what they hold."""
    s = json.dumps(obj, indent=1 if isinstance(obj, dict) else 2, ensure_ascii=False)
    out = []
    for ch in s:
        if ch in " \n" or (ch.isprintable() and not ch.isspace()):
            out.append(ch)
        else:
            out.append(json.dumps(ch, ensure_ascii=True)[1:-1])  # \uXXXX (pair if astral)
    text = "".join(out) + "\n"
    assert json.loads(text) == obj
    return text


# ---------------------------------------------------------------------------------------
# References


def f32_list(v) -> list[float]:
    import numpy as np
    return [float(x) for x in np.asarray(v, dtype=np.float32)]


def compare(keep_path: Path, strip_path: Path, model_dir: Path | None) -> None:
    """The two files against each other: same inputs; the strip file is the keep file with
    Python-stripped input (ids from this environment's tokenizers on its tokenized_text);
    where both fed the same ids, the two torch/transformers versions give the same vectors."""
    import numpy as np
    from tokenizers import Tokenizer

    keep = json.loads(keep_path.read_text(encoding="utf-8"))
    strip = json.loads(strip_path.read_text(encoding="utf-8"))
    assert (keep["behaviour"], strip["behaviour"]) == ("keep", "strip")
    assert keep["python_whitespace"] == strip["python_whitespace"] == python_whitespace()
    assert keep["model_dir"] == strip["model_dir"] and keep["dim"] == strip["dim"]
    raw_tok = Tokenizer.from_file(str((model_dir or Path(keep["model_dir"])) / "tokenizer.json"))
    same, differ, worst_diff, worst_cos = 0, [], 0.0, 1.0
    for k, s in zip(keep["items"], strip["items"], strict=True):
        assert [k[f] for f in ("id", "prompt_name", "prompt", "text")] == \
            [s[f] for f in ("id", "prompt_name", "prompt", "text")], k["id"]
        full = k["prompt"] + k["text"]
        assert k["tokenized_text"] == full and s["tokenized_text"] == full.strip(), k["id"]
        assert s["untruncated_token_ids"] == raw_tok.encode(full.strip()).ids, k["id"]
        assert k["untruncated_token_ids"] == raw_tok.encode(full).ids, k["id"]
        if k["token_ids"] == s["token_ids"]:
            same += 1
            for kind in ("mean", "normalized"):
                a = np.asarray(k["st_fp32"][kind], dtype=np.float64)
                b = np.asarray(s["st_fp32"][kind], dtype=np.float64)
                worst_diff = max(worst_diff, float(np.max(np.abs(a - b))))
                worst_cos = min(worst_cos, float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
        else:
            differ.append(k["id"])
    print(f"compare: {len(keep['items'])} items, token ids differ on {len(differ)}, "
          f"same on {same}; same ids -> st_fp32 max |diff| {worst_diff:.3g}, "
          f"min cosine 1 - {1 - worst_cos:.3g} (keep {keep['generator']['versions']['transformers']}"
          f" vs strip {strip['generator']['versions']['transformers']})")
    assert worst_diff <= 1e-5 and worst_cos >= 0.99999, (worst_diff, worst_cos)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-inputs", type=Path, help="write the inputs JSON and exit")
    ap.add_argument("--model-dir", type=Path)
    ap.add_argument("--model-dir-label", help="model_dir as written in the JSON")
    ap.add_argument("--inputs", type=Path)
    ap.add_argument("--behaviour", choices=["keep", "strip"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--command", help="generator command recorded in the JSON")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("KEEP_JSON", "STRIP_JSON"),
                    help="check the two reference files against each other and exit")
    args = ap.parse_args()

    if args.write_inputs:
        items = make_inputs()
        args.write_inputs.write_text(visible_json(items), encoding="utf-8")
        print(f"inputs: {len(items)} items -> {args.write_inputs}")
        return
    if args.compare:
        compare(*args.compare, args.model_dir)
        return
    for a in ["model_dir", "model_dir_label", "inputs", "behaviour", "out", "command"]:
        if getattr(args, a) is None:
            ap.error(f"--{a.replace('_', '-')} is required")

    from importlib.metadata import version

    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = SentenceTransformer(str(args.model_dir), device="cpu")
    # The test folders' tokenizer_config.json (PreTrainedTokenizerFast) names no
    # model_input_names, so transformers 4 emits token_type_ids, which sentence-transformers
    # 5.3 passes on and transformers 4's ModernBertModel.forward rejects. The published Ruri
    # tokenizer (LlamaTokenizerFast) emits only input_ids and attention_mask; say the same.
    # The token ids do not change.
    tokenizer_kwargs = None
    forward_params = inspect.signature(model[0].auto_model.forward).parameters
    if ("token_type_ids" in model[0].tokenizer.model_input_names
            and "token_type_ids" not in forward_params
            and not any(p.kind is p.VAR_KEYWORD for p in forward_params.values())):
        tokenizer_kwargs = {"model_input_names": ["input_ids", "attention_mask"]}
        model = SentenceTransformer(str(args.model_dir), device="cpu",
                                    tokenizer_kwargs=tokenizer_kwargs)
        print(f"token_type_ids not accepted by the model: reloaded with {tokenizer_kwargs}")
    model.eval()
    assert model.prompts == PROMPTS, model.prompts
    max_len = model.max_seq_length
    dim = (model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension")
           else model.get_sentence_embedding_dimension())
    st_tok = type(model[0].tokenizer).__name__
    st_version = version("sentence-transformers")
    print(f"sentence-transformers {st_version}, transformers {version('transformers')}: "
          f"loaded {args.model_dir}: max_seq_length={max_len} dim={dim} tokenizer={st_tok} "
          f"modules={[type(m).__name__ for m in model]}")
    raw_tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))

    fed: list[torch.Tensor] = []
    model[0].register_forward_pre_hook(
        lambda _module, a, kw: fed.append((a[0] if a else kw["features"])["input_ids"].clone()),
        with_kwargs=True)

    def encode(text: str, prompt: str, normalize: bool):
        fed.clear()
        v = model.encode([text], prompt=prompt, batch_size=1, convert_to_numpy=True,
                         normalize_embeddings=normalize)[0]
        assert len(fed) == 1 and fed[0].shape[0] == 1
        return v, fed[0][0].tolist()

    # Which behaviour is installed, by behaviour: the ids fed for "瑠璃 " vs "瑠璃".
    _, with_space = encode("瑠璃 ", "", False)
    _, without = encode("瑠璃", "", False)
    _, prompt_only = encode(" ", "検索クエリ: ", False)
    observed = "strip" if with_space == without else "keep"
    print(f"behaviour check: ids('瑠璃 ')={with_space} ids('瑠璃')={without} "
          f"ids(query prompt + ' ')={prompt_only} -> {observed}")
    assert observed == args.behaviour, (
        f"sentence-transformers {st_version} does {observed!r}, expected {args.behaviour!r}: "
        f"wrong environment")
    if observed == "strip":
        assert prompt_only == raw_tok.encode("検索クエリ:").ids, prompt_only
    else:
        assert with_space == raw_tok.encode("瑠璃 ").ids != without, with_space

    ws = python_whitespace()
    inputs = json.loads(args.inputs.read_text(encoding="utf-8"))
    items = []
    for inp in inputs:
        prompt = PROMPTS[inp["prompt_name"]]
        full = prompt + inp["text"]
        tokenized = full.strip() if args.behaviour == "strip" else full
        untruncated = raw_tok.encode(tokenized).ids
        truncated = len(untruncated) > max_len
        st, ids = encode(inp["text"], prompt, False)
        st_n, ids_n = encode(inp["text"], prompt, True)
        assert ids == ids_n, inp["id"]
        # What sentence-transformers fed the model is tokenizer.json on prompt + text, Python
        # str.strip()ped in the strip environment, truncated keeping </s>.
        expected = untruncated[:max_len - 1] + [2] if truncated else untruncated
        assert ids == expected, (inp["id"], ids, expected)
        items.append({
            "id": inp["id"], "prompt_name": inp["prompt_name"], "prompt": prompt,
            "text": inp["text"], "tokenized_text": tokenized,
            "token_ids": ids, "untruncated_token_ids": untruncated, "truncated": truncated,
            "st_fp32": {"mean": f32_list(st), "normalized": f32_list(st_n)},
        })
        print(f"  {inp['id']}: {len(ids)} tokens"
              f"{f' (truncated from {len(untruncated)})' if truncated else ''}"
              f"{' (stripped)' if tokenized != full else ''}")

    versions = {}
    for p in ["torch", "transformers", "sentence-transformers", "tokenizers", "numpy",
              "safetensors", "huggingface_hub", "scipy", "scikit-learn"]:
        versions[p.replace("-", "_")] = version(p)
    doc = {
        "generator": {
            "command": args.command,
            "versions": versions,
            "st_tokenizer_class": st_tok,
            "st_tokenizer_kwargs": tokenizer_kwargs,
        },
        "model_dir": args.model_dir_label,
        "max_seq_length": max_len,
        "dim": dim,
        "behaviour": args.behaviour,
        "python_whitespace": ws,
        "python_version": platform.python_version(),
        "items": items,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(visible_json(doc), encoding="utf-8")
    n_stripped = sum(i["tokenized_text"] != i["prompt"] + i["text"] for i in items)
    print(f"references ({args.behaviour}, python {sys.version.split()[0]}): {len(items)} items, "
          f"{n_stripped} changed by stripping -> {args.out}")


if __name__ == "__main__":
    main()
