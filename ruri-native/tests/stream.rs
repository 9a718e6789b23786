//! `NativeBackend::loader` (the file streamed in chunks, never held whole) against
//! `NativeBackend::from_bytes` on the tiny model, and the int8 embedding table against rows
//! dequantized by hand.

use std::path::{Path, PathBuf};

use ruri_core::{Error, ModelDir, TextEmbedder};
use ruri_native::{EmbeddingTable, Kernel, NativeBackend, NativeBuilder, Precision};

const TEXTS: [&str; 4] = [
    "瑠璃色はどんな色？",
    "瑠璃色は紫みを帯びた濃い青。",
    "",
    "ModernBERT は長い文脈を読む。ModernBERT は長い文脈を読む。ModernBERT は長い文脈を読む。",
];

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/tiny")
}

fn config_json() -> String {
    std::fs::read_to_string(tiny().join("config.json")).unwrap()
}

fn weights() -> Vec<u8> {
    std::fs::read(tiny().join("model.safetensors")).unwrap()
}

/// The vectors of `TEXTS` (queries and documents), bit for bit.
fn vectors(backend: NativeBackend) -> Vec<u32> {
    let dir = ModelDir::open(tiny()).unwrap();
    let e = TextEmbedder::load(&dir, None, || Ok(backend)).unwrap();
    let mut bits: Vec<u32> = Vec::new();
    for t in TEXTS {
        bits.extend(e.embed_query(t).unwrap().iter().map(|v| v.to_bits()));
    }
    let docs = e.embed_documents(&TEXTS).unwrap();
    for i in 0..TEXTS.len() {
        bits.extend(docs.get(i).unwrap().iter().map(|v| v.to_bits()));
    }
    bits
}

fn streamed(
    builder: &NativeBuilder,
    bytes: &[u8],
    chunk: usize,
) -> ruri_core::Result<NativeBackend> {
    let mut loader = NativeBackend::loader(builder, &config_json())?;
    for c in bytes.chunks(chunk) {
        loader.push(c)?;
    }
    loader.finish()
}

fn builders() -> Vec<NativeBuilder> {
    let mut all = Vec::new();
    for precision in [Precision::Int8, Precision::Fp32] {
        for table in [EmbeddingTable::F32, EmbeddingTable::Int8] {
            for outliers in [true, false] {
                all.push(
                    ruri_native::builder()
                        .precision(precision)
                        .kernel(Kernel::Scalar)
                        .threads(1)
                        .outlier_channels(outliers)
                        .embedding_table(table),
                );
            }
        }
    }
    all
}

