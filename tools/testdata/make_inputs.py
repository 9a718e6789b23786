#!/usr/bin/env python3
"""Write testdata/inputs.json: the test texts, written for this project (no corpus text).

Run once by hand; the output is committed and is the source of truth. Long texts are
composed from the sentences below so that the file stays reviewable; their lengths are
chosen for the tiny tokenizer (see the token counts in testdata/reference/tiny.json).
"""

import json
import sys
from pathlib import Path

SENTENCES = [
    "今朝は少し早起きして、近所の公園を三十分ほど散歩しました。",
    "桜の花びらが風に舞って、川の水面をゆっくりと流れていきます。",
    "新しい図書館は駅から歩いて五分のところにあり、夜九時まで開いています。",
    "週末には家族で山へ出かけ、頂上でおにぎりを食べる予定です。",
    "このソフトウェアは設定ファイルを読み込んでから、必要なサービスを順番に起動します。",
    "エラーが発生した場合は、ログを確認して原因を特定してください。",
    "雨の日は電車が混むので、いつもより十分早く家を出るようにしています。",
    "祖母が作る味噌汁は、昆布と鰹節でとった出汁の香りがとても豊かです。",
    "研究チームは二〇二四年に新しい測定方法を発表し、大きな注目を集めました。",
    "夏休みの宿題として、子どもたちは地域の歴史について調べて発表しました。",
    "駅前の商店街では、毎月第二土曜日に小さな朝市が開かれています。",
    "文章の意味を数値のベクトルで表すと、似た内容の文書を素早く探せるようになります。",
    "長い文章を扱うときは、入力の長さに上限があることに注意しなければなりません。",
    "秋になると山の木々が赤や黄色に色づき、多くの観光客が訪れます。",
    "彼は毎晩寝る前に日記をつけ、その日に学んだことを三つ書き出しています。",
    "古い港町の坂道を上ると、海と赤い屋根の家並みが一望できます。",
    "会議の資料は前日までに共有し、当日は要点だけを説明することにしました。",
    "冬の夜空ではオリオン座がよく見え、三つ並んだ星がすぐに見つかります。",
    "この料理は材料を切って鍋に入れ、弱火で二十分煮込むだけで完成します。",
    "小さな町の博物館には、江戸時代の道具や古い地図が数多く展示されています。",
    "プログラムの性能を測るときは、同じ条件で何度か実行して平均を取ります。",
    "駅のホームで電車を待っていると、遠くから踏切の音が聞こえてきました。",
    "庭のトマトが赤く熟したので、サラダにして家族みんなで食べました。",
    "外国から来た友人に、日本の季節の行事について詳しく説明しました。",
]


def compose(n_sentences: int, start: int = 0) -> str:
    return "".join(SENTENCES[(start + i) % len(SENTENCES)] for i in range(n_sentences))


ITEMS = [
    # The four prompts on ordinary sentences.
    ("query_capital", "query", "日本の首都はどこですか？"),
    ("document_capital", "document", "日本の首都は東京です。東京は政治と経済の中心地であり、多くの人が暮らしています。"),
    ("topic_weather", "topic", "明日の天気予報と週末の気温の変化について"),
    ("plain_sentence", "", "猫が窓辺で気持ちよさそうに昼寝をしている。"),
    ("query_recipe", "query", "簡単にできる朝ごはんのレシピを教えてください"),
    ("document_library", "document", SENTENCES[2] + SENTENCES[11]),
    ("plain_two_sentences", "", SENTENCES[0] + SENTENCES[1]),
    # Empty and whitespace.
    ("empty", "", ""),
    ("empty_with_query_prompt", "query", ""),
    ("single_space", "", " "),
    ("whitespace_only", "", " \t\n  \u3000 "),
    ("leading_trailing_spaces", "", "   前後に空白があります   "),
    ("repeated_spaces", "", "単語の  間に    複数の     空白"),
    ("tabs_and_newlines", "document", "一行目\n二行目\t タブの後\r\n三行目\n\n"),
    # Width variants and symbols.
    ("halfwidth_katakana", "", "ｶﾀｶﾅﾃﾞｶｲﾀﾌﾞﾝｼｮｳ ﾃｽﾄ"),
    ("fullwidth_alnum", "", "ＡＢＣ１２３と全角スペース\u3000を含む文"),
    ("mixed_width_punct", "topic", "価格は¥1,980（税込）です！！ 〜 ～ ー −"),
    # Byte fallback: emoji and characters outside the BMP.
    ("emoji", "", "今日は楽しかった😀🎉👍🏽 また行こうね🍣"),
    ("non_bmp_kanji", "", "𠮷野家で𩸽の定食を食べた。𠀋𡈽𡌛も珍しい字です。"),
    ("zwj_emoji_and_combining", "", "家族👨‍👩‍👧‍👦とｶﾞ（濁点付き）と e\u0301 と か\u3099"),
    # Literal special-token text (maps to the special ids, as in HF tokenizers).
    ("literal_special_tokens", "", "<s>文の始まり</s>と<pad>や<cls>、<sep>と<mask>と<unk>"),
    ("literal_special_tokens_query", "query", "タグ <s> と </s> を含む質問"),
    # Mixed scripts and digits.
    ("mixed_ja_en_digits", "", "Rust 1.95 で ModernBERT を動かし、2024年11月30日に v3.0.1 をリリースした。"),
    ("english_only", "", "The quick brown fox jumps over the lazy dog 12345 times."),
    ("code_like", "document", "for i in range(10): print(f\"値={i:03d}\")  # コメント"),
    # Lengths around and beyond the window and the 512-token limit (tiny tokenizer).
    ("long_over_two_windows", "document", compose(14)),
    ("long_over_two_windows_plain", "", compose(12, start=7)),
    ("over_max_seq_len_700", "", compose(28, start=3)),
    ("over_max_seq_len_1500", "query", compose(60, start=11)),
    ("repeated_char", "", "あ" * 600),
]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("testdata/inputs.json")
    ids = [i for i, _, _ in ITEMS]
    assert len(ids) == len(set(ids)), "duplicate id"
    items = [{"id": i, "prompt_name": p, "text": t} for i, p, t in ITEMS]
    out.write_text(json.dumps(items, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(items)} inputs -> {out}")


if __name__ == "__main__":
    main()
