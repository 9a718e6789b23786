//! `ruri embed`: a corpus in, its vectors out, a chunk at a time.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, UNIX_EPOCH};

use ruri::cli::ModelArgs;
use ruri::{EmbedOptions, Error, Quantization, QuantizationRanges, Task, TextEmbedder, Truncation};
use serde_json::json;

use crate::input::{self, Fields, InputFormat, Location, Record};
use crate::npy;
use crate::output::{Encoder, OutputFormat, RowMeta, Storage};
use crate::spool::{self, Chunk, Manifest, Spool};

/// `--task`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TaskArg {
    /// "検索クエリ: "
    Query,
    /// "検索文書: "
    Document,
    /// "トピック: "
    Topic,
    /// No prompt.
    None,
}

/// `--truncate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TruncateArg {
    /// Keep the first tokens and `</s>`, count the text as truncated (sentence-transformers'
    /// behaviour).
    Truncate,
    /// A text over the model's maximum length is an error of its record (see --on-error).
    Error,
}

/// `--on-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnError {
    /// Stop at the first bad record, naming it.
    Fail,
    /// Leave bad records out and list them at the end.
    Skip,
}

/// `--quantize`: sentence-transformers' `quantize_embeddings` precisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantizeArg {
    /// One signed byte per dimension, from per-dimension ranges.
    Int8,
    /// One unsigned byte per dimension, from per-dimension ranges.
    Uint8,
    /// One bit per dimension (x > 0), packed, each byte minus 128 as int8.
    Binary,
    /// One bit per dimension (x > 0), packed, as uint8.
    Ubinary,
}

impl From<QuantizeArg> for Quantization {
    fn from(arg: QuantizeArg) -> Self {
        match arg {
            QuantizeArg::Int8 => Quantization::Int8,
            QuantizeArg::Uint8 => Quantization::Uint8,
            QuantizeArg::Binary => Quantization::Binary,
            QuantizeArg::Ubinary => Quantization::Ubinary,
        }
    }
}

/// Embed a corpus: a text a line, JSON lines, CSV/TSV or Parquet in; JSON lines, .npy or
/// Parquet out (formats by file extension). Reads and embeds --chunk records at a time, so
/// memory stays bounded; a file output appears complete or not at all, and an interrupted run
/// continues with --resume.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    ruri embed --model cl-nagoya/ruri-v3-30m --input docs.jsonl --output docs.parquet --task document\n  \
    echo '瑠璃色はどんな色？' | ruri embed --model ./ruri-v3-30m --task query\n  \
    ruri embed --model ./ruri-v3-30m --input corpus.parquet --output corpus.npy --quantize binary")]
