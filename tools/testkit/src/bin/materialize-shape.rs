//! Writes a committed shape's model folder (configs, tokenizer, `model.safetensors`, the ONNX
//! files) for benchmarks on shapes other than the 30m one:
//!
//! ```text
//! cargo run --release -p ruri-testkit --bin materialize-shape -- 310m testdata/generated/310m-shape
//! target/release/examples/compare --model testdata/generated/310m-shape --systems native_int8,fused_int8
//! ```

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [size, dest] = &args[..] else {
        eprintln!("usage: materialize-shape SIZE DEST (SIZE: 30m, 70m, 130m, 310m)");
        std::process::exit(2);
    };
    let set = ruri_testkit::shapes::ShapeSet::committed();
    let recipe = set.recipe_dir(size);
    if !recipe.join("weights.json").is_file() {
        eprintln!("no recipe {}", recipe.display());
        std::process::exit(2);
    }
    let dest = std::path::Path::new(dest);
    if let Err(e) = std::fs::create_dir_all(dest) {
        eprintln!("creating {}: {e}", dest.display());
        std::process::exit(1);
    }
    ruri_testkit::shapes::materialize_into(&recipe, set.tokenizer_dir(), dest);
    println!("{}", dest.display());
}
