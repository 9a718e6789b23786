#!/usr/bin/env python3
"""Build a Japanese prose corpus from Debian's Japanese documentation packages.

The corpus only feeds tokenizer training; it is never committed (GPL-2+ and mixed
licences). Output: one paragraph per line, deduplicated, in a deterministic order
(packages, then files, sorted by name).

Needs: apt-get (with `apt-get update` done), dpkg-deb, groff (groff-base).
Uses only the Python standard library.
"""

from __future__ import annotations

import argparse
import gzip
import html.parser
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Versions in Debian 12 (bookworm) when the committed tokenizer was trained. Pinned so that
# a rerun sees the same text; if the mirror no longer has them we fall back to whatever
# version apt offers and say so (the tokenizer may then differ slightly).
PACKAGES = {
    "manpages-ja": "0.5.0.0.20221215+dfsg-1",
    "manpages-ja-dev": "0.5.0.0.20221215+dfsg-1",
    "debian-reference-ja": "2.100",
    "debian-faq-ja": "11.1",
    "maint-guide-ja": "1.2.53",
    "developers-reference-ja": "12.18",
    "debian-policy-ja": "4.6.2.0",
    "aptitude-doc-ja": "0.8.13-5",
}

# Hiragana, katakana, CJK ideographs: a paragraph without any of these is not Japanese prose.
JAPANESE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")
MIN_PARAGRAPH_CHARS = 12


def download(cache: Path) -> list[Path]:
    cache.mkdir(parents=True, exist_ok=True)
    debs = []
    for name, version in sorted(PACKAGES.items()):
        found = sorted(cache.glob(f"{name}_*.deb"))
        if not found:
            pinned = subprocess.run(
                ["apt-get", "download", f"{name}={version}"], cwd=cache,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if pinned.returncode != 0:
                print(f"warning: {name}={version} unavailable, taking apt's current version",
                      file=sys.stderr)
                subprocess.run(["apt-get", "download", name], cwd=cache, check=True,
                               stdout=subprocess.DEVNULL)
            found = sorted(cache.glob(f"{name}_*.deb"))
        debs.append(found[-1])
    return debs


def extract(debs: list[Path], root: Path) -> None:
    for deb in debs:
        out = root / deb.stem
        if not out.exists():
            tmp = out.parent / (out.name + ".tmp")
            subprocess.run(["rm", "-rf", str(tmp)], check=True)
            tmp.mkdir(parents=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
            tmp.rename(out)


def read_maybe_gz(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def render_man(path: Path) -> list[str]:
    """Render a man page with groff and return its paragraphs (blank-line separated)."""
    source = read_maybe_gz(path)
    if source.lstrip().startswith(b".so "):
        return []  # a link to another page, which is rendered on its own
    # A very wide line length keeps each paragraph on one output line, so no line breaks
    # (and no hyphenation) are introduced inside Japanese text.
    proc = subprocess.run(
        ["groff", "-k", "-Kutf-8", "-Tutf8", "-mandoc", "-P-cbou", "-rLL=2000n", "-rHY=0"],
        input=source, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    text = proc.stdout.decode("utf-8", errors="replace")
    paragraphs, block = [], []
    for line in text.splitlines():
        if line.strip():
            block.append(line.strip())
        elif block:
            paragraphs.append(" ".join(block))
            block = []
    if block:
        paragraphs.append(" ".join(block))
    return paragraphs


class _TextBlocks(html.parser.HTMLParser):
    """Collects the text of an HTML page, one entry per block-level element."""

    BLOCK = {"p", "li", "dd", "dt", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6",
             "div", "pre", "blockquote", "tr", "table", "ul", "ol", "dl", "br", "title",
             "section", "caption", "figcaption"}
    SKIP = {"script", "style", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self._buf: list[str] = []
        self._skip = 0
        self._pre = 0

    def _flush(self) -> None:
        text = "".join(self._buf)
        self._buf = []
        if self._pre:
            self.blocks.extend(line for line in text.splitlines())
        else:
            self.blocks.append(text)

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self._skip += 1
        elif tag in self.BLOCK:
            self._flush()
            if tag == "pre":
                self._pre += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in self.BLOCK:
            self._flush()
            if tag == "pre":
                self._pre = max(0, self._pre - 1)

    def handle_data(self, data):
        if not self._skip:
            self._buf.append(data)

    def close(self):
        super().close()
        self._flush()


def render_html(path: Path) -> list[str]:
    parser = _TextBlocks()
    parser.feed(read_maybe_gz(path).decode("utf-8", errors="replace"))
    parser.close()
    return parser.blocks


def clean(paragraph: str) -> str | None:
    # Collapse layout whitespace (source line breaks, groff's column padding) to one space.
    text = re.sub(r"\s+", " ", paragraph).strip()
    if len(text) < MIN_PARAGRAPH_CHARS or not JAPANESE.search(text):
        return None
    return text


def source_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if "/_static/" in rel or "/_sources/" in rel:
            continue
        if "/man/ja/" in rel and re.search(r"\.\d\w*(\.gz)?$", path.name):
            files.append(path)
        elif re.search(r"\.html(\.gz)?$", path.name):
            files.append(path)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cache", type=Path, required=True, help="download/extract folder")
    ap.add_argument("--out", type=Path, required=True, help="corpus.txt to write")
    ap.add_argument("--max-chars", type=int, default=6_000_000)
    args = ap.parse_args()

    debs = download(args.cache / "debs")
    extract(debs, args.cache / "extracted")
    files = []
    for deb in debs:
        files.extend(source_files(args.cache / "extracted" / deb.stem))

    def render(path: Path) -> list[str]:
        return render_man(path) if "/man/ja/" in path.as_posix() else render_html(path)

    seen: set[str] = set()
    lines: list[str] = []
    total = 0
    # Threads only overlap groff processes; map() keeps the sorted file order.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for paragraphs in pool.map(render, files):
            for p in paragraphs:
                text = clean(p)
                if text is None or text in seen:
                    continue
                seen.add(text)
                lines.append(text)
                total += len(text)
    # Keep the whole corpus unless it is far beyond the target; truncation is by whole
    # paragraphs from the end of the sorted order, so it stays deterministic.
    kept, count = [], 0
    for line in lines:
        if count >= args.max_chars:
            break
        kept.append(line)
        count += len(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(kept) + "\n", encoding="utf-8")
    print(f"corpus: {len(files)} files, {len(kept)} paragraphs, {count} characters "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
