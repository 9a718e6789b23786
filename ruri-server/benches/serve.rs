//! The server over loopback, two ways.
//!
//! **What a request costs over the library** (the default): sequential keep-alive requests of
//! one short query against the release `ruri-server`, next to the library embedding the same
//! text in a process of its own. The machines are shared and noisy, so one run of each is not
//! a measurement: every round starts fresh processes (the library's and each server's), then
//! alternates them in blocks of `--block` calls until each has made `--requests`, so drift
//! within a round hits every side alike; the summary gives medians over the rounds with their
//! range.
//!
//! **Under load** (`--load N`): N keep-alive connections, each sending the query again as soon
//! as it has its answer, for `--seconds`; answers per second, errors, p50/p99 latency and the
//! server's peak resident memory (VmHWM), per round. `--slow M` adds M slowloris clients
//! beside them: each sends a request's headers one byte a second, and reconnects when the
//! server cuts it (at its header-read timeout); the cuts are counted.
//!
//! ```sh
//! cargo bench -p ruri-server --bench serve                        # tiny model, 5 rounds
//! cargo bench -p ruri-server --bench serve -- \
//!     --model testdata/generated/ruri-v3-30m-shape --precision int8
//! cargo bench -p ruri-server --bench serve -- --load 32 --seconds 20 --rounds 1
//! tools/bench/serve_overhead.sh; tools/bench/serve_load.sh       # both models
//! ```
//!
//! Flags: `--model DIR` (default: the tiny test model; relative to the workspace root),
//! `--precision fp32|int8`, `--threads N` (ONNX Runtime intra-op threads, the same for every
//! side), `--rounds N` (5), `--requests N` (500 timed per round and side, after `--warmup N`,
//! 50), `--block N` (50), `--text TEXT`, `--prompt-name NAME` (`query`), `--server-bin PATH`
//! (repeatable: other server builds measured in the same rounds, e.g. an older one; default:
//! this build's `ruri-server`), `--load N`, `--slow M` (0) and `--seconds S` (20).
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it makes one short round on the
//! tiny model, to show it still works.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ruri::{EmbedOptions, Task};

/// A query of about twenty tokens (22 on the 30m model's tokenizer with the query prompt).
const TEXT: &str = "瑠璃色の石は古くから装飾品に使われてきましたが、その名前の由来は何ですか？";

#[derive(Debug, Clone)]
struct Options {
    model: PathBuf,
    precision: String,
    threads: Option<usize>,
    rounds: usize,
    requests: usize,
    warmup: usize,
    block: usize,
    text: String,
    prompt_name: String,
    servers: Vec<PathBuf>,
    load: Option<usize>,
    slow: usize,
    seconds: u64,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let bench = args.iter().any(|a| a == "--bench");
        let mut options = Options {
            model: ruri_testkit::tiny_model_dir(),
            precision: "fp32".into(),
            threads: None,
            rounds: if bench { 5 } else { 1 },
            requests: if bench { 500 } else { 20 },
            warmup: if bench { 50 } else { 5 },
            block: if bench { 50 } else { 10 },
            text: TEXT.into(),
            prompt_name: "query".into(),
            servers: Vec::new(),
            load: None,
            slow: 0,
            seconds: 20,
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
            match flag.as_str() {
                "--bench" | "--library" => {}
                // cargo runs benches in the package's folder: take relative paths from the
                // workspace root, where the command was most likely typed.
                "--model" => options.model = ruri_testkit::repo_root().join(value()?),
                "--precision" => options.precision = value()?,
                "--threads" => options.threads = Some(number(value()?)?),
                "--rounds" => options.rounds = number(value()?)?.max(1),
                "--requests" => options.requests = number(value()?)?.max(1),
                "--warmup" => options.warmup = number(value()?)?,
                "--block" => options.block = number(value()?)?.max(1),
                "--text" => options.text = value()?,
                "--prompt-name" => options.prompt_name = value()?,
                "--server-bin" => options
                    .servers
                    .push(ruri_testkit::repo_root().join(value()?)),
                "--load" => options.load = Some(number(value()?)?.max(1)),
                "--slow" => options.slow = number(value()?)?,
                "--seconds" => options.seconds = number(value()?)?.max(1) as u64,
                other if other.starts_with("--") => return Err(format!("unknown flag {other}")),
                // cargo bench passes a filter; there is one benchmark.
                _ => {}
            }
        }
        if options.servers.is_empty() {
            options
                .servers
                .push(env!("CARGO_BIN_EXE_ruri-server").into());
        }
        Ok(options)
    }

    /// The flags a child process (library or server) needs to load the same model.
    fn model_flags(&self) -> Vec<String> {
        let mut flags = vec![
            "--model".into(),
            self.model.display().to_string(),
            "--precision".into(),
            self.precision.clone(),
        ];
        if let Some(threads) = self.threads {
            flags.extend(["--threads".into(), threads.to_string()]);
        }
        flags
    }
}

