//! Times loading a `tokenizer.json`, and its parts, in this process:
//! `cargo run --release -p ruri-tokenize --example load_time -- PATH [ROUNDS [DOCUMENTS]]`.
//!
//! Prints, per round: the whole [`Tokenizer::from_json`]; a bare JSON parse of the file
//! (serde's `IgnoredAny`, the floor any serde parse pays); [`CompactUnigram::new`] on
//! pieces already in memory (building the index alone); and, given a `documents.jsonl`
//! (one `{"text": …}` a line), the time to encode all of them with the document prompt, once
//! on the fresh tokenizer and once more; and how much the resident set grew with the load and
//! with the first encoding (meaningful in the first round only, before the allocator holds
//! freed memory). The first round is the cold one a process start pays.

use std::time::Instant;

use ruri_tokenize::{CompactUnigram, Tokenizer, Truncation};

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// This process's resident set in MB, from `/proc/self/status` (0 where there is none).
fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| "testdata/generated/ruri-v3-30m-shape/tokenizer.json".to_owned());
    let rounds: usize = args
        .next()
        .map_or(3, |r| r.parse().expect("ROUNDS is a number"));
    let documents: Vec<String> = args.next().map_or_else(Vec::new, |path| {
        #[derive(serde::Deserialize)]
        struct Line {
            text: String,
        }
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {path}: {e}"))
            .lines()
            .map(|l| {
                serde_json::from_str::<Line>(l)
                    .expect("a {\"text\": …} line")
                    .text
            })
            .collect()
    });
    let json = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));

    #[derive(serde::Deserialize)]
    struct File {
        model: Model,
    }
    #[derive(serde::Deserialize)]
    struct Model {
        vocab: Vec<(String, f64)>,
    }
    let pieces = serde_json::from_slice::<File>(&json)
        .expect("a Unigram tokenizer.json")
        .model
        .vocab;

    println!(
        "round\tfrom_json_ms\tjson_parse_ms\tindex_build_ms\tencode_ms\tencode_again_ms\ttokens\trss_loaded_mb\trss_encoded_mb"
    );
    for round in 0..rounds {
        let rss_before = rss_mb();
        let start = Instant::now();
        let tokenizer = Tokenizer::from_json(&json, 8192, None).expect("a valid tokenizer.json");
        let load = ms(start);
        let rss_loaded = rss_mb() - rss_before;
        assert!(tokenizer.uses_compact_unigram());
        let start = Instant::now();
        let tokens: usize = tokenizer
            .encode_batch("検索文書: ", &documents, Truncation::Error)
            .expect("the documents encode")
            .iter()
            .map(|e| e.len())
            .sum();
        let encode = ms(start);
        let rss_encoded = rss_mb() - rss_before;
        let start = Instant::now();
        tokenizer
            .encode_batch("検索文書: ", &documents, Truncation::Error)
            .expect("the documents encode");
        let encode_again = ms(start);
        drop(tokenizer);

        let start = Instant::now();
        serde_json::from_slice::<serde::de::IgnoredAny>(&json).expect("valid JSON");
        let parse = ms(start);

        let start = Instant::now();
        let model =
            CompactUnigram::new(pieces.iter().map(|(p, s)| (p.as_str(), *s)), Some(0), true)
                .expect("a valid vocabulary");
        let build = ms(start);
        drop(model);
        println!(
            "{round}\t{load:.2}\t{parse:.2}\t{build:.2}\t{encode:.2}\t{encode_again:.2}\t{tokens}\t{rss_loaded:.1}\t{rss_encoded:.1}"
        );
    }
}
