//! The server over real HTTP: its router on an ephemeral loopback port, around the committed
//! tiny model on ONNX Runtime fp32, called with a plain hyper client. Inference can be held at
//! a gate (a `ruri::Backend` wrapping the model's own), and loading too, so "not ready yet",
//! "requests wait in the queue and merge" and "queue full" are states the tests reach on
//! purpose, not by timing.
//!
//! Expected vectors come from the library called directly (the server must not change them)
//! and from the Python references (`testdata/reference/tiny.json`).
//!
//! One test binary (one link, one build of the helpers): `support` holds what the tests
//! share; `routes`, `tei`, `limits`, `queue`, `lifecycle` and `timers` the tests, by topic.

mod lifecycle;
mod limits;
mod queue;
mod routes;
mod support;
mod tei;
mod timers;