/// Latencies of one side in one round, in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Round {
    p50: f64,
    p99: f64,
}

impl Round {
    fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let at = |q: f64| {
            let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            samples[rank - 1].as_secs_f64() * 1e3
        };
        Round {
            p50: at(0.50),
            p99: at(0.99),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("error: {message}");
            std::process::exit(2);
        }
    };
    if args.iter().any(|a| a == "--library") {
        library_child(&options);
        return;
    }
    if !options.model.join("config.json").is_file() {
        println!(
            "serve bench: no model at {} (tools/testdata/generate.sh makes the test models); nothing measured",
            options.model.display()
        );
        return;
    }
    let result = match options.load {
        Some(connections) => load(&options, connections),
        None => drive(&options),
    };
    if let Err(message) = result {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

/// One side of a round: the library's process or a server's.
trait Side {
    /// `n` timed calls (library) or requests (server).
    fn block(&mut self, n: usize) -> Result<Vec<Duration>, String>;
}

/// Runs the rounds and prints every round and the medians.
fn drive(options: &Options) -> Result<(), String> {
    let labels: Vec<String> = options
        .servers
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let name = path.file_name().map_or_else(
                || format!("server{i}"),
                |n| n.to_string_lossy().into_owned(),
            );
            if options.servers.len() > 1 {
                format!("{name}#{}", i + 1)
            } else {
                name
            }
        })
        .collect();
    println!(
        "model {} ({}, {} threads), text {:?} with prompt {:?}; {} rounds × {} sequential \
         keep-alive requests per side (after {} warm-up), alternating in blocks of {}",
        options.model.display(),
        options.precision,
        options
            .threads
            .map_or_else(|| "default".to_owned(), |t| t.to_string()),
        options.text,
        options.prompt_name,
        options.rounds,
        options.requests,
        options.warmup,
        options.block
    );
    let sides = 1 + options.servers.len();
    let mut rounds: Vec<Vec<Round>> = vec![Vec::new(); sides];
    let mut health: Vec<Vec<Round>> = vec![Vec::new(); options.servers.len()];
    let mut tokens = 0;
    for round in 0..options.rounds {
        // Fresh processes every round.
        let library = LibraryProcess::start(options)?;
        tokens = library.tokens;
        let mut servers = options
            .servers
            .iter()
            .map(|binary| ServerProcess::start(options, binary))
            .collect::<Result<Vec<_>, _>>()?;
        let mut library = library;
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); sides];
        let blocks = options.requests.div_ceil(options.block);
        for b in 0..blocks {
            let n = options.block.min(options.requests - b * options.block);
            // Rotate which side goes first from block to block.
            for k in 0..sides {
                let side = (b + round + k) % sides;
                let got = if side == 0 {
                    library.block(n)?
                } else {
                    servers[side - 1].block(n)?
                };
                samples[side].extend(got);
            }
        }
        for (i, server) in servers.iter_mut().enumerate() {
            health[i].push(Round::of(server.health(options.requests)?));
        }
        drop(servers);
        drop(library);
        let this: Vec<Round> = samples.into_iter().map(Round::of).collect();
        let lib = this[0];
        let mut line = format!(
            "round {}: library p50 {:.3} p99 {:.3}",
            round + 1,
            lib.p50,
            lib.p99
        );
        for (i, server) in this[1..].iter().enumerate() {
            line += &format!(
                " | {} p50 {:.3} p99 {:.3} (+{:.3})",
                labels[i],
                server.p50,
                server.p99,
                server.p50 - lib.p50
            );
        }
        println!("{line} ms");
        for (side, round) in this.into_iter().enumerate() {
            rounds[side].push(round);
        }
    }
    println!(
        "medians over {} rounds [min–max], ms ({tokens} tokens with the prompt):",
        options.rounds
    );
    let p50s = |rounds: &[Round]| rounds.iter().map(|r| r.p50).collect::<Vec<_>>();
    let p99s = |rounds: &[Round]| rounds.iter().map(|r| r.p99).collect::<Vec<_>>();
    println!(
        "  {:<28} p50 {}   p99 {}",
        "library",
        spread(&p50s(&rounds[0])),
        spread(&p99s(&rounds[0]))
    );
    for (i, label) in labels.iter().enumerate() {
        let server = &rounds[i + 1];
        let overhead: Vec<f64> = server
            .iter()
            .zip(&rounds[0])
            .map(|(s, l)| s.p50 - l.p50)
            .collect();
        println!(
            "  {:<28} p50 {}   p99 {}   server − library p50 {}",
            label,
            spread(&p50s(server)),
            spread(&p99s(server)),
            spread(&overhead)
        );
        println!(
            "  {:<28} p50 {}",
            format!("{label} GET /health"),
            spread(&p50s(&health[i]))
        );
    }
    Ok(())
}

