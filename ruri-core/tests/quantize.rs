//! `Embeddings::quantize` against sentence-transformers' `quantize_embeddings`, byte for byte:
//! `testdata/reference/quantize_tiny.json`, written by `tools/testdata/quantize_reference.py`
//! (30 vectors of the tiny model; full width and cut to 61 dimensions; int8 and uint8 with
//! ranges from the vectors themselves and from a calibration set).

use ruri_core::{Embeddings, Quantization, QuantizationRanges};
use serde_json::Value;

fn matrix(v: &Value, dim: usize) -> (Vec<f32>, usize) {
    let rows = v.as_array().expect("rows");
    let data = rows
        .iter()
        .flat_map(|r| {
            r.as_array().expect("a row")[..dim]
                .iter()
                .map(|x| x.as_f64().expect("a number") as f32)
        })
        .collect();
    (data, rows.len())
}

#[test]
fn every_precision_equals_sentence_transformers() {
    let path = ruri_testkit::testdata_dir().join("reference/quantize_tiny.json");
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).expect("the reference")).unwrap();
    let cases = doc["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 12);
    for case in cases {
        let dim = case["dim"].as_u64().unwrap() as usize;
        let precision: Quantization = case["precision"].as_str().unwrap().parse().unwrap();
        let (data, n) = matrix(&doc["embeddings"], dim);
        let e = Embeddings::from_parts(data, dim, vec![1; n], vec![false; n]).unwrap();
        let ranges = case["calibrated"].as_bool().unwrap().then(|| {
            let (c, _) = matrix(&doc["calibration"], dim);
            QuantizationRanges::from_vectors(&c, dim).unwrap()
        });
        let q = e.quantize(precision, ranges.as_ref()).unwrap();
        let want: Vec<Vec<i64>> = case["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_i64().unwrap())
                    .collect()
            })
            .collect();
        let shape: Vec<usize> = want.iter().map(Vec::len).collect();
        assert_eq!((q.len(), q.row_bytes()), (n, shape[0]), "{case:?}");
        assert_eq!(
            case["dtype"].as_str().unwrap(),
            if precision.is_signed() {
                "int8"
            } else {
                "uint8"
            }
        );
        let got: Vec<i64> = match q.to_i8() {
            Some(v) => v.into_iter().map(i64::from).collect(),
            None => q.as_bytes().iter().map(|&b| i64::from(b)).collect(),
        };
        let name = format!("{} dim {dim} calibrated {}", precision, case["calibrated"]);
        assert_eq!(got, want.concat(), "{name}");
    }
}