pub struct EmbedArgs {
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The corpus (`-`: stdin). Its format comes from the extension (.txt, .jsonl, .csv,
    /// .tsv, .parquet), or --input-format.
    #[arg(long, short, default_value = "-")]
    pub input: PathBuf,
    /// Where the vectors go (`-`: stdout). Its format comes from the extension (.jsonl, .npy,
    /// .parquet), or --output-format. A file is written beside itself
    /// (`OUTPUT.ruri-partial/`) and appears complete, replacing any file of that name, at the
    /// end.
    #[arg(long, short, default_value = "-")]
    pub output: PathBuf,
    /// The input's format (default: from the extension; txt for stdin).
    #[arg(long, value_enum)]
    pub input_format: Option<InputFormat>,
    /// The output's format (default: from the extension; jsonl for stdout).
    #[arg(long, value_enum)]
    pub output_format: Option<OutputFormat>,
    /// The field (JSON lines) or column (CSV, TSV, Parquet) holding the text.
    #[arg(long, default_value = "text")]
    pub text_field: String,
    /// The field or column holding each record's id, copied to the output (JSON lines,
    /// Parquet).
    #[arg(long)]
    pub id_field: Option<String>,
    /// Prompt to prepend.
    #[arg(long, value_enum, default_value_t = TaskArg::None, conflicts_with = "prompt_name")]
    pub task: TaskArg,
    /// A prompt by its name in the model's config_sentence_transformers.json.
    #[arg(long)]
    pub prompt_name: Option<String>,
    /// Texts longer than the model's maximum length.
    #[arg(long, value_enum, default_value_t = TruncateArg::Truncate)]
    pub truncate: TruncateArg,
    /// Mean-pooled vectors as they are, not scaled to unit length.
    #[arg(long)]
    pub raw: bool,
    /// Store quantized vectors, byte for byte as sentence-transformers' quantize_embeddings.
    /// int8 and uint8 take per-dimension ranges from --calibration, or else from the whole
    /// corpus once it is embedded (as sentence-transformers does without calibration).
    #[arg(long, value_enum)]
    pub quantize: Option<QuantizeArg>,
    /// A float32 .npy file of calibration embeddings (vectors × dimensions), whose
    /// per-dimension minimum and maximum are int8's and uint8's ranges.
    #[arg(long, requires = "quantize")]
    pub calibration: Option<PathBuf>,
    /// Records read and embedded at a time (bounds memory; the unit --resume continues from).
    #[arg(long, default_value_t = 1024)]
    pub chunk: usize,
    /// Continue an interrupted run from its last complete chunk (same options, same input);
    /// with nothing to continue, start.
    #[arg(long)]
    pub resume: bool,
    /// Records that cannot be embedded (not JSON, a missing or non-string field, invalid
    /// UTF-8, a null, a text too long under --truncate error).
    #[arg(long, value_enum, default_value_t = OnError::Fail)]
    pub on_error: OnError,
    /// ONNX Runtime intra-op threads, or the native engine's (default: the backend's choice).
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress bar and no summary.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What a run did.
#[derive(Debug, Default)]
struct Stats {
    records: u64,
    texts: u64,
    tokens: u64,
    truncated: u64,
    skipped: Vec<(Location, String)>,
    /// Per-dimension minimum and maximum of the vectors so far (the corpus's int8/uint8
    /// ranges), kept only when asked for: the spool is not read a second time for them.
    bounds: Option<(Vec<f32>, Vec<f32>)>,
}

impl Stats {
    /// Stats that also track the vectors' per-dimension bounds.
    fn with_bounds(dim: usize) -> Self {
        Stats {
            bounds: Some((vec![f32::INFINITY; dim], vec![f32::NEG_INFINITY; dim])),
            ..Stats::default()
        }
    }

    fn add(&mut self, chunk: &Chunk) {
        if let Some((min, max)) = &mut self.bounds {
            for row in chunk.vectors.chunks_exact(min.len()) {
                for ((lo, hi), &v) in min.iter_mut().zip(max.iter_mut()).zip(row) {
                    *lo = lo.min(v);
                    *hi = hi.max(v);
                }
            }
        }
        self.records += chunk.records;
        self.texts += chunk.meta.len() as u64;
        self.tokens += chunk.meta.iter().map(|m| u64::from(m.tokens)).sum::<u64>();
        self.truncated += chunk.meta.iter().filter(|m| m.truncated).count() as u64;
        self.skipped.extend(chunk.skipped.iter().cloned());
    }
}

/// Where the vectors go.
enum Sink {
    /// Straight to stdout, chunk by chunk (JSON lines and Parquet without corpus ranges).
    Direct(Box<Encoder<BufWriter<io::Stdout>>>),
    /// Into chunk files, assembled at the end into `target` (stdout when `None`).
    Spool {
        spool: Spool,
        target: Option<PathBuf>,
        /// The temporary folder of a spool for stdout.
        _temp: Option<tempfile::TempDir>,
    },
}

fn is_dash(path: &Path) -> bool {
    path.as_os_str() == "-"
}

fn extension(path: &Path) -> Option<&str> {
    path.extension().and_then(|e| e.to_str())
}

/// Runs `ruri embed`; the error is the message to print.
pub fn run(args: EmbedArgs) -> Result<(), String> {
    let start = Instant::now();
    if args.chunk == 0 {
        return Err("--chunk must be at least 1".into());
    }
    let model = args.model.model.clone().ok_or(
        "--model is required: a model folder, or a Hugging Face Hub id such as cl-nagoya/ruri-v3-30m",
    )?;
    let from_stdin = is_dash(&args.input);
    let to_stdout = is_dash(&args.output);
    let input_format = match (args.input_format, from_stdin) {
        (Some(format), _) => format,
        (None, true) => InputFormat::Txt,
        (None, false) => extension(&args.input)
            .and_then(InputFormat::from_extension)
            .ok_or_else(|| {
                format!(
                    "cannot tell the format of {} from its name: pass --input-format \
                     (txt, jsonl, csv, tsv, parquet)",
                    args.input.display()
                )
            })?,
    };
    let output_format = match (args.output_format, to_stdout) {
        (Some(format), _) => format,
        (None, true) => OutputFormat::Jsonl,
        (None, false) => extension(&args.output)
            .and_then(OutputFormat::from_extension)
            .ok_or_else(|| {
                format!(
                    "cannot tell the format of {} from its name: pass --output-format \
                     (jsonl, npy, parquet)",
                    args.output.display()
                )
            })?,
    };
    if args.resume && (from_stdin || to_stdout) {
        return Err(
            "--resume needs --input FILE and --output FILE (a pipe cannot be read again)".into(),
        );
    }
    if to_stdout && output_format != OutputFormat::Jsonl && io::stdout().is_terminal() {
        return Err(format!(
            "the {output_format:?} output is binary: redirect stdout, or pass --output FILE"
        ));
    }
    let quantize = args.quantize.map(Quantization::from);
    if args.calibration.is_some() && !quantize.is_some_and(Quantization::uses_ranges) {
        return Err("--calibration sets the ranges of --quantize int8 or uint8; binary and ubinary use none".into());
    }
    if args.id_field.is_some() && output_format == OutputFormat::Npy {
        return Err(
            "--id-field: a .npy file holds vectors only; write JSON lines or Parquet to keep ids"
                .into(),
        );
    }
    if !to_stdout && args.output.is_dir() {
        return Err(format!("--output {} is a folder", args.output.display()));
    }

    // The input opens before the model loads: a wrong path fails at once.
    let (reader, file, total_bytes, identity) = open_input(&args.input, input_format)?;

    let embedder = args
        .model
        .config()
        .threads(args.threads)
        .build_from_arg(&model, args.model.revision.as_deref())
        .map_err(|e| describe(&e))?;
    let task = match (&args.prompt_name, args.task) {
        (Some(name), _) => Task::Named(name.clone()),
        (None, TaskArg::Query) => Task::Query,
        (None, TaskArg::Document) => Task::Document,
        (None, TaskArg::Topic) => Task::Topic,
        (None, TaskArg::None) => Task::None,
    };
    let options = EmbedOptions::new(task).truncation(match args.truncate {
        TruncateArg::Truncate => Truncation::Truncate,
        TruncateArg::Error => Truncation::Error,
    });
    // An unknown prompt name fails before any input is read.
    embedder
        .tokenize(&[""], &options)
        .map_err(|e| describe(&e))?;
    let dim = embedder.dim();
    let loaded = Instant::now();
    let ranges = match &args.calibration {
        None => None,
        Some(path) => {
            let matrix = npy::read_f32(path)?;
            if matrix.cols != dim {
                return Err(format!(
                    "calibration file {}: vectors of {} dimensions, the model's have {dim}",
                    path.display(),
                    matrix.cols
                ));
            }
            Some(
                QuantizationRanges::from_vectors(&matrix.data, matrix.cols).map_err(|e| {
                    format!("calibration file {}: {}", path.display(), describe(&e))
                })?,
            )
        }
    };
    let corpus_ranges = quantize.is_some_and(Quantization::uses_ranges) && ranges.is_none();
    let mut storage = Storage {
        dim,
        quantize: quantize.map(|q| (q, ranges)),
    };

    let new_stats = || {
        if corpus_ranges {
            Stats::with_bounds(dim)
        } else {
            Stats::default()
        }
    };
    let mut before = new_stats();
    let mut sink = if to_stdout && output_format != OutputFormat::Npy && !corpus_ranges {
        let out = BufWriter::new(io::stdout());
        Sink::Direct(Box::new(Encoder::new(output_format, out, &storage, None)?))
    } else if to_stdout {
        let temp = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
        Sink::Spool {
            spool: Spool::temporary(temp.path(), dim),
            target: None,
            _temp: Some(temp),
        }
    } else {
        let manifest = manifest(&args, &model, input_format, output_format, identity)?;
        let (spool, done) = Spool::open(partial_dir(&args.output), &manifest, dim, args.resume)?;
        for path in &done {
            before.add(&spool::read_chunk(path)?);
        }
        Sink::Spool {
            spool,
            target: Some(args.output.clone()),
            _temp: None,
        }
    };

    let fields = Fields {
        text: args.text_field.clone(),
        id: args.id_field.clone(),
    };
    let mut source = input::open(
        input_format,
        reader,
        file,
        total_bytes,
        &fields,
        args.chunk,
        before.records,
    )?;
    let progress =
        (!args.quiet && io::stderr().is_terminal()).then(|| progress_bar(source.total()));
    let stop_after = test_stop_after();
    let mut now = new_stats();
    let mut records = Vec::with_capacity(args.chunk);
    let mut chunks = 0u64;
    loop {
        records.clear();
        source.read(args.chunk, &mut records)?;
        if records.is_empty() {
            break;
        }
        let chunk = embed_chunk(&embedder, &options, !args.raw, &mut records, args.on_error)?;
        now.add(&chunk);
        match &mut sink {
            Sink::Direct(encoder) => encoder.write(&storage, &chunk.meta, &chunk.vectors)?,
            Sink::Spool { spool, .. } => spool.push(&chunk)?,
        }
        chunks += 1;
        if let Some(bar) = &progress {
            let secs = loaded.elapsed().as_secs_f64().max(1e-9);
            bar.set_position(source.position());
            bar.set_message(format!(
                "{} texts · {:.0} texts/s · {:.0} tokens/s",
                before.texts + now.texts,
                now.texts as f64 / secs,
                now.tokens as f64 / secs
            ));
        }
        if stop_after == Some(chunks) {
            eprintln!(
                "ruri embed: stopping after {chunks} chunks (RURI_CLI_TEST_STOP_AFTER_CHUNKS)"
            );
            std::process::exit(3);
        }
    }
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }

    match sink {
        Sink::Direct(encoder) => {
            encoder.finish(&storage, args.id_field.is_some())?;
        }
        Sink::Spool { spool, target, .. } => {
            let chunks = spool.chunk_paths();
            if corpus_ranges {
                let precision = quantize.expect("corpus ranges are for a quantization");
                storage.quantize =
                    Some((precision, Some(corpus_ranges_of(&before, &now, precision)?)));
            }
            let rows = before.texts + now.texts;
            let with_ids = args.id_field.is_some();
            match &target {
                None => {
                    assemble(
                        &chunks,
                        output_format,
                        &storage,
                        rows,
                        with_ids,
                        BufWriter::new(io::stdout()),
                    )?;
                }
                Some(path) => {
                    let tmp = spool::tmp_sibling(path);
                    let fail = |e: io::Error| format!("writing {}: {e}", tmp.display());
                    let file = BufWriter::new(File::create(&tmp).map_err(fail)?);
                    let file = assemble(&chunks, output_format, &storage, rows, with_ids, file)?;
                    file.into_inner()
                        .map_err(|e| fail(e.into_error()))?
                        .sync_all()
                        .map_err(fail)?;
                    fs::rename(&tmp, path).map_err(|e| {
                        format!("renaming {} to {}: {e}", tmp.display(), path.display())
                    })?;
                    fs::remove_dir_all(spool.dir())
                        .map_err(|e| format!("removing {}: {e}", spool.dir().display()))?;
                }
            }
        }
    }

    if !args.quiet {
        summary(&before, &now, start, loaded, &args.output);
    }
    Ok(())
}

/// `OUTPUT.ruri-partial` beside `OUTPUT`.
fn partial_dir(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_owned();
    name.push(".ruri-partial");
    output.with_file_name(name)
}

type Opened = (
    Box<dyn BufRead + Send>,
    Option<File>,
    Option<u64>,
    serde_json::Value,
);

fn open_input(path: &Path, format: InputFormat) -> Result<Opened, String> {
    if is_dash(path) {
        if format == InputFormat::Parquet {
            return Err("Parquet input needs a file (--input FILE), not stdin".into());
        }
        return Ok((
            Box::new(BufReader::new(io::stdin())),
            None,
            None,
            serde_json::Value::Null,
        ));
    }
    let fail = |e: io::Error| format!("--input {}: {e}", path.display());
    let file = File::open(path).map_err(fail)?;
    let meta = file.metadata().map_err(fail)?;
    if meta.is_dir() {
        return Err(format!("--input {} is a folder", path.display()));
    }
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos().to_string());
    let identity = json!({
        "path": fs::canonicalize(path).map_err(fail)?.display().to_string(),
        "bytes": meta.len(),
        "modified_ns": modified,
    });
    let (reader, parquet): (Box<dyn BufRead + Send>, Option<File>) =
        if format == InputFormat::Parquet {
            (Box::new(io::empty()), Some(file))
        } else {
            (Box::new(BufReader::with_capacity(1 << 16, file)), None)
        };
    Ok((reader, parquet, Some(meta.len()), identity))
}

