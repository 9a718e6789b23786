//! `ruri embed` as a user runs it: the binary on the committed tiny model, its files read back
//! by independent readers (the arrow crate for Parquet, NumPy for `.npy` where the test venv
//! has it), vectors against sentence-transformers' references.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int8Type, Int32Type, Int64Type, UInt8Type};
use arrow_array::{Array, DictionaryArray, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use ruri_testkit::{Reference, cosine, max_abs_diff, tiny_model_dir};

fn ruri() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ruri"));
    command.env_remove("RURI_CLI_TEST_STOP_AFTER_CHUNKS");
    command
}

/// `ruri embed` on the tiny model with the native engine (fp32), plus `args`.
fn embed(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut command = ruri();
    command
        .arg("embed")
        .arg("--model")
        .arg(tiny_model_dir())
        .args(["--backend", "native"])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("the ruri binary runs");
    if let Some(input) = stdin {
        // A run that refuses its flags exits without reading stdin.
        match child.stdin.take().unwrap().write_all(input) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other.unwrap(),
        }
    }
    child.wait_with_output().unwrap()
}

/// `ruri embed` on the tiny model with `args` only (no `--backend`), stdin `input`, and no
/// ONNX Runtime to be found: `ORT_DYLIB_PATH` names a file that does not exist, which ort
/// refuses rather than searching on.
fn embed_without_onnx_runtime(args: &[&str], input: &[u8]) -> Output {
    let mut child = ruri()
        .arg("embed")
        .arg("--model")
        .arg(tiny_model_dir())
        .args(args)
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the ruri binary runs");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// The main command's path (`tools/embed.sh` runs `ruri embed`): with no `--backend`, the
/// native engine at fp32, which needs no ONNX Runtime. Fails if the default moves to ort
/// (it cannot load here) or to another precision (other vectors).
#[test]
fn the_default_backend_is_native_and_needs_no_onnx_runtime() {
    let input = "瑠璃色はどんな色？\n瑠璃は青い宝石です。\n".as_bytes();
    let default = ok(embed_without_onnx_runtime(&["--task", "query"], input));
    let native = ok(embed_without_onnx_runtime(
        &[
            "--task",
            "query",
            "--backend",
            "native",
            "--precision",
            "fp32",
        ],
        input,
    ));
    assert_eq!(json_lines(&default.stdout).len(), 2);
    assert_eq!(default.stdout, native.stdout);
    let int8 = ok(embed_without_onnx_runtime(
        &[
            "--task",
            "query",
            "--backend",
            "native",
            "--precision",
            "int8",
        ],
        input,
    ));
    assert_ne!(default.stdout, int8.stdout, "the default precision is fp32");
    // ort, named, does need the library: this environment really has none.
    let ort = embed_without_onnx_runtime(&["--task", "query", "--backend", "ort"], input);
    assert!(!ort.status.success());
    assert!(
        stderr(&ort).contains("ONNX Runtime could not be loaded"),
        "{}",
        stderr(&ort)
    );
}

fn ok(output: Output) -> Output {
    assert!(
        output.status.success(),
        "ruri embed failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    std::str::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn floats(value: &serde_json::Value) -> Vec<f32> {
    value["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn jsonl_input(texts: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        serde_json::to_writer(
            &mut out,
            &serde_json::json!({"doc": format!("d{i}"), "body": t}),
        )
        .unwrap();
        out.push(b'\n');
    }
    out
}

/// The texts of the reference with no prompt and no newline (a text a line).
fn plain_texts(reference: &Reference) -> Vec<&str> {
    reference
        .items
        .iter()
        .filter(|i| i.prompt_name.is_empty() && !i.text.contains(['\n', '\r']))
        .map(|i| i.text.as_str())
        .collect()
}

#[test]
fn vectors_equal_sentence_transformers_for_every_prompt() {
    let reference = Reference::tiny();
    let mut by_prompt: BTreeMap<&str, Vec<&ruri_testkit::Item>> = BTreeMap::new();
    for item in &reference.items {
        by_prompt
            .entry(item.prompt_name.as_str())
            .or_default()
            .push(item);
    }
    assert!(by_prompt.len() >= 2, "the reference covers prompts");
    for (prompt, items) in by_prompt {
        let texts: Vec<&str> = items.iter().map(|i| i.text.as_str()).collect();
        let mut args = vec!["--input-format", "jsonl", "--text-field", "body"];
        if !prompt.is_empty() {
            args.extend(["--prompt-name", prompt]);
        }
        let out = ok(embed(&args, Some(&jsonl_input(&texts))));
        let rows = json_lines(&out.stdout);
        assert_eq!(rows.len(), items.len());
        for (row, item) in rows.iter().zip(&items) {
            let got = floats(row);
            let want = &item.st_fp32.normalized;
            assert!(
                cosine(&got, want) >= 0.99999,
                "{}: cosine {}",
                item.id,
                cosine(&got, want)
            );
            assert!(max_abs_diff(&got, want) <= 1e-5, "{}", item.id);
            assert_eq!(row["tokens"], item.token_ids.len(), "{}", item.id);
            assert_eq!(row["truncated"], item.truncated, "{}", item.id);
        }
    }
}

fn write_parquet(path: &Path, batch: &RecordBatch, compression: parquet::basic::Compression) {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_row_count(Some(3))
        .build();
    let mut writer =
        ArrowWriter::try_new(fs::File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
}

fn parquet_input(path: &Path, texts: &[&str], compression: parquet::basic::Compression) {
    let ids = arrow_array::Int64Array::from_iter_values((0..texts.len() as i64).map(|i| 100 + i));
    let bodies = arrow_array::StringArray::from_iter_values(texts.iter().copied());
    let other = arrow_array::Float64Array::from_iter_values((0..texts.len()).map(|i| i as f64));
    let batch = RecordBatch::try_from_iter([
        ("score", Arc::new(other) as Arc<dyn Array>),
        ("body", Arc::new(bodies) as Arc<dyn Array>),
        ("doc", Arc::new(ids) as Arc<dyn Array>),
    ])
    .unwrap();
    write_parquet(path, &batch, compression);
}

fn read_parquet(path: &Path) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(fs::File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

#[test]
fn every_input_format_gives_the_same_vectors() {
    let reference = Reference::tiny();
    let texts = plain_texts(&reference);
    assert!(texts.len() >= 5);
    let dir = tempfile::tempdir().unwrap();
    let want = ok(embed(
        &[],
        Some(format!("{}\n", texts.join("\n")).as_bytes()),
    ))
    .stdout;

    let txt = dir.path().join("in.txt");
    fs::write(&txt, format!("{}\r\n", texts.join("\r\n"))).unwrap();
    let jsonl = dir.path().join("in.jsonl");
    fs::write(&jsonl, jsonl_input(&texts)).unwrap();
    let mut csv = String::from("doc,body\n");
    let mut tsv = String::from("doc\tbody\n");
    for (i, t) in texts.iter().enumerate() {
        csv.push_str(&format!("d{i},\"{}\"\n", t.replace('"', "\"\"")));
        tsv.push_str(&format!("d{i}\t\"{}\"\n", t.replace('"', "\"\"")));
    }
    let csv_path = dir.path().join("in.csv");
    fs::write(&csv_path, csv).unwrap();
    let tsv_path = dir.path().join("in.tsv");
    fs::write(&tsv_path, tsv).unwrap();
    let snappy = dir.path().join("snappy.parquet");
    parquet_input(&snappy, &texts, parquet::basic::Compression::SNAPPY);
    let zstd = dir.path().join("zstd.parquet");
    parquet_input(
        &zstd,
        &texts,
        parquet::basic::Compression::ZSTD(Default::default()),
    );

    for input in [&txt, &jsonl, &csv_path, &tsv_path, &snappy, &zstd] {
        let out = ok(embed(
            &["--input", input.to_str().unwrap(), "--text-field", "body"],
            None,
        ));
        assert_eq!(out.stdout, want, "{}", input.display());
    }
}

/// A categorical (dictionary-encoded) text or id column, as pandas and Arrow writers store
/// one, reads like a plain string column: the same vectors, ids and rows.
#[test]
fn dictionary_parquet_columns_read_like_plain_ones() {
    let reference = Reference::tiny();
    let mut texts = plain_texts(&reference);
    texts.truncate(4);
    // Repeats, as in a categorical column; a dictionary holds each text once.
    let rows: Vec<&str> = texts.iter().chain(texts.iter().rev()).copied().collect();
    let ids: Vec<String> = (0..rows.len()).map(|i| format!("d{}", i % 3)).collect();
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &Path, dictionary: bool| {
        let (body, doc): (Arc<dyn Array>, Arc<dyn Array>) = if dictionary {
            (
                Arc::new(rows.iter().copied().collect::<DictionaryArray<Int32Type>>()),
                Arc::new(
                    ids.iter()
                        .map(String::as_str)
                        .collect::<DictionaryArray<Int8Type>>(),
                ),
            )
        } else {
            (
                Arc::new(arrow_array::StringArray::from_iter_values(
                    rows.iter().copied(),
                )),
                Arc::new(arrow_array::StringArray::from_iter_values(ids.iter())),
            )
        };
        let batch = RecordBatch::try_from_iter([("body", body), ("doc", doc)]).unwrap();
        write_parquet(path, &batch, parquet::basic::Compression::SNAPPY);
    };
    let plain = dir.path().join("plain.parquet");
    write(&plain, false);
    let categorical = dir.path().join("categorical.parquet");
    write(&categorical, true);
    // The file really holds dictionary columns (else this test would test nothing).
    let schema = read_parquet(&categorical)[0].schema();
    for name in ["body", "doc"] {
        let field = schema.field_with_name(name).unwrap();
        assert!(
            matches!(field.data_type(), DataType::Dictionary(..)),
            "{name}: {:?}",
            field.data_type()
        );
    }
    let run = |input: &Path| {
        ok(embed(
            &[
                "--input",
                input.to_str().unwrap(),
                "--text-field",
                "body",
                "--id-field",
                "doc",
            ],
            None,
        ))
        .stdout
    };
    let want = run(&plain);
    assert_eq!(
        want.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
        rows.len()
    );
    assert_eq!(run(&categorical), want);
}

#[test]
fn npy_and_parquet_outputs_hold_the_jsonl_vectors() {
    let reference = Reference::tiny();
    let texts = plain_texts(&reference);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    fs::write(&input, jsonl_input(&texts)).unwrap();
    let base = ["--input", input.to_str().unwrap(), "--text-field", "body"];
    let jsonl = json_lines(&ok(embed(&[&base[..], &["--id-field", "doc"]].concat(), None)).stdout);
    assert_eq!(jsonl[1]["id"], "d1");

    let npy = dir.path().join("out.npy");
    ok(embed(
        &[
            &base[..],
            &["--output", npy.to_str().unwrap(), "--chunk", "2"],
        ]
        .concat(),
        None,
    ));
    let bytes = fs::read(&npy).unwrap();
    let header = std::str::from_utf8(&bytes[10..bytes.len().min(128)]).unwrap_or("");
    assert!(
        header.contains(&format!("'shape': ({}, 64)", texts.len())),
        "{header}"
    );
    let data_start = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let values: Vec<f32> = bytes[data_start..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let from_jsonl: Vec<f32> = jsonl.iter().flat_map(floats).collect();
    assert_eq!(values, from_jsonl);
    if let Ok(python) = std::env::var("RURI_TEST_PYTHON") {
        // NumPy reads the file as float32 of that shape with the same values.
        let script = format!(
            "import numpy as np, json; a = np.load({:?}); print(json.dumps([str(a.dtype), list(a.shape), float(a.sum(dtype=np.float64))]))",
            npy.to_str().unwrap()
        );
        let out = Command::new(python).args(["-c", &script]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got[0], "float32");
        assert_eq!(got[1], serde_json::json!([texts.len(), 64]));
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        assert!((got[2].as_f64().unwrap() - sum).abs() < 1e-9);
    }

    let parquet = dir.path().join("out.parquet");
    ok(embed(
        &[
            &base[..],
            &[
                "--output",
                parquet.to_str().unwrap(),
                "--id-field",
                "doc",
                "--chunk",
                "3",
            ],
        ]
        .concat(),
        None,
    ));
    let batches = read_parquet(&parquet);
    let mut rows = 0;
    for batch in &batches {
        let ids = batch.column_by_name("id").unwrap().as_string::<i32>();
        let row = batch
            .column_by_name("row")
            .unwrap()
            .as_primitive::<Int64Type>();
        let list = batch
            .column_by_name("embedding")
            .unwrap()
            .as_fixed_size_list();
        assert_eq!(list.value_length(), 64);
        for i in 0..batch.num_rows() {
            let expected = &jsonl[rows];
            assert_eq!(ids.value(i), expected["id"].as_str().unwrap());
            assert_eq!(row.value(i), rows as i64);
            let v = list.value(i);
            assert_eq!(
                v.as_primitive::<Float32Type>().values().to_vec(),
                floats(expected)
            );
            rows += 1;
        }
    }
    assert_eq!(rows, texts.len());
}

/// sentence-transformers' quantization of the CLI's own float32 output, by the library's
/// `quantize` (itself byte-equal to sentence-transformers on `testdata/reference`).
fn quantized(
    vectors: &[f32],
    dim: usize,
    precision: ruri::Quantization,
    ranges: Option<&ruri::QuantizationRanges>,
) -> Vec<u8> {
    let n = vectors.len() / dim;
    let e =
        ruri::Embeddings::from_parts(vectors.to_vec(), dim, vec![1; n], vec![false; n]).unwrap();
    e.quantize(precision, ranges).unwrap().into_bytes()
}

#[test]
fn quantized_outputs_equal_the_library_on_the_whole_corpus() {
    let reference = Reference::tiny();
    let texts = plain_texts(&reference);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    fs::write(&input, texts.join("\n")).unwrap();
    let inp = input.to_str().unwrap();
    let f32s: Vec<f32> = json_lines(&ok(embed(&["--input", inp], None)).stdout)
        .iter()
        .flat_map(floats)
        .collect();
    for (name, precision) in [
        ("int8", ruri::Quantization::Int8),
        ("uint8", ruri::Quantization::Uint8),
        ("binary", ruri::Quantization::Binary),
        ("ubinary", ruri::Quantization::Ubinary),
    ] {
        // Ranges from the whole corpus, over chunks of 2: as quantize_embeddings on all rows.
        let want = quantized(&f32s, 64, precision, None);
        let npy = dir.path().join(format!("{name}.npy"));
        ok(embed(
            &[
                "--input",
                inp,
                "--output",
                npy.to_str().unwrap(),
                "--quantize",
                name,
                "--chunk",
                "2",
            ],
            None,
        ));
        let bytes = fs::read(&npy).unwrap();
        let data_start = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!(&bytes[data_start..], &want[..], "{name}");
        let header = String::from_utf8_lossy(&bytes[..data_start]).into_owned();
        let dtype = if precision.is_signed() { "|i1" } else { "|u1" };
        assert!(header.contains(dtype), "{header}");

        // The same to stdout as JSON lines (spooled: the ranges need every row).
        let rows = json_lines(
            &ok(embed(
                &["--input", inp, "--quantize", name, "--chunk", "2"],
                None,
            ))
            .stdout,
        );
        let from_json: Vec<u8> = rows
            .iter()
            .flat_map(|r| {
                r["embedding"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap() as u8)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(from_json, want, "{name} jsonl");

        // And as Parquet, the list's item type matching.
        let pq = dir.path().join(format!("{name}.parquet"));
        ok(embed(
            &[
                "--input",
                inp,
                "--output",
                pq.to_str().unwrap(),
                "--quantize",
                name,
            ],
            None,
        ));
        let mut got = Vec::new();
        for batch in read_parquet(&pq) {
            let list = batch
                .column_by_name("embedding")
                .unwrap()
                .as_fixed_size_list();
            for i in 0..batch.num_rows() {
                let v = list.value(i);
                if precision.is_signed() {
                    got.extend(
                        v.as_primitive::<Int8Type>()
                            .values()
                            .iter()
                            .map(|&x| x as u8),
                    );
                } else {
                    got.extend_from_slice(v.as_primitive::<UInt8Type>().values());
                }
            }
        }
        assert_eq!(got, want, "{name} parquet");
    }

    // Calibration from a file: the ranges of those vectors, not the corpus's.
    let calibration = dir.path().join("calib.npy");
    ok(embed(
        &[
            "--input",
            inp,
            "--output",
            calibration.to_str().unwrap(),
            "--task",
            "query",
        ],
        None,
    ));
    let calib_bytes = fs::read(&calibration).unwrap();
    let start = 10 + u16::from_le_bytes([calib_bytes[8], calib_bytes[9]]) as usize;
    let calib: Vec<f32> = calib_bytes[start..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let ranges = ruri::QuantizationRanges::from_vectors(&calib, 64).unwrap();
    let want = quantized(&f32s, 64, ruri::Quantization::Uint8, Some(&ranges));
    let out = dir.path().join("calibrated.npy");
    ok(embed(
        &[
            "--input",
            inp,
            "--output",
            out.to_str().unwrap(),
            "--quantize",
            "uint8",
            "--calibration",
            calibration.to_str().unwrap(),
        ],
        None,
    ));
    let bytes = fs::read(&out).unwrap();
    let start = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!(&bytes[start..], &want[..]);
    assert_ne!(
        want,
        quantized(&f32s, 64, ruri::Quantization::Uint8, None),
        "the calibration set matters"
    );
}

fn corpus(n: usize) -> String {
    let reference = Reference::tiny();
    let texts = plain_texts(&reference);
    (0..n)
        .map(|i| {
            serde_json::json!({"id": i, "text": format!("{} {i}", texts[i % texts.len()])})
                .to_string()
                + "\n"
        })
        .collect()
}

#[test]
fn an_interrupted_run_resumes_to_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.jsonl");
    fs::write(&input, corpus(40)).unwrap();
    let inp = input.to_str().unwrap();
    // The last case quantizes with the corpus's ranges: the resumed run must take the
    // chunks it kept into them.
    for (name, ext, quantize) in [
        ("f32", "jsonl", None),
        ("f32", "npy", None),
        ("f32", "parquet", None),
        ("int8", "npy", Some("int8")),
    ] {
        let whole = dir.path().join(format!("whole-{name}.{ext}"));
        let mut args = vec![
            "--input",
            inp,
            "--chunk",
            "7",
            "--output",
            whole.to_str().unwrap(),
        ];
        if ext != "npy" {
            args.extend(["--id-field", "id"]);
        }
        if let Some(precision) = quantize {
            args.extend(["--quantize", precision]);
        }
        ok(embed(&args, None));

        let part = dir.path().join(format!("part-{name}.{ext}"));
        let partial = dir.path().join(format!("part-{name}.{ext}.ruri-partial"));
        let p = part.to_str().unwrap().to_owned();
        let args: Vec<&str> = args
            .iter()
            .map(|a| {
                if *a == whole.to_str().unwrap() {
                    p.as_str()
                } else {
                    a
                }
            })
            .collect();
        let mut command = ruri();
        let stopped = command
            .arg("embed")
            .arg("--model")
            .arg(tiny_model_dir())
            .args(["--backend", "native"])
            .args(&args)
            .env("RURI_CLI_TEST_STOP_AFTER_CHUNKS", "3")
            .output()
            .unwrap();
        assert_eq!(stopped.status.code(), Some(3), "{}", stderr(&stopped));
        assert!(!part.exists(), "no output before the run completes");
        assert_eq!(
            fs::read_dir(&partial).unwrap().count(),
            4,
            "manifest and three chunks"
        );
        // A chunk being written when the run died is left as a temporary file.
        fs::write(partial.join(".chunk-00000003.bin.tmp"), b"half a chunk").unwrap();

        let again = embed(&args, None);
        assert!(!again.status.success());
        assert!(stderr(&again).contains("--resume"), "{}", stderr(&again));
        let mut other = args.clone();
        other.extend(["--task", "query"]);
        other.push("--resume");
        let refused = embed(&other, None);
        assert!(
            stderr(&refused).contains("task differ"),
            "{}",
            stderr(&refused)
        );

        let mut resume = args.clone();
        resume.push("--resume");
        let resumed = ok(embed(&resume, None));
        assert!(
            stderr(&resumed).contains("resumed after 21 records"),
            "{}",
            stderr(&resumed)
        );
        assert!(
            stderr(&resumed).contains("40 texts"),
            "{}",
            stderr(&resumed)
        );
        assert_eq!(fs::read(&part).unwrap(), fs::read(&whole).unwrap(), "{ext}");
        assert!(!partial.exists());
    }
}

#[test]
fn bad_records_fail_naming_them_or_are_skipped_and_listed() {
    let input = b"{\"text\": \"a\", \"id\": 1}\nnot json\n{\"id\": 3}\n{\"text\": 4, \"id\": 4}\n{\"text\": \"\xff\"}\n{\"text\": \"b\", \"id\": 6}\n";
    let out = embed(
        &["--input-format", "jsonl", "--id-field", "id"],
        Some(input),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("line 2 is not JSON"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty() || json_lines(&out.stdout).len() == 1);

    let out = ok(embed(
        &[
            "--input-format",
            "jsonl",
            "--id-field",
            "id",
            "--on-error",
            "skip",
        ],
        Some(input),
    ));
    let rows = json_lines(&out.stdout);
    assert_eq!(
        rows.iter()
            .map(|r| r["id"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, 6]
    );
    let err = stderr(&out);
    assert!(
        err.contains("2 texts") && err.contains("4 skipped"),
        "{err}"
    );
    for wanted in [
        "skipped line 2: is not JSON",
        "skipped line 3: has no \"text\" field",
        "skipped line 4: has \"text\" as a number, not a string",
        "skipped line 5: is not valid UTF-8",
    ] {
        assert!(err.contains(wanted), "{wanted:?} in {err}");
    }

    // A text over the model's length under --truncate error is a bad record too.
    let long = format!("short\n{}\n", "長い文章です。".repeat(400));
    let out = embed(&["--truncate", "error"], Some(long.as_bytes()));
    assert!(stderr(&out).contains("line 2 has"), "{}", stderr(&out));
    let out = ok(embed(
        &["--truncate", "error", "--on-error", "skip"],
        Some(long.as_bytes()),
    ));
    assert_eq!(json_lines(&out.stdout).len(), 1);
    let out = ok(embed(&[], Some(long.as_bytes())));
    let rows = json_lines(&out.stdout);
    assert_eq!(rows[1]["truncated"], true);
    assert!(stderr(&out).contains("1 truncated"), "{}", stderr(&out));
}

#[test]
fn unreadable_inputs_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();

    // A Parquet text column that holds numbers, a missing column, a file that is not Parquet.
    let numbers = arrow_array::Int32Array::from(vec![1, 2]);
    let batch =
        RecordBatch::try_from_iter([("text", Arc::new(numbers) as Arc<dyn Array>)]).unwrap();
    write_parquet(
        Path::new(&path("ints.parquet")),
        &batch,
        parquet::basic::Compression::SNAPPY,
    );
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--input".into(), path("ints.parquet")],
            "holds Int32, not strings",
        ),
        (
            vec![
                "--input".into(),
                path("ints.parquet"),
                "--text-field".into(),
                "body".into(),
            ],
            "no column \"body\" (its columns: text)",
        ),
        (vec!["--input".into(), path("missing.txt")], "missing.txt"),
        (vec!["--input".into(), path("in.unknown")], "--input-format"),
        (vec!["--output".into(), path("out.bin")], "--output-format"),
        (
            vec!["--input".into(), path("bad.parquet")],
            "not a readable Parquet file",
        ),
        (
            vec!["--input".into(), path("bad.csv")],
            "no column \"text\" (its columns: a, b)",
        ),
        (vec!["--resume".into()], "--resume needs --input FILE"),
        (vec!["--chunk".into(), "0".into()], "--chunk"),
        (
            vec![
                "--quantize".into(),
                "binary".into(),
                "--calibration".into(),
                path("c.npy"),
            ],
            "binary and ubinary use none",
        ),
        (
            vec![
                "--quantize".into(),
                "int8".into(),
                "--calibration".into(),
                path("bad.csv"),
            ],
            "not a .npy file",
        ),
        (
            vec![
                "--output".into(),
                path("o.npy"),
                "--id-field".into(),
                "id".into(),
            ],
            "vectors only",
        ),
        (
            vec!["--prompt-name".into(), "nonexistent".into()],
            "nonexistent",
        ),
    ];
    fs::write(path("in.unknown"), "x").unwrap();
    fs::write(path("bad.parquet"), "not parquet at all").unwrap();
    fs::write(path("bad.csv"), "a,b\n1,2\n").unwrap();
    for (args, wanted) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = embed(&args, Some(b"x\n"));
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stderr(&out).contains(wanted),
            "{args:?}: {wanted:?} not in {}",
            stderr(&out)
        );
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // Nothing is left behind by a run that failed before embedding.
    assert!(!Path::new(&path("o.npy.ruri-partial")).exists());
}

#[test]
fn a_pipe_gets_a_summary_and_no_progress_bar() {
    let out = ok(embed(&[], Some("一つ目\n二つ目\n".as_bytes())));
    let err = stderr(&out);
    assert!(err.starts_with("ruri embed: 2 texts,"), "{err}");
    assert!(err.contains("→ stdout"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        !err.contains('\r') && !err.contains('\u{1b}'),
        "no terminal control: {err:?}"
    );
    let quiet = ok(embed(&["--quiet"], Some("一つ目\n".as_bytes())));
    assert!(quiet.stderr.is_empty());
}

#[test]
fn model_is_required_and_serve_is_the_server() {
    let out = ruri()
        .args(["embed"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--model is required"),
        "{}",
        stderr(&out)
    );
    let help = ruri().args(["serve", "--help"]).output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("--addr") && text.contains("RURI_ADDR"),
        "{text}"
    );
}
