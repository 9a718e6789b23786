//! Finding and loading the ONNX Runtime shared library, once per process.
//!
//! `ort` is built with `load-dynamic`: nothing is downloaded or linked at build time. The
//! library is looked for, in order, at the builder's explicit path, `ORT_DYLIB_PATH`, ruri's
//! default folder ([`default_install_dir`], where the repository's
//! `tools/fetch-onnxruntime.sh` puts it), and finally the system's library search path.
//! A miss is a typed error that says how to get the library; `ort` itself would panic.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use ort::environment::Environment;
use ruri_core::{Error, Result};

/// The ONNX Runtime version `tools/fetch-onnxruntime.sh` installs and the tests use.
pub const ONNXRUNTIME_VERSION: &str = "1.31.1";

/// The oldest ONNX Runtime ruri runs. `ort`'s `api-22` feature accepts 1.22, but 1.22.0 aborts
/// the process (a failed assertion on an empty `OrtEpDevice` list) when `ort` creates a
/// session, so it is refused here with a typed error instead.
const MIN_VERSION: (u32, u32) = (1, 23);

/// File name of the library in the onnxruntime wheel.
fn library_file_name() -> String {
    format!(
        "{}onnxruntime{}.{ONNXRUNTIME_VERSION}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// ruri's default folder for the library (the repository's `tools/fetch-onnxruntime.sh`
/// fills it from the onnxruntime wheel; any copy of `libonnxruntime.so.<version>` works):
/// `$RURI_CACHE_DIR`, else `$XDG_CACHE_HOME/ruri`, else `~/.cache/ruri`, then
/// `onnxruntime-<version>/`.
pub fn default_install_dir() -> Option<PathBuf> {
    let base = if let Some(dir) = std::env::var_os("RURI_CACHE_DIR").filter(|d| !d.is_empty()) {
        PathBuf::from(dir)
    } else if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        PathBuf::from(dir).join("ruri")
    } else {
        PathBuf::from(std::env::var_os("HOME").filter(|d| !d.is_empty())?)
            .join(".cache")
            .join("ruri")
    };
    Some(base.join(format!("onnxruntime-{ONNXRUNTIME_VERSION}")))
}

const HELP: &str = "ruri needs the ONNX Runtime shared library, 1.23 or newer (tested: \
1.31.1). Any one of these works:
  1. The library inside the onnxruntime wheel from PyPI, unpacked where ruri looks by \
default (~/.cache/ruri/onnxruntime-1.31.1/, or $RURI_CACHE_DIR/onnxruntime-1.31.1/):
       pip download --no-deps --only-binary=:all: onnxruntime==1.31.1 -d /tmp/ort
       mkdir -p ~/.cache/ruri/onnxruntime-1.31.1
       unzip -j /tmp/ort/onnxruntime-1.31.1-*.whl 'onnxruntime/capi/libonnxruntime.so*' \
-d ~/.cache/ruri/onnxruntime-1.31.1/
  2. An installed onnxruntime Python package, named by ORT_DYLIB_PATH:
       export ORT_DYLIB_PATH=$(python3 -c 'import onnxruntime, glob, os; \
print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), \"capi\", \"libonnxruntime.so*\"))[0])')
  3. A system libonnxruntime.so (your distribution's package, or ONNX Runtime's release \
archive) on the loader's path (LD_LIBRARY_PATH), or ORT_DYLIB_PATH set to it.
  4. In code: the builder's runtime_path(path).";

/// Candidate library paths in search order, each with where it came from.
fn candidates(explicit: Option<&Path>) -> Vec<(PathBuf, &'static str)> {
    if let Some(path) = explicit {
        // An explicit choice is not silently replaced by another library.
        return vec![(path.to_path_buf(), "the builder's runtime_path")];
    }
    let mut found = Vec::new();
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return vec![(PathBuf::from(path), "ORT_DYLIB_PATH")];
    }
    if let Some(dir) = default_install_dir() {
        found.push((
            dir.join(library_file_name()),
            "ruri's default folder (~/.cache/ruri/onnxruntime-<version>/)",
        ));
    }
    // Bare name: the dynamic loader searches LD_LIBRARY_PATH and the system folders.
    found.push((
        PathBuf::from(format!(
            "{}onnxruntime{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        )),
        "the system library path",
    ));
    found
}

struct Loaded {
    environment: Environment,
    path: PathBuf,
}

static RUNTIME: Mutex<Option<Loaded>> = Mutex::new(None);

/// The process's ONNX Runtime environment, loading the library on first use.
///
/// ONNX Runtime allows one environment per process, so every embedder shares it; asking for a
/// different explicit library once one is loaded is an error rather than a silent mismatch.
pub(crate) fn environment(explicit: Option<&Path>) -> Result<Environment> {
    let mut runtime = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(loaded) = runtime.as_ref() {
        // Compare resolved paths: `./lib.so` and `/abs/lib.so` are the same library.
        let same = |w: &Path| std::fs::canonicalize(w).is_ok_and(|w| w == loaded.path);
        if let Some(wanted) = explicit.filter(|w| !same(w)) {
            return Err(Error::RuntimeUnavailable {
                runtime: "ONNX Runtime",
                reason: format!(
                    "{} was requested but {} is already loaded in this process (one per process)",
                    wanted.display(),
                    loaded.path.display()
                ),
                help: "Use the same runtime_path for every embedder in a process.".into(),
                source: None,
            });
        }
        return Ok(loaded.environment.clone());
    }

    let mut tried = Vec::new();
    let mut last_error: Option<Box<dyn std::error::Error + Send + Sync>> = None;
    for (path, origin) in candidates(explicit) {
        // A path that is plainly absent is skipped without asking the loader; a bare file name
        // is left to the loader's search.
        if path.components().count() > 1 && !path.exists() {
            tried.push(format!("{} ({origin}): no such file", path.display()));
            continue;
        }
        // ort asserts that the library hands out its API and would panic on a stub or broken
        // build; such a library is refused here first, like any other unusable one.
        if let Err(reason) = probe(&path) {
            tried.push(format!("{} ({origin}): {reason}", path.display()));
            continue;
        }
        match ort::init_from(&path) {
            Ok(builder) => {
                let environment =
                    builder
                        .with_name("ruri")
                        .build()
                        .map_err(|e| Error::RuntimeUnavailable {
                            runtime: "ONNX Runtime",
                            reason: format!(
                                "loaded {} but could not create its environment",
                                path.display()
                            ),
                            help: HELP.into(),
                            source: Some(Box::new(e)),
                        })?;
                *runtime = Some(Loaded {
                    environment: environment.clone(),
                    path: std::fs::canonicalize(&path).unwrap_or(path),
                });
                return Ok(environment);
            }
            Err(e) => {
                tried.push(format!("{} ({origin}): {e}", path.display()));
                last_error = Some(Box::new(e));
            }
        }
    }
    Err(Error::RuntimeUnavailable {
        runtime: "ONNX Runtime",
        reason: format!("no usable library; tried:\n  {}", tried.join("\n  ")),
        help: HELP.into(),
        source: last_error,
    })
}

/// Opens the library the way `ort` will (a relative path next to the executable if there is
/// such a file, else as given) and checks that `OrtGetApiBase()`, its version string and
/// `GetApi` for the API version `ort` needs are all non-NULL.
fn probe(path: &Path) -> std::result::Result<(), String> {
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join(path)))
            .filter(|p| p.exists())
            .unwrap_or_else(|| path.to_path_buf())
    };
    // SAFETY: loading a shared library runs its initializers. This is the library the caller
    // chose (or the one the search found), which `ort` loads next anyway.
    let library = unsafe { libloading::Library::new(&path) }.map_err(|e| e.to_string())?;
    // SAFETY: `OrtGetApiBase` has this signature in every ONNX Runtime release; a library that
    // exports the name with another signature is not ONNX Runtime and breaks any loader.
    let get_base = unsafe {
        library.get::<unsafe extern "system" fn() -> *const ort::sys::OrtApiBase>(b"OrtGetApiBase")
    }
    .map_err(|_| "does not export OrtGetApiBase: not ONNX Runtime".to_owned())?;
    // SAFETY: the pointers are checked for NULL before use; the base and the version string
    // are static data of the library, which stays loaded for this function.
    unsafe {
        let base = get_base();
        if base.is_null() {
            return Err("OrtGetApiBase() returned NULL: a stub or broken build".to_owned());
        }
        let version = ((*base).GetVersionString)();
        if version.is_null() {
            return Err("GetVersionString() returned NULL: a stub or broken build".to_owned());
        }
        let version = std::ffi::CStr::from_ptr(version)
            .to_string_lossy()
            .into_owned();
        let mut numbers = version.split('.').map(|n| n.parse::<u32>().ok());
        if let (Some(Some(major)), Some(Some(minor))) = (numbers.next(), numbers.next())
            && (major, minor) < MIN_VERSION
        {
            return Err(format!(
                "version {version} is too old: ruri needs {}.{} or newer",
                MIN_VERSION.0, MIN_VERSION.1
            ));
        }
        if ((*base).GetApi)(ort::sys::ORT_API_VERSION).is_null() {
            return Err(format!(
                "version {version:?} does not provide the C API version {} that ruri needs",
                ort::sys::ORT_API_VERSION
            ));
        }
    }
    Ok(())
}

/// The path the process's ONNX Runtime was loaded from, if it has been loaded.
pub fn loaded_runtime_path() -> Option<PathBuf> {
    RUNTIME
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .map(|l| l.path.clone())
}