/// Everything that decides the output's bytes: a resumed run must match it.
fn manifest(
    args: &EmbedArgs,
    model: &Path,
    input_format: InputFormat,
    output_format: OutputFormat,
    input: serde_json::Value,
) -> Result<Manifest, String> {
    let calibration = match &args.calibration {
        None => serde_json::Value::Null,
        Some(path) => {
            let meta =
                fs::metadata(path).map_err(|e| format!("--calibration {}: {e}", path.display()))?;
            json!({ "path": path.display().to_string(), "bytes": meta.len() })
        }
    };
    let value = json!({
        "ruri": env!("CARGO_PKG_VERSION"),
        "input": input,
        "input_format": input_format,
        "text_field": args.text_field,
        "id_field": args.id_field,
        "output_format": output_format,
        "model": model.display().to_string(),
        "revision": args.model.revision,
        "config": format!("{:?}", args.model.config().threads(args.threads)),
        "task": format!("{:?}", args.task),
        "prompt_name": args.prompt_name,
        "truncate": format!("{:?}", args.truncate),
        "raw": args.raw,
        "quantize": args.quantize.map(|q| Quantization::from(q).name()),
        "calibration": calibration,
        "chunk": args.chunk,
        "on_error": format!("{:?}", args.on_error),
    });
    match value {
        serde_json::Value::Object(map) => Ok(map),
        _ => unreachable!("json! of an object"),
    }
}

