//! Writes ruri's int8 file of a model folder with the default options of `ruri quantize`
//! (int8 embedding table, outlier channels), for tools/wasm/test.sh, which checks that the
//! WebAssembly build's `quantize` writes the same bytes:
//!
//! ```text
//! cargo run -p ruri-native --example write_int8 -- MODEL_DIR OUT_FILE [f32]
//! ```
//!
//! (`f32`: the f32 embedding table, as `ruri quantize --embedding-table f32`.)

use ruri_native::EmbeddingTable;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, out, table) = match &args[..] {
        [model, out] => (model, out, EmbeddingTable::Int8),
        [model, out, f32] if f32 == "f32" => (model, out, EmbeddingTable::F32),
        _ => return Err("usage: write_int8 MODEL_DIR OUT_FILE [f32]".into()),
    };
    let bytes = ruri_native::builder()
        .embedding_table(table)
        .write_int8_file(model, out)
        .map_err(|e| ruri_core::error_chain(&e).to_string())?;
    println!("wrote {out} ({bytes} bytes)");
    Ok(())
}
