//! Model folders whose sentence-transformers pipeline the shared pipeline cannot reproduce are
//! refused, not silently embedded differently.

use ruri_core::{Error, ModelDir};
use ruri_testkit::{copy_model, edit_file, tiny_model_dir};

fn tiny_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_model(&tiny_model_dir(), dir.path(), &|_| true);
    dir
}

const NORMALIZE: &str = r#"{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}"#;

#[test]
fn a_trailing_normalize_module_is_accepted_and_reported() {
    let dir = tiny_copy();
    assert!(!ModelDir::open(dir.path()).unwrap().has_normalize_module());
    edit_file(
        &dir.path().join("modules.json"),
        "\n]",
        &format!(", {NORMALIZE}\n]"),
    );
    assert!(ModelDir::open(dir.path()).unwrap().has_normalize_module());
}

#[test]
fn modules_out_of_order_are_unsupported() {
    let dir = tiny_copy();
    // Normalize before Pooling: sentence-transformers would normalize token embeddings.
    edit_file(
        &dir.path().join("modules.json"),
        "[",
        &format!("[\n  {NORMALIZE},"),
    );
    match ModelDir::open(dir.path()) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("order"), "{what}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn pooling_without_prompt_tokens_is_unsupported() {
    let dir = tiny_copy();
    edit_file(
        &dir.path().join("1_Pooling/config.json"),
        "\"include_prompt\": true",
        "\"include_prompt\": false",
    );
    assert!(matches!(
        ModelDir::open(dir.path()),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn the_committed_folder_opens_with_its_prompts() {
    let dir = ModelDir::open(tiny_model_dir()).unwrap();
    assert_eq!(dir.prompts().get("query"), Some("検索クエリ: "));
    assert_eq!(dir.prompts().get("document"), Some("検索文書: "));
    assert_eq!(dir.prompts().get("topic"), Some("トピック: "));
    assert_eq!(dir.config().hidden_size, 64);
}

#[test]
fn default_prompt_name_is_read_from_the_sentence_transformers_config() {
    let dir = ModelDir::open(tiny_model_dir()).unwrap();
    // The committed file has `"default_prompt_name": null`, as the published Ruri v3 folders.
    assert_eq!(dir.prompts().default_name(), None);
    let copy = tiny_copy();
    edit_file(
        &copy.path().join("config_sentence_transformers.json"),
        r#""default_prompt_name": null"#,
        r#""default_prompt_name": "query""#,
    );
    let dir = ModelDir::open(copy.path()).unwrap();
    assert_eq!(dir.prompts().default_name(), Some("query"));
}
