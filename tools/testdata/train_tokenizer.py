#!/usr/bin/env python3
"""Train a SentencePiece Unigram tokenizer shaped like Ruri v3's and write HF tokenizer files.

Shape copied from the published Ruri v3 tokenizer (see testdata/README.md):
  ids  <unk> 0, <s> 1, </s> 2, <pad> 3, <sep> 4, <mask> 5, <cls> 6, then <0x00>..<0xFF>,
       then ordinary pieces;
  no normalizer; Metaspace(▁, prepend_scheme="never", split=False); byte fallback;
  post-processor "<s> $A </s>"; the 7 specials as special added tokens and a few existing
  pieces (NON_SPECIAL_ADDED) as non-special added tokens, as the published
  tokenizer_config.json lists added tokens beyond the specials.

Writes into --out-dir: tokenizer.json, tokenizer_config.json, special_tokens_map.json
(and spm.model / spm.vocab into --work-dir, which is not committed).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import sentencepiece as spm
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<sep>", "<mask>", "<cls>"]
# Non-special added tokens. The published Ruri v3 tokenizer_config.json lists added tokens
# beyond the 7 specials; an added token is matched in the raw text BEFORE the Unigram model
# runs, so "教えてください" becomes 教 / えて / ください even where Unigram alone would pick
# another segmentation: a Rust tokenizer that ignored non-special added tokens would give
# different ids. Fixed list (deterministic): two common endings and two frequent pieces of
# testdata/inputs.json; each must already be an ordinary piece of the trained vocabulary
# (asserted), so they keep their Unigram ids and vocab_size does not change. None is a
# substring of another, so no overlap rule decides anything.
NON_SPECIAL_ADDED = ["です", "ます", "して", "ください"]
PROMPTS = {"query": "検索クエリ: ", "document": "検索文書: ", "topic": "トピック: ", "": ""}
META = "\u2581"  # ▁, SentencePiece's whitespace marker


def train_spm(corpus: Path, prefix: Path, vocab_size: int, seed: int) -> None:
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        model_type="unigram",
        vocab_size=vocab_size,
        # A large vocabulary may exceed what the corpus supports; take what it gives and
        # pad deterministically afterwards (pad_vocab).
        hard_vocab_limit=False,
        character_coverage=0.9995,
        byte_fallback=True,
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        control_symbols=["<sep>", "<mask>", "<cls>"],
        # One thread and no sampling: the EM statistics are then summed in a fixed order.
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        max_sentence_length=1 << 16,
        minloglevel=2,
    )


def pad_vocab(pieces: list[tuple[str, float]], corpus: Path, target: int) -> list[tuple[str, float]]:
    """Append frequent corpus substrings not yet in the vocabulary, below every real score.

    Only used when SentencePiece returns fewer pieces than asked. Candidates are character
    2..6-grams inside whitespace-free runs (a run after a space gets the ▁ prefix, as
    SentencePiece pieces do), ranked by (count desc, string asc) so the result is fixed.
    """
    need = target - len(pieces)
    if need <= 0:
        return pieces
    have = {p for p, _ in pieces}
    counts: collections.Counter[str] = collections.Counter()
    with corpus.open(encoding="utf-8") as f:
        for line in f:
            text = line.rstrip("\n").replace(" ", META)
            # Split before each ▁ so candidates never straddle a word boundary.
            for run in text.replace(META, "\n" + META).split("\n"):
                for n in range(2, 7):
                    for i in range(len(run) - n + 1):
                        gram = run[i:i + n]
                        if META in gram[1:]:
                            continue
                        counts[gram] += 1
    candidates = sorted(((c, g) for g, c in counts.items() if g not in have and c >= 2),
                        key=lambda cg: (-cg[0], cg[1]))
    if len(candidates) < need:
        raise SystemExit(f"cannot pad vocabulary: need {need}, have {len(candidates)}")
    floor = min(s for p, s in pieces[len(SPECIALS) + 256:])
    extra = [(g, floor - 1.0 - 1e-4 * i) for i, (_, g) in enumerate(candidates[:need])]
    return pieces + extra


def build_hf_tokenizer(pieces: list[tuple[str, float]], model_max_length: int) -> Tokenizer:
    tok = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=True))
    # No normalizer: Ruri v3's tokenizer.json has none (identity normalization in spm).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="never",
                                                 split=False)
    tok.decoder = decoders.Sequence([decoders.Replace(META, " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B </s>",
        special_tokens=[("<s>", 1), ("</s>", 2)])
    # Registered as special added tokens so literal "<s>" in text maps to id 1, as HF does.
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    # Existing pieces: add_tokens keeps their vocabulary ids (asserted in main).
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in NON_SPECIAL_ADDED])
    tok.no_padding()
    tok.no_truncation()
    return tok


def tokenizer_config(model_max_length: int, added: list[tuple[int, str, bool]]) -> dict:
    """tokenizer_config.json as transformers 4.48 writes it for a PreTrainedTokenizerFast.

    `added`: (id, content, special) of every added token, in id order.
    """
    return {
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": special}
            for i, s, special in added
        },
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "cls_token": "<cls>",
        "eos_token": "</s>",
        "extra_special_tokens": {},
        "mask_token": "<mask>",
        "model_max_length": model_max_length,
        "pad_token": "<pad>",
        "sep_token": "<sep>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    }


def special_tokens_map() -> dict:
    def tok(s):
        return {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False}
    return {"bos_token": tok("<s>"), "cls_token": tok("<cls>"), "eos_token": tok("</s>"),
            "mask_token": tok("<mask>"), "pad_token": tok("<pad>"), "sep_token": tok("<sep>"),
            "unk_token": tok("<unk>")}


def check_added_tokens(out_dir: Path, inputs: list[Path]) -> None:
    """transformers' PreTrainedTokenizerFast (what sentence-transformers uses here) and
    tokenizers.Tokenizer agree on every committed input (with its prompt), and enough
    inputs exercise the non-special added tokens."""
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    hf = PreTrainedTokenizerFast.from_pretrained(str(out_dir))
    added_ids = {raw.token_to_id(s): s for s in NON_SPECIAL_ADDED}
    for path in inputs:
        items = json.loads(path.read_text(encoding="utf-8"))
        using = []
        for inp in items:
            full = PROMPTS[inp["prompt_name"]] + inp["text"]
            a = raw.encode(full).ids
            b = hf(full)["input_ids"]
            assert a == b, (path, inp["id"], a, b)
            hit = sorted({added_ids[i] for i in a if i in added_ids})
            if hit:
                using.append(f"{inp['id']} ({' '.join(hit)})")
        print(f"tokenizer: PreTrainedTokenizerFast == tokenizers.Tokenizer on all "
              f"{len(items)} inputs of {path}; {len(using)} use a non-special added token: "
              + ", ".join(using))
        if path.name == "inputs.json":
            assert len(using) >= 5, using


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--work-dir", type=Path, required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--model-max-length", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=20241130)
    ap.add_argument("--inputs", type=Path, nargs="*", default=[],
                    help="inputs.json-style files to check the tokenizer on")
    args = ap.parse_args()

    args.work_dir.mkdir(parents=True, exist_ok=True)
    prefix = args.work_dir / "spm"
    train_spm(args.corpus, prefix, args.vocab_size, args.seed)
    sp = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    pieces = [(sp.id_to_piece(i), float(sp.get_score(i))) for i in range(sp.get_piece_size())]
    # Layout check: the ids Ruri v3 uses, then the 256 byte pieces.
    assert [p for p, _ in pieces[:7]] == SPECIALS, pieces[:7]
    assert [p for p, _ in pieces[7:7 + 256]] == [f"<0x{b:02X}>" for b in range(256)]
    spm_size = len(pieces)
    pieces = pad_vocab(pieces, args.corpus, args.vocab_size)
    assert len(pieces) == args.vocab_size, (len(pieces), args.vocab_size)
    assert len({p for p, _ in pieces}) == len(pieces), "duplicate pieces"

    tok = build_hf_tokenizer(pieces, args.model_max_length)
    assert tok.get_vocab_size() == args.vocab_size
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, s
    vocab = dict(pieces)
    piece_ids = {p: i for i, (p, _) in enumerate(pieces)}
    added = [(i, s, True) for i, s in enumerate(SPECIALS)]
    for s in NON_SPECIAL_ADDED:
        # An ordinary piece (after the specials and the 256 bytes) of the trained vocabulary.
        assert s in vocab and piece_ids[s] >= len(SPECIALS) + 256, s
        assert tok.token_to_id(s) == piece_ids[s], s
        added.append((piece_ids[s], s, False))
    added.sort()
    print("tokenizer: non-special added tokens "
          + ", ".join(f"{s} = {i}" for i, s, special in added if not special))

    args.out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out_dir / "tokenizer.json"), pretty=True)
    (args.out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(args.model_max_length, added), indent=2,
                   ensure_ascii=False) + "\n",
        encoding="utf-8")
    (args.out_dir / "special_tokens_map.json").write_text(
        json.dumps(special_tokens_map(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"tokenizer: spm gave {spm_size} pieces, padded to {len(pieces)} "
          f"-> {args.out_dir / 'tokenizer.json'}")
    saved = json.loads((args.out_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert [(t["id"], t["content"], t["special"]) for t in saved["added_tokens"]] == added
    assert all(t["normalized"] is False for t in saved["added_tokens"])
    check_added_tokens(args.out_dir, args.inputs)


if __name__ == "__main__":
    main()
