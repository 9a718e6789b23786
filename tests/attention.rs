//! The loader's `attention` option (`EmbedderConfig::attention`) reaches the native engine:
//! bf16 and int13 attention load the tiny model at fp32 and int8, the engine reports them,
//! and on a long text each moves the vector a little, never far.

use ruri::native::NativeBackend;
use ruri::{AttentionPrecision, BackendKind, EmbedOptions, EmbedderConfig, Precision, Task};
use ruri_testkit::{cosine, max_abs_diff, tiny_model_dir};

/// Japanese prose long enough for well over 100 tokens (checked below), so that attention's
/// products have many terms to round.
const LONG_TEXT: &str = "瑠璃は青い宝石で、古くから世界中で大切にされてきました。\
    日本では七宝の一つに数えられ、仏教の経典にもその名が見えます。\
    夜空のような深い青に金色の粒が散る様子は、星を思わせると言われています。\
    アフガニスタンの山地が主な産地で、シルクロードを通って東西へ運ばれました。\
    絵の具の群青は瑠璃を砕いて作られ、中世の画家たちは金よりも高価なこの青を\
    聖母の衣を描くためだけに使ったと伝えられています。\
    今日では宝飾品として身につけられるほか、お守りとして贈られることもあります。\
    瑠璃色という言葉は、紫を帯びた濃い青を指す日本の伝統色の名前でもあります。";

fn config(precision: Precision, attention: AttentionPrecision) -> EmbedderConfig {
    EmbedderConfig::new()
        .backend(BackendKind::Native)
        .precision(precision)
        .attention(attention)
        .threads(1)
}

#[test]
fn every_attention_precision_loads_at_fp32_and_int8_and_reaches_the_engine() {
    for precision in [Precision::Fp32, Precision::Int8] {
        for &attention in AttentionPrecision::ALL {
            let embedder = config(precision, attention)
                .build_from_dir(tiny_model_dir())
                .unwrap_or_else(|e| panic!("{precision} {attention}: {e}"));
            let native = embedder
                .backend_as::<NativeBackend>()
                .expect("backend native");
            let wanted = match attention {
                AttentionPrecision::F32 => ruri::native::AttentionPrecision::F32,
                AttentionPrecision::Bf16 => ruri::native::AttentionPrecision::Bf16,
                _ => ruri::native::AttentionPrecision::Int13,
            };
            assert_eq!(native.attention(), wanted, "{precision} {attention}");
            let query = embedder.embed_query("瑠璃色はどんな色？").unwrap();
            assert_eq!(query.len(), embedder.dim());
            assert!(
                query.iter().all(|v| v.is_finite()),
                "{precision} {attention}"
            );
        }
    }
}

/// Told no attention, the loader runs the engine's default, the same vector as stating it:
/// int13 at int8, f32 at fp32.
#[test]
fn the_default_attention_reaches_the_engine() {
    for (precision, wanted) in [
        (Precision::Int8, AttentionPrecision::Int13),
        (Precision::Fp32, AttentionPrecision::F32),
    ] {
        let unstated = EmbedderConfig::new()
            .backend(BackendKind::Native)
            .precision(precision)
            .threads(1);
        assert_eq!(unstated.get_attention(), wanted, "{precision}");
        let embedder = unstated.build_from_dir(tiny_model_dir()).unwrap();
        let native = embedder.backend_as::<NativeBackend>().unwrap();
        let engine = match wanted {
            AttentionPrecision::Int13 => ruri::native::AttentionPrecision::Int13,
            _ => ruri::native::AttentionPrecision::F32,
        };
        assert_eq!(native.attention(), engine, "{precision}");
        let vector = embedder.embed_documents(&[LONG_TEXT]).unwrap().into_vec();
        let stated = config(precision, wanted)
            .build_from_dir(tiny_model_dir())
            .unwrap();
        assert_eq!(
            vector,
            stated.embed_documents(&[LONG_TEXT]).unwrap().into_vec(),
            "{precision}"
        );
    }
}

/// bf16 and int13 attention round q, k, v and the probabilities: on a long text the vector
/// differs from f32's, but only slightly.
#[test]
fn quantized_attention_moves_a_long_texts_vector_slightly() {
    let options = EmbedOptions::new(Task::Document).normalize(true);
    let mut vectors = Vec::new();
    for &attention in AttentionPrecision::ALL {
        let embedder = config(Precision::Int8, attention)
            .build_from_dir(tiny_model_dir())
            .unwrap();
        let tokens = embedder.tokenize(&[LONG_TEXT], &options).unwrap()[0].len();
        assert!(LONG_TEXT.chars().count() >= 200);
        assert!(tokens > 100, "only {tokens} tokens");
        vectors.push(
            embedder
                .embed_with(&[LONG_TEXT], &options)
                .unwrap()
                .into_vec(),
        );
    }
    let f32 = &vectors[0];
    for (quantized, attention) in vectors[1..].iter().zip(&AttentionPrecision::ALL[1..]) {
        let moved = max_abs_diff(f32, quantized);
        assert!(moved > 0.0, "{attention} attention gave f32's vector");
        let similarity = cosine(f32, quantized);
        assert!(
            similarity > 0.999,
            "{attention}: cosine {similarity} (largest change {moved})"
        );
    }
}
