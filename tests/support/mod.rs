//! Helpers shared by the root package's integration tests (each test file that needs them
//! declares `mod support;`).

use std::path::Path;

use ruri::hub::Hub;
use ruri_testkit::hub_mock::MockHub;

/// A Hub on `mock` with the cache `cache`, whatever the environment says.
pub fn hub(mock: &MockHub, cache: &Path) -> Hub {
    Hub::from_env()
        .endpoint(mock.endpoint())
        .cache_dir(cache)
        .no_token()
        .offline(false)
        .progress(false)
        .retries(2)
}
