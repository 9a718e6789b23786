//! [`OrtBuilder`] from a Hugging Face Hub model id (the `hub` feature): the same file choice as
//! [`OrtBuilder::build_from_dir`], made on the repository's listing, so only the files that
//! run are downloaded.

use ruri_core::hub::{HubRepo, ModelSource, RemoteFiles};
use ruri_core::{Result, TextEmbedder};

use crate::OrtBuilder;

impl OrtBuilder {
    /// Downloads what this builder runs from a Hub repository into the standard cache (or
    /// finds it there), then [`build_from_dir`](Self::build_from_dir)s the snapshot: the
    /// configuration and tokenizer files, and `model.safetensors` for the fused graph or the
    /// one ONNX file (with its external data) otherwise — the choice `build_from_dir` makes,
    /// made on the repository's listing. `repo` is an id (`"org/name"`, at `main`, with
    /// [`Hub::from_env`](ruri_core::hub::Hub::from_env)) or a [`HubRepo`] with a revision
    /// and a [`Hub`](ruri_core::hub::Hub).
    ///
    /// ```
    /// # let mock = ruri_testkit::hub_mock::MockHub::start(ruri_testkit::hub_mock::tiny_repos());
    /// # let cache = ruri_testkit::TempDir::new().unwrap();
    /// use ruri_core::hub::{Hub, HubRepo};
    /// use ruri_ort::{Graph, Precision};
    ///
    /// // Here a loopback stand-in of the Hub (HF_ENDPOINT) and a fresh cache (HF_HUB_CACHE).
    /// let hub = Hub::from_env().endpoint(mock.endpoint()).cache_dir(cache.path());
    /// let embedder = ruri_ort::builder()
    ///     .graph(Graph::OnnxFile)
    ///     .precision(Precision::Int8)
    ///     .build_from_hub(HubRepo::new("ruri-test/tiny").revision("main").hub(hub))?;
    /// let query = embedder.embed_query("瑠璃色はどんな色？")?;
    /// assert_eq!(query.len(), embedder.dim());
    /// # Ok::<(), ruri_core::Error>(())
    /// ```
    pub fn build_from_hub(self, repo: impl Into<HubRepo>) -> Result<TextEmbedder> {
        let repo = repo.into();
        let dir = repo.snapshot(|files| {
            let mut wanted = files.config_files()?;
            wanted.extend(self.hub_weights(files)?);
            Ok(wanted)
        })?;
        self.build_from_dir(dir)
    }

    /// A folder or a Hub repository: [`build_from_dir`](Self::build_from_dir) or
    /// [`build_from_hub`](Self::build_from_hub). Command lines get a [`ModelSource`] from
    /// [`ModelSource::parse`], where an existing folder wins over an id.
    pub fn build(self, source: impl Into<ModelSource>) -> Result<TextEmbedder> {
        match source.into() {
            ModelSource::Dir(dir) => self.build_from_dir(dir),
            ModelSource::Hub(repo) => self.build_from_hub(repo),
        }
    }

    /// The weight files `build_from_dir` would read from a folder with `files`: the same
    /// graph choice (`OrtBuilder::runs_fused`, whose contradictory choices are refused
    /// before anything is fetched) and ONNX discovery.
    fn hub_weights(&self, files: &RemoteFiles) -> Result<Vec<String>> {
        const WEIGHTS: &str = "model.safetensors";
        // The same rule as build_from_dir's.
        if self.runs_fused(files.contains(WEIGHTS))? {
            return Ok(vec![files.require(WEIGHTS)?]);
        }
        let onnx = match &self.onnx_file {
            // A file on this machine: nothing to fetch for it.
            Some(path) if path.is_absolute() => return Ok(Vec::new()),
            Some(path) => {
                let relative = path
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                files.require(&relative)?
            }
            None => {
                let candidates = self.precision.candidates();
                match candidates.iter().find(|c| files.contains(c)) {
                    Some(found) => (*found).to_owned(),
                    None => {
                        return Err(files.missing(format!(
                            "{} ONNX file (looked for {})",
                            self.precision,
                            candidates.join(", ")
                        )));
                    }
                }
            }
        };
        // External data lies beside the graph: `model.onnx_data`, `model.onnx.data` (and
        // numbered parts), the names the ONNX exporters write.
        let mut wanted = vec![onnx.clone()];
        wanted.extend(
            files
                .files()
                .iter()
                .filter(|f| {
                    f.strip_prefix(onnx.as_str())
                        .is_some_and(|rest| rest.starts_with("_data") || rest.starts_with(".data"))
                })
                .cloned(),
        );
        Ok(wanted)
    }
}
