//! [`NativeBuilder`] from a Hugging Face Hub model id (the `hub` feature): the configuration
//! and tokenizer files and `model.safetensors`, nothing else.

use ruri_core::hub::{HubRepo, ModelSource};
use ruri_core::{Result, TextEmbedder};

use crate::NativeBuilder;

impl NativeBuilder {
    /// Downloads the configuration and tokenizer files and `model.safetensors` of a Hub
    /// repository into the standard cache (or finds them there), then
    /// [`build_from_dir`](Self::build_from_dir)s the snapshot. `repo` is an id (`"org/name"`,
    /// at `main`, with [`Hub::from_env`](ruri_core::hub::Hub::from_env)) or a [`HubRepo`] with
    /// a revision and a [`Hub`](ruri_core::hub::Hub). A repository without
    /// `model.safetensors` (an ONNX-only port) is
    /// [`Error::RemoteFileNotFound`](ruri_core::Error::RemoteFileNotFound), listing its files.
    ///
    /// ```
    /// # let mock = ruri_testkit::hub_mock::MockHub::start(ruri_testkit::hub_mock::tiny_repos());
    /// # let cache = ruri_testkit::TempDir::new().unwrap();
    /// use ruri_core::hub::{Hub, HubRepo};
    ///
    /// // Here a loopback stand-in of the Hub (HF_ENDPOINT) and a fresh cache (HF_HUB_CACHE).
    /// let hub = Hub::from_env().endpoint(mock.endpoint()).cache_dir(cache.path());
    /// let embedder = ruri_native::builder()
    ///     .build_from_hub(HubRepo::new("ruri-test/tiny").revision("main").hub(hub))?;
    /// let query = embedder.embed_query("瑠璃色はどんな色？")?;
    /// assert_eq!(query.len(), embedder.dim());
    /// # Ok::<(), ruri_core::Error>(())
    /// ```
    pub fn build_from_hub(self, repo: impl Into<HubRepo>) -> Result<TextEmbedder> {
        let dir = repo.into().snapshot(|files| {
            let mut wanted = files.config_files()?;
            // The weights file the builder reads (ruri's int8 file with `prequantized`).
            wanted.push(files.require(self.weights_name())?);
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
}
