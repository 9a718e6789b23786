//! The README's shell corpus example (the block after its `readme-corpus-shell` marker), run
//! verbatim by `sh` in an empty folder, with this build's `ruri` first on the PATH and the
//! loopback mock Hub serving the tiny test model under the README's model id.

use std::fs;
use std::process::Command;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use ruri_testkit::hub_mock::{self, MockHub, TINY_MIRROR_REPO};
use ruri_testkit::repo_root;

fn readme_block(marker: &str) -> String {
    let readme = fs::read_to_string(repo_root().join("README.md")).unwrap();
    let at = readme
        .find(&format!("<!-- {marker}:"))
        .unwrap_or_else(|| panic!("README.md has a {marker} marker"));
    let rest = &readme[at..];
    let start = rest.find("```sh\n").expect("a sh block after the marker") + 6;
    let end = rest[start..].find("```").expect("the block ends");
    rest[start..start + end].to_owned()
}

#[test]
fn the_readme_corpus_commands_run_as_written() {
    let script = readme_block("readme-corpus-shell");
    let id = script
        .split("--model ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the block names a model")
        .to_owned();
    let mut repo = hub_mock::tiny_repos()
        .into_iter()
        .find(|r| r.id == TINY_MIRROR_REPO)
        .expect("the mirror repository");
    repo.id = id;
    let mock = MockHub::start(vec![repo]);
    let work = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ruri"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .args(["-euc", &script])
        .current_dir(work.path())
        .env("PATH", path)
        .env("HF_ENDPOINT", mock.endpoint())
        .env("HF_HUB_CACHE", cache.path())
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("RURI_CLI_TEST_STOP_AFTER_CHUNKS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("ruri embed: 2 texts").count(), 2, "{stderr}");

    let parquet = fs::File::open(work.path().join("docs.parquet")).unwrap();
    let mut ids = Vec::new();
    for batch in ParquetRecordBatchReaderBuilder::try_new(parquet)
        .unwrap()
        .build()
        .unwrap()
    {
        let batch = batch.unwrap();
        let column = batch
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int64Type>();
        ids.extend(column.values().iter().copied());
        assert_eq!(
            batch
                .column_by_name("embedding")
                .unwrap()
                .as_fixed_size_list()
                .value_length(),
            64
        );
    }
    assert_eq!(ids, [1, 2]);
    let npy = fs::read(work.path().join("docs.npy")).unwrap();
    let header_end = 10 + u16::from_le_bytes([npy[8], npy[9]]) as usize;
    let header = String::from_utf8_lossy(&npy[..header_end]);
    assert_eq!(npy.len(), header_end + 16, "two rows of 8 bytes");
    assert!(
        header.contains("'descr': '|u1'") && header.contains("'shape': (2, 8)"),
        "{header}"
    );
    assert!(!work.path().join("docs.npy.ruri-partial").exists());
}