/// Embeds one chunk's good records; the bad ones are skipped or end the run.
fn embed_chunk(
    embedder: &TextEmbedder,
    options: &EmbedOptions,
    normalize: bool,
    records: &mut Vec<Record>,
    on_error: OnError,
) -> Result<Chunk, String> {
    let mut chunk = Chunk {
        records: records.len() as u64,
        ..Chunk::default()
    };
    let mut texts = Vec::with_capacity(records.len());
    let mut meta = Vec::with_capacity(records.len());
    let mut locations = Vec::with_capacity(records.len());
    // Skipped records, by input index (a too-long text is found after the others).
    let mut skipped: Vec<(u64, Location, String)> = Vec::new();
    let mut bad = |index: u64, location: Location, message: String| match on_error {
        OnError::Fail => Err(format!(
            "{location} {message} (--on-error skip leaves such records out)"
        )),
        OnError::Skip => {
            skipped.push((index, location, message));
            Ok(())
        }
    };
    for record in records.drain(..) {
        match record.content {
            Ok((text, id)) => {
                texts.push(text);
                meta.push(RowMeta {
                    row: record.index,
                    id,
                    tokens: 0,
                    truncated: false,
                });
                locations.push(record.location);
            }
            Err(message) => bad(record.index, record.location, message)?,
        }
    }
    let encodings = loop {
        match embedder.tokenize(&texts, options) {
            Ok(encodings) => break encodings,
            Err(Error::InputTooLong { index, tokens, max }) => {
                bad(
                    meta[index].row,
                    locations[index],
                    format!(
                        "has {tokens} tokens, more than the model's {max} (--truncate truncate \
                         cuts it)"
                    ),
                )?;
                texts.remove(index);
                meta.remove(index);
                locations.remove(index);
            }
            Err(e) => return Err(describe(&e)),
        }
    };
    skipped.sort_by_key(|(index, _, _)| *index);
    chunk.skipped = skipped.into_iter().map(|(_, l, m)| (l, m)).collect();
    if texts.is_empty() {
        return Ok(chunk);
    }
    let embeddings = embedder
        .embed_encodings(&encodings, normalize)
        .map_err(|e| describe(&e))?;
    for (m, encoding) in meta.iter_mut().zip(&encodings) {
        m.tokens = encoding.len() as u32;
        m.truncated = encoding.truncated();
    }
    chunk.meta = meta;
    chunk.vectors = embeddings.into_vec();
    Ok(chunk)
}