/// `connections` clients at once against each server, `--rounds` times, each in a fresh
/// server process.
fn load(options: &Options, connections: usize) -> Result<(), String> {
    println!(
        "model {} ({}, {} threads), text {:?} with prompt {:?}; {connections} keep-alive \
         connections and {} slow clients for {} s, {} rounds",
        options.model.display(),
        options.precision,
        options
            .threads
            .map_or_else(|| "default".to_owned(), |t| t.to_string()),
        options.text,
        options.prompt_name,
        options.slow,
        options.seconds,
        options.rounds
    );
    for round in 0..options.rounds {
        for binary in &options.servers {
            let mut server = ServerProcess::start(options, binary)?;
            let addr = server
                .client
                .stream
                .peer_addr()
                .map_err(|e| e.to_string())?;
            let pid = server.process.0.id();
            let deadline = Instant::now() + Duration::from_secs(options.seconds);
            let started = Instant::now();
            let clients: Vec<_> = (0..connections)
                .map(|_| {
                    let body = server.body.clone();
                    std::thread::spawn(move || load_client(addr, &body, deadline))
                })
                .collect();
            let slow: Vec<_> = (0..options.slow)
                .map(|_| std::thread::spawn(move || slow_client(addr, deadline)))
                .collect();
            let mut samples = Vec::new();
            let mut errors = 0;
            for client in clients {
                let (latencies, failed) = client.join().map_err(|_| "a client panicked")?;
                samples.extend(latencies);
                errors += failed;
            }
            let mut cuts = 0;
            for client in slow {
                cuts += client.join().map_err(|_| "a slow client panicked")?;
            }
            let elapsed = started.elapsed().as_secs_f64();
            let peak = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|status| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix("VmHWM:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                })
                .map_or_else(|| "?".to_owned(), |kb| format!("{:.0}", kb / 1024.0));
            let answered = samples.len();
            let merging = server.merging()?;
            let latency = Round::of(if samples.is_empty() {
                vec![Duration::ZERO]
            } else {
                samples
            });
            println!(
                "round {}: {}: {answered} answers in {elapsed:.1} s = {:.0} req/s, {errors} errors, \
                 p50 {:.1} ms, p99 {:.1} ms, peak RSS {peak} MB; {merging}; slow clients \
                 cut {cuts} times",
                round + 1,
                binary.file_name().map_or_else(
                    || binary.display().to_string(),
                    |n| n.to_string_lossy().into_owned()
                ),
                answered as f64 / elapsed,
                latency.p50,
                latency.p99
            );
        }
    }
    Ok(())
}

/// One connection's requests until `deadline`: the latencies of the 200s, and how many
/// requests failed (another status, or a broken connection, after which it reconnects).
fn load_client(addr: SocketAddr, body: &[u8], deadline: Instant) -> (Vec<Duration>, usize) {
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut client = None;
    while Instant::now() < deadline {
        let connection = match client.as_mut() {
            Some(connection) => connection,
            None => match Client::connect(addr) {
                Ok(connection) => client.insert(connection),
                Err(_) => {
                    errors += 1;
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        let started = Instant::now();
        match connection.post("/v1/embeddings", body) {
            Ok((200, _)) => latencies.push(started.elapsed()),
            Ok(_) => errors += 1,
            Err(_) => {
                errors += 1;
                client = None;
            }
        }
    }
    (latencies, errors)
}

/// A slowloris client until `deadline`: a request's headers one byte a second, reconnecting
/// whenever the server closes the connection; returns how many times it was cut.
fn slow_client(addr: SocketAddr, deadline: Instant) -> usize {
    let head = b"POST /v1/embeddings HTTP/1.1\r\nhost: ruri\r\ncontent-type: application/json\r\n";
    let mut cuts = 0;
    while Instant::now() < deadline {
        let Ok(mut stream) = TcpStream::connect(addr) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut bytes = head.iter().copied().chain(std::iter::repeat(b'a'));
        let mut buf = [0u8; 512];
        while Instant::now() < deadline {
            let byte = [bytes.next().expect("endless")];
            if stream.write_all(&byte).is_err() {
                cuts += 1;
                break;
            }
            // The one-second read timeout paces the bytes; 0 bytes read is the server's close.
            match stream.read(&mut buf) {
                Ok(0) => {
                    cuts += 1;
                    break;
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => {
                    cuts += 1;
                    break;
                }
            }
        }
    }
    cuts
}

/// `median [min–max]` with three decimals.
fn spread(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    format!("{median:.3} [{:.3}–{:.3}]", sorted[0], sorted[n - 1])
}

/// A child process, killed when this goes out of scope, however the round ends.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This program again, as `--library`: a fresh process that loads the model, warms up, and
/// then times a block of calls each time it reads the block's size on its stdin.
struct LibraryProcess {
    _process: Process,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    tokens: usize,
}

impl LibraryProcess {
    fn start(options: &Options) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
        let mut child = Command::new(exe)
            .arg("--library")
            .args(options.model_flags())
            .args(["--warmup", &options.warmup.to_string()])
            .args(["--text", &options.text])
            .args(["--prompt-name", &options.prompt_name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the library child: {e}"))?;
        let stdin = child.stdin.take().expect("piped above");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped above"));
        let child = Process(child);
        // `ready tokens N`
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .map_err(|e| format!("reading the library child: {e}"))?;
        let tokens = line
            .strip_prefix("ready tokens ")
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| format!("the library child said {line:?}"))?;
        Ok(LibraryProcess {
            _process: child,
            stdin,
            stdout,
            tokens,
        })
    }
}

impl Side for LibraryProcess {
    fn block(&mut self, n: usize) -> Result<Vec<Duration>, String> {
        writeln!(self.stdin, "{n}").map_err(|e| format!("writing to the library child: {e}"))?;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("reading the library child: {e}"))?;
        let samples: Vec<Duration> = line
            .split_whitespace()
            .map(|ns| ns.parse().map(Duration::from_nanos))
            .collect::<Result<_, _>>()
            .map_err(|_| format!("the library child said {line:?}"))?;
        if samples.len() != n {
            return Err(format!("the library child said {line:?}"));
        }
        Ok(samples)
    }
}

/// The `--library` process: the same model through the library, in blocks asked on stdin;
/// each block's latencies go to stdout in nanoseconds, one line per block.
fn library_child(options: &Options) {
    let mut builder = ruri::ort::builder().precision(match options.precision.as_str() {
        "int8" => ruri::ort::Precision::Int8,
        "fp16" => ruri::ort::Precision::Fp16,
        _ => ruri::ort::Precision::Fp32,
    });
    if let Some(threads) = options.threads {
        builder = builder.intra_threads(threads);
    }
    let embedder = builder
        .build_from_dir(&options.model)
        .unwrap_or_else(|e| panic!("loading {}: {e}", options.model.display()));
    let task = if options.prompt_name.is_empty() {
        Task::None
    } else {
        Task::Named(options.prompt_name.clone())
    };
    let embed_options = EmbedOptions::new(task);
    let texts = [options.text.as_str()];
    let tokens = embedder
        .tokenize(&texts, &embed_options)
        .expect("tokenizing")[0]
        .len();
    for _ in 0..options.warmup {
        embedder
            .embed_with(&texts, &embed_options)
            .expect("embedding");
    }
    println!("ready tokens {tokens}");
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let Ok(n) = line.trim().parse::<usize>() else {
            return;
        };
        let samples: Vec<String> = (0..n)
            .map(|_| {
                let started = Instant::now();
                let vectors = embedder
                    .embed_with(&texts, &embed_options)
                    .expect("embedding");
                let elapsed = started.elapsed();
                std::hint::black_box(vectors);
                elapsed.as_nanos().to_string()
            })
            .collect();
        println!("{}", samples.join(" "));
    }
}

/// A fresh server process, ready and warmed up, with one keep-alive connection to it.
struct ServerProcess {
    process: Process,
    client: Client,
    body: Vec<u8>,
}

impl ServerProcess {
    fn start(options: &Options, binary: &PathBuf) -> Result<Self, String> {
        let mut child = Command::new(binary)
            .args(["--addr", "127.0.0.1:0"])
            // The library side runs ruri-ort; the server's default backend is the native
            // engine since issue 21, so name ort to time the same model on both sides.
            .args(["--backend", "ort"])
            .args(options.model_flags())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let stderr = child.stderr.take().expect("piped above");
        let process = Process(child);
        // Read stderr all along (a full pipe would block the server's logging); the address
        // comes from its first line.
        let (addresses, address) = mpsc::channel();
        std::thread::spawn(move || {
            let mut addresses = Some(addresses);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split(';').next().unwrap_or_default().trim().to_owned();
                    if let Some(sender) = addresses.take() {
                        let _ = sender.send(addr);
                    }
                } else if line.starts_with("error") {
                    eprintln!("server: {line}");
                }
            }
        });
        let addr: SocketAddr = address
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| format!("{} did not say where it listens", binary.display()))?
            .parse()
            .map_err(|e| format!("the server's address: {e}"))?;
        let mut server = ServerProcess {
            process,
            client: Client::connect(addr)?,
            body: serde_json::to_vec(&serde_json::json!({
                "input": options.text,
                "prompt_name": options.prompt_name,
            }))
            .expect("serializing a JSON value cannot fail"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while server.client.get("/ready")?.0 != 200 {
            if Instant::now() > deadline {
                return Err(format!("{} was not ready within 120 s", binary.display()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let (status, answer) = server.client.post("/v1/embeddings", &server.body)?;
        let answer: serde_json::Value = serde_json::from_slice(&answer)
            .map_err(|e| format!("the server's answer is not JSON: {e}"))?;
        if status != 200 || !answer["data"][0]["embedding"].is_array() {
            return Err(format!("the server answered {status}: {answer}"));
        }
        for _ in 0..options.warmup {
            server.client.post("/v1/embeddings", &server.body)?;
        }
        Ok(server)
    }

    /// How the model thread merged requests, from `/metrics`: backend calls, requests per
    /// call, time per call.
    fn merging(&mut self) -> Result<String, String> {
        // A connection of its own: the control connection may have sat idle past the
        // server's header-read timeout, which closes idle keep-alive connections.
        let addr = self.client.stream.peer_addr().map_err(|e| e.to_string())?;
        let (_, text) = Client::connect(addr)?.get("/metrics")?;
        let text = String::from_utf8_lossy(&text);
        let value = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        let calls = value("ruri_batch_requests_count");
        Ok(format!(
            "{calls:.0} backend calls, {:.1} requests and {:.1} ms each",
            value("ruri_batch_requests_sum") / calls,
            value("ruri_inference_duration_seconds_sum")
                / value("ruri_inference_duration_seconds_count")
                * 1e3
        ))
    }

    /// `n` timed `GET /health`: what HTTP alone costs.
    fn health(&mut self, n: usize) -> Result<Vec<Duration>, String> {
        (0..n)
            .map(|_| {
                let started = Instant::now();
                self.client.get("/health")?;
                Ok(started.elapsed())
            })
            .collect()
    }
}

impl Side for ServerProcess {
    fn block(&mut self, n: usize) -> Result<Vec<Duration>, String> {
        (0..n)
            .map(|_| {
                let started = Instant::now();
                let (status, _) = self.client.post("/v1/embeddings", &self.body)?;
                let elapsed = started.elapsed();
                if status != 200 {
                    return Err(format!("the server answered {status}"));
                }
                Ok(elapsed)
            })
            .collect()
    }
}

/// HTTP/1.1 on one keep-alive connection, as little as can be: the client's own cost must
/// not blur the server's.
struct Client {
    stream: TcpStream,
    host: String,
    buffer: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Result<Self, String> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| format!("read timeout: {e}"))?;
        Ok(Client {
            stream,
            host: addr.to_string(),
            buffer: Vec::with_capacity(64 * 1024),
        })
    }

    fn get(&mut self, path: &str) -> Result<(u16, Vec<u8>), String> {
        let head = format!("GET {path} HTTP/1.1\r\nhost: {}\r\n\r\n", self.host);
        self.exchange(head.as_bytes(), &[])
    }

    fn post(&mut self, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.exchange(head.as_bytes(), body)
    }

    /// Sends one request in one write and reads its answer (status line, headers, a body of
    /// `content-length` bytes).
    fn exchange(&mut self, head: &[u8], body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let request = [head, body].concat();
        self.stream
            .write_all(&request)
            .map_err(|e| format!("sending: {e}"))?;
        self.buffer.clear();
        let mut chunk = [0u8; 16 * 1024];
        let header_end = loop {
            if let Some(at) = find(&self.buffer, b"\r\n\r\n") {
                break at + 4;
            }
            self.read_some(&mut chunk)?;
        };
        let head = String::from_utf8_lossy(&self.buffer[..header_end]).to_ascii_lowercase();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status in {head:?}"))?;
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("no content-length in {head:?}"))?;
        while self.buffer.len() < header_end + length {
            self.read_some(&mut chunk)?;
        }
        Ok((
            status,
            self.buffer[header_end..header_end + length].to_vec(),
        ))
    }

    fn read_some(&mut self, chunk: &mut [u8]) -> Result<(), String> {
        match self.stream.read(chunk) {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) => Err(format!("reading: {e}")),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
