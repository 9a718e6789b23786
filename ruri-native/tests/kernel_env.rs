//! `RURI_KERNEL` chooses the int8 kernel when the builder names none; an unknown name is a
//! typed error naming the variable. One test in its own binary: it sets the process's
//! environment.

use ruri_core::Error;
use ruri_native::{Kernel, NativeBackend};
use ruri_testkit::tiny_model_dir;

fn kernel_with(value: &str) -> ruri_core::Result<Option<Kernel>> {
    // SAFETY: this binary's only test runs on one thread and starts no other before this;
    // nothing reads the environment concurrently.
    unsafe { std::env::set_var("RURI_KERNEL", value) };
    let dir = ruri_core::ModelDir::open(tiny_model_dir())?;
    NativeBackend::load(&dir, &ruri_native::builder().threads(1)).map(|b| b.kernel())
}

#[test]
fn ruri_kernel_picks_or_refuses() {
    for kernel in Kernel::available() {
        assert_eq!(kernel_with(kernel.name()).unwrap(), Some(kernel));
    }
    match kernel_with("sse9") {
        Err(Error::InvalidOption { name, value, .. }) => {
            assert_eq!((name, value.as_str()), ("RURI_KERNEL", "sse9"));
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
    // Empty means unset: the fastest kernel.
    assert_eq!(kernel_with("").unwrap(), Some(Kernel::detect()));
    // An explicit builder choice wins over the variable.
    // SAFETY: as above.
    unsafe { std::env::set_var("RURI_KERNEL", "sse9") };
    let dir = ruri_core::ModelDir::open(tiny_model_dir()).unwrap();
    let backend = NativeBackend::load(
        &dir,
        &ruri_native::builder().threads(1).kernel(Kernel::Scalar),
    )
    .unwrap();
    assert_eq!(backend.kernel(), Some(Kernel::Scalar));
}
