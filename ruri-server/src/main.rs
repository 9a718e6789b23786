//! `ruri-server`: Ruri v3 embeddings over HTTP. `ruri-server --help` lists every flag and its
//! environment variable; the library's docs (`ruri_server`) describe the routes.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match ruri_server::cli::run(ruri_server::cli::Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