/// The tiny model with input channels of every `mlp.Wo` that write one output channel
/// alone (the int8 loader moves those units of the MLP last, Wi's rows with them; the file
/// stores `mlp.Wi` before `mlp.Wo`, so a streamed load holds Wi until Wo is in).
fn with_writers() -> Vec<u8> {
    let mut bytes = weights();
    let (data_start, header) = header(&bytes);
    for n in 0..4 {
        let entry = &header[format!("layers.{n}.mlp.Wo.weight")];
        let k = entry["shape"][1].as_u64().unwrap() as usize;
        let start = data_start + entry["data_offsets"][0].as_u64().unwrap() as usize;
        let end = data_start + entry["data_offsets"][1].as_u64().unwrap() as usize;
        for (r, row) in bytes[start..end].chunks_exact_mut(4 * k).enumerate() {
            for c in [3, 50, 51, 90] {
                let v: f32 = if r == c % 7 { 0.5 } else { 0.0 };
                row[4 * c..4 * c + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    bytes
}

/// Every precision and table, chunks of every size (one byte, odd sizes straddling the
/// header and each tensor, the whole file): the same bits as `from_bytes`.
#[test]
fn streamed_loads_give_the_bits_of_from_bytes() {
    for bytes in [weights(), with_writers()] {
        streamed_equals_from_bytes(&bytes);
    }
}

fn streamed_equals_from_bytes(bytes: &[u8]) {
    for (b, builder) in builders().into_iter().enumerate() {
        let expected =
            vectors(NativeBackend::from_bytes(&builder, &config_json(), bytes.to_vec()).unwrap());
        for chunk in [1, 7, 4093, 1 << 16, bytes.len()] {
            if chunk == 1 && b > 0 {
                // One-byte chunks once is enough (slow in debug builds).
                continue;
            }
            let got = vectors(streamed(&builder, bytes, chunk).unwrap());
            assert!(got == expected, "{builder:?}, chunks of {chunk} bytes");
        }
    }
}

/// The header's length, the header as JSON, and where the data starts.
fn header(bytes: &[u8]) -> (usize, serde_json::Value) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (8 + n, serde_json::from_slice(&bytes[8..8 + n]).unwrap())
}

/// The file cut anywhere (in the length, in the header, at its end, in a tensor, one byte
/// short): the error `from_bytes` gives for the same bytes.
#[test]
fn cut_files_are_the_errors_of_from_bytes() {
    let bytes = weights();
    let builder = builders().remove(0);
    let (data_start, _) = header(&bytes);
    for cut in [
        0,
        3,
        8,
        100,
        data_start - 1,
        data_start,
        data_start + 5,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        let part = &bytes[..cut];
        let direct =
            NativeBackend::from_bytes(&builder, &config_json(), part.to_vec()).unwrap_err();
        for chunk in [7, 1 << 16] {
            let got = streamed(&builder, part, chunk).unwrap_err();
            let (Error::InvalidConfig { reason: want, .. }, Error::InvalidConfig { reason, .. }) =
                (&direct, &got)
            else {
                panic!("cut at {cut}: {direct:?} from bytes, {got:?} streamed");
            };
            // A tensor's data past the end: both name one, maybe not the same one (the
            // header is a map).
            if want.contains("does not fit") {
                assert!(reason.contains("does not fit"), "cut at {cut}: {reason}");
            } else {
                assert_eq!(reason, want, "cut at {cut}");
            }
        }
    }
}

/// A broken header is refused by `push` (with the error `from_bytes` gives), and the
/// loader refuses everything after it.
#[test]
fn broken_headers_fail_in_push() {
    let builder = builders().remove(0);
    let mut broken = 9u64.to_le_bytes().to_vec();
    broken.extend_from_slice(b"{not json");
    broken.extend_from_slice(&[0; 64]);
    let mut loader = NativeBackend::loader(&builder, &config_json()).unwrap();
    let err = loader.push(&broken).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig { reason, .. } if reason.contains("not JSON")),
        "{err:?}"
    );
    let direct = NativeBackend::from_bytes(&builder, &config_json(), broken.clone()).unwrap_err();
    assert_eq!(err.to_string(), direct.to_string());
    assert!(loader.push(&[0; 8]).is_err());
    assert!(loader.finish().is_err());

    // A header longer than any real one.
    let mut loader = NativeBackend::loader(&builder, &config_json()).unwrap();
    let err = loader.push(&u64::MAX.to_le_bytes()).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig { reason, .. } if reason.contains("header of")),
        "{err:?}"
    );

    // A tensor of another shape than config.json's.
    let mut bytes = weights();
    let (data_start, _) = header(&bytes);
    let text = String::from_utf8(bytes[8..data_start].to_vec()).unwrap();
    let wrong = text.replacen("[8000,64]", "[64,8000]", 1);
    assert_ne!(
        wrong, text,
        "the tiny model's header spells the table's shape [8000,64]"
    );
    bytes.splice(8..data_start, wrong.into_bytes());
    let err = streamed(&builder, &bytes, 4093).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig { reason, .. } if reason.contains("has shape [64, 8000]")),
        "{err:?}"
    );
}

