//! The mock Hub of `ruri_testkit::hub_mock`, standalone: serves `testdata/tiny` under the
//! mock's ids until interrupted, for trying `--model ORG/NAME` by hand:
//!
//! ```sh
//! cargo run -p ruri-testkit --bin hub-mock -- --port 8765 &
//! echo 瑠璃 | HF_ENDPOINT=http://127.0.0.1:8765 tools/embed.sh --model ruri-test/tiny
//! ```

use ruri_testkit::hub_mock::{self, MockHub};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut port = 0u16;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => {
                port = args
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| usage("--port needs a number"));
            }
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let hub = MockHub::start_on(hub_mock::tiny_repos(), port);
    println!("mock Hub at {}", hub.endpoint());
    println!(
        "ids: {} (main, tag v1), {}, {} (gated), {} (private); token with access: {}",
        hub_mock::TINY_REPO,
        hub_mock::TINY_MIRROR_REPO,
        hub_mock::GATED_REPO,
        hub_mock::PRIVATE_REPO,
        hub_mock::GOOD_TOKEN
    );
    loop {
        std::thread::park();
    }
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("error: {problem}");
    }
    eprintln!("usage: hub-mock [--port N]");
    std::process::exit(if problem.is_empty() { 0 } else { 2 });
}
