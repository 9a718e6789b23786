//! `ruri quantize`: ruri's int8 weights file of a model folder, for `--prequantized` loads
//! (`ruri_native::NativeBuilder::write_int8_file`).

use std::path::PathBuf;
use std::time::Instant;

use ruri::native::{EmbeddingTable, INT8_FILE};

/// `--embedding-table`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableArg {
    /// Each row quantized to 8 bits with a scale of its own (a quarter of the f32 table;
    /// what the WebAssembly build holds by default).
    Int8,
    /// The checkpoint's rows in f32 (read a row per token by the native engine, its
    /// default).
    F32,
}

/// Write ruri's int8 weights file of a model folder: the int8 weights the native engine makes
/// from model.safetensors at load (per-channel scales, outlier channels in f32, the token
/// table), so that `--prequantized` loads read them instead of quantizing, to the same
/// vectors, bit for bit. A plain safetensors file; its __metadata__ records the format version,
/// the options below and the model's shape, and a load with other options or another
/// config.json is refused.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    ruri quantize ./ruri-v3-30m\n  \
    ruri embed --model ./ruri-v3-30m --precision int8 --prequantized --input docs.txt\n  \
    ruri quantize ./ruri-v3-30m --embedding-table f32 --out /tmp/model.ruri-int8.safetensors")]
pub struct QuantizeArgs {
    /// The model folder (config.json and model.safetensors).
    pub model: PathBuf,
    /// The file to write (default: MODEL/model.ruri-int8.safetensors, where --prequantized
    /// looks). It appears whole or not at all.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// How the token-embedding table is stored.
    #[arg(long, value_enum, default_value_t = TableArg::Int8)]
    pub embedding_table: TableArg,
    /// Quantize every input channel to int8, with no outlier channels kept in f32 (for
    /// comparisons: the vectors lose accuracy).
    #[arg(long)]
    pub no_outlier_channels: bool,
}

/// Runs `ruri quantize`; the error is the message to print.
pub fn run(args: QuantizeArgs) -> Result<(), String> {
    let start = Instant::now();
    let out = args.out.unwrap_or_else(|| args.model.join(INT8_FILE));
    let table = match args.embedding_table {
        TableArg::Int8 => EmbeddingTable::Int8,
        TableArg::F32 => EmbeddingTable::F32,
    };
    let bytes = ruri::native::builder()
        .embedding_table(table)
        .outlier_channels(!args.no_outlier_channels)
        .write_int8_file(&args.model, &out)
        .map_err(|e| ruri::error_chain(&e).to_string())?;
    eprintln!(
        "wrote {} ({:.1} MiB; embedding table {}, outlier channels {}) in {:.2} s",
        out.display(),
        bytes as f64 / (1 << 20) as f64,
        match args.embedding_table {
            TableArg::Int8 => "int8",
            TableArg::F32 => "f32",
        },
        if args.no_outlier_channels {
            "off"
        } else {
            "on"
        },
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