/// int8's and uint8's ranges from the whole corpus (sentence-transformers' rule without a
/// calibration set: the minimum and maximum of the embeddings being quantized), from the
/// bounds the resumed and the new chunks were added with.
fn corpus_ranges_of(
    before: &Stats,
    now: &Stats,
    precision: Quantization,
) -> Result<QuantizationRanges, String> {
    let rows = before.texts + now.texts;
    if rows < 2 {
        return Err(format!(
            "--quantize {precision} without --calibration takes its ranges from the corpus, \
             which needs at least two embedded texts ({rows} here)"
        ));
    }
    let ((min, max), (min_now, max_now)) = match (&before.bounds, &now.bounds) {
        (Some(b), Some(n)) => (b.clone(), n),
        _ => unreachable!("both track bounds when the corpus gives the ranges"),
    };
    let min = min.iter().zip(min_now).map(|(a, b)| a.min(*b)).collect();
    let max = max.iter().zip(max_now).map(|(a, b)| a.max(*b)).collect();
    QuantizationRanges::new(min, max)
        .map_err(|e| format!("--quantize {precision}: {}", describe(&e)))
}

/// Writes the chunks, in order, as `format` to `out`.
fn assemble<W: Write + Send>(
    chunks: &[PathBuf],
    format: OutputFormat,
    storage: &Storage,
    rows: u64,
    with_ids: bool,
    out: W,
) -> Result<W, String> {
    let mut encoder = Encoder::new(format, out, storage, Some(rows))?;
    for path in chunks {
        let chunk = spool::read_chunk(path)?;
        encoder.write(storage, &chunk.meta, &chunk.vectors)?;
    }
    encoder.finish(storage, with_ids)
}