/// `EmbeddingTable::Int8`: the same bits as an fp32 table whose rows were quantized and
/// dequantized here (`s = max|row| / 127`, `q = round-half-even(x / s)` clamped to ±127,
/// row `q · s`), from a folder, from bytes and streamed.
#[test]
fn int8_table_is_rows_dequantized_by_hand() {
    let bytes = weights();
    let (data_start, header) = header(&bytes);
    let entry = &header["embeddings.tok_embeddings.weight"];
    assert_eq!(entry["dtype"], "F32");
    let h = entry["shape"][1].as_u64().unwrap() as usize;
    let start = data_start + entry["data_offsets"][0].as_u64().unwrap() as usize;
    let end = data_start + entry["data_offsets"][1].as_u64().unwrap() as usize;
    let mut by_hand = bytes.clone();
    let mut changed = 0;
    for row in by_hand[start..end].chunks_exact_mut(4 * h) {
        let x: Vec<f32> = row
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let max = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (inv, s) = if max == 0.0 {
            (0.0, 0.0)
        } else {
            (127.0 / max, max / 127.0)
        };
        for (b, &v) in row.chunks_exact_mut(4).zip(&x) {
            let q = (v * inv).clamp(-127.0, 127.0).round_ties_even();
            let d = q * s;
            changed += usize::from(d != v);
            b.copy_from_slice(&d.to_le_bytes());
        }
    }
    assert!(changed > 1000, "quantization changed only {changed} values");
    for precision in [Precision::Int8, Precision::Fp32] {
        let base = ruri_native::builder()
            .precision(precision)
            .kernel(Kernel::Scalar)
            .threads(1);
        let expected =
            vectors(NativeBackend::from_bytes(&base, &config_json(), by_hand.clone()).unwrap());
        let int8 = base.clone().embedding_table(EmbeddingTable::Int8);
        let from_bytes =
            vectors(NativeBackend::from_bytes(&int8, &config_json(), bytes.clone()).unwrap());
        assert!(from_bytes == expected, "{precision}: from bytes");
        let dir = ModelDir::open(tiny()).unwrap();
        let from_dir = vectors(NativeBackend::load(&dir, &int8).unwrap());
        assert!(from_dir == expected, "{precision}: from the folder");
        assert!(
            vectors(streamed(&int8, &bytes, 4093).unwrap()) == expected,
            "{precision}: streamed"
        );
        // And the option does something.
        let f32_table =
            vectors(NativeBackend::from_bytes(&base, &config_json(), bytes.clone()).unwrap());
        assert!(
            f32_table != expected,
            "{precision}: the int8 table changed nothing"
        );
    }
}

/// A header (and config) claiming a 1 TiB embedding table: a typed error (the memory cannot be
/// had, or the file ends first), never an allocation abort.
#[test]
fn a_header_claiming_too_much_is_an_error() {
    let vocab: u64 = 1 << 34;
    let config = config_json().replace("\"vocab_size\": 8000", &format!("\"vocab_size\": {vocab}"));
    assert_ne!(
        config,
        config_json(),
        "the tiny config spells \"vocab_size\": 8000"
    );
    let bytes = weights();
    let (data_start, header) = header(&bytes);
    let mut header = header;
    let end = bytes.len() as u64 - data_start as u64;
    let table = &mut header["embeddings.tok_embeddings.weight"];
    table["shape"] = serde_json::json!([vocab, 64]);
    table["data_offsets"] = serde_json::json!([end, end + vocab * 64 * 4]);
    let text = serde_json::to_vec(&header).unwrap();
    let mut file = (text.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&text);
    file.extend_from_slice(&bytes[data_start..]);
    file.extend_from_slice(&vec![0u8; 1 << 16]);
    for table in [EmbeddingTable::Int8, EmbeddingTable::F32] {
        let builder = builders().remove(0).embedding_table(table);
        let mut loader = NativeBackend::loader(&builder, &config).unwrap();
        let result = file
            .chunks(4093)
            .try_for_each(|c| loader.push(c))
            .and_then(|()| loader.finish().map(drop));
        assert!(
            matches!(result, Err(Error::InvalidConfig { .. })),
            "{table:?}: {result:?}"
        );
    }
}