fn progress_bar(total: Option<u64>) -> indicatif::ProgressBar {
    match total {
        Some(total) => {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{elapsed_precise} [{wide_bar}] {percent:>3}% ETA {eta} {msg}",
                )
                .expect("the template is valid"),
            );
            bar
        }
        None => {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
                    .expect("the template is valid"),
            );
            bar
        }
    }
}

/// A test seam: `RURI_CLI_TEST_STOP_AFTER_CHUNKS=N` ends the process (exit status 3) right
/// after its N-th chunk is stored, as a kill between chunks would, so the tests of --resume
/// need no timing.
fn test_stop_after() -> Option<u64> {
    std::env::var("RURI_CLI_TEST_STOP_AFTER_CHUNKS")
        .ok()?
        .parse()
        .ok()
}

/// One line on stderr; the rates are over the time since the model loaded.
fn summary(before: &Stats, now: &Stats, start: Instant, loaded: Instant, output: &Path) {
    let secs = start.elapsed().as_secs_f64();
    let load = (loaded - start).as_secs_f64();
    let embedding = loaded.elapsed().as_secs_f64().max(1e-9);
    let texts = before.texts + now.texts;
    let tokens = before.tokens + now.tokens;
    let truncated = before.truncated + now.truncated;
    let skipped: Vec<&(Location, String)> = before.skipped.iter().chain(&now.skipped).collect();
    let resumed = if before.records > 0 {
        format!(", resumed after {} records", before.records)
    } else {
        String::new()
    };
    let target = if is_dash(output) {
        "stdout".to_owned()
    } else {
        output.display().to_string()
    };
    eprintln!(
        "ruri embed: {texts} texts, {tokens} tokens, {truncated} truncated, {} skipped → {target} \
         in {secs:.2} s (model load {load:.2} s; {:.0} texts/s, {:.0} tokens/s{resumed})",
        skipped.len(),
        now.texts as f64 / embedding,
        now.tokens as f64 / embedding,
    );
    for (location, message) in skipped {
        eprintln!("  skipped {location}: {message}");
    }
}

/// An error and its causes on one line.
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    ruri::error_chain(e).to_string()
}
