//! Runs the root package's parity test binary (`tests/parity.rs`, built with
//! `--features cuda`) on this device's cases and reads its figures back: the tests are the
//! ones CI runs on CPU, with the same tolerances, so nothing is restated here.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

/// One comparison the parity test printed (`{label} vs {against}: min cosine …`).
pub struct Check {
    pub label: String,
    pub against: String,
    pub min_cosine: Option<f64>,
    pub max_abs_diff: Option<f64>,
    pub min_cosine_without_outlier: Option<f64>,
}

impl Check {
    /// The case a label belongs to: `candle CUDA_BF16 batched (budget 2048), raw` →
    /// `candle CUDA_BF16`.
    pub fn case(&self) -> &str {
        [" alone", " batched", ","]
            .iter()
            .filter_map(|cut| self.label.find(cut))
            .min()
            .map_or(self.label.as_str(), |end| &self.label[..end])
    }
}

pub struct ParityRun {
    pub binary: PathBuf,
    pub filter: String,
    pub exit_code: Option<i32>,
    pub seconds: f64,
    /// (test name, `ok` / `FAILED` / `ignored`).
    pub tests: Vec<(String, String)>,
    pub checks: Vec<Check>,
    pub summary: Option<String>,
}

fn parse_figure(text: &str) -> Option<f64> {
    text.trim().parse().ok()
}

/// `{label} vs {against}: min cosine C, max |Δ| D, min cosine without the outlier O`.
fn parse_check(line: &str) -> Option<Check> {
    let (label, rest) = line.split_once(" vs ")?;
    let (against, figures) = rest.split_once(": min cosine ")?;
    let (cosine, rest) = figures.split_once(", max |Δ| ")?;
    let (max_abs, without) = match rest.split_once(", min cosine without the outlier ") {
        Some((max_abs, without)) => (max_abs, Some(without)),
        None => (rest, None),
    };
    Some(Check {
        label: label.trim().to_owned(),
        against: against.to_owned(),
        min_cosine: parse_figure(cosine),
        max_abs_diff: parse_figure(max_abs),
        min_cosine_without_outlier: without.and_then(parse_figure),
    })
}

/// `test cuda::cuda_bf16 ... ok`.
fn parse_test(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.rsplit_once(" ... ")?;
    Some((name.to_owned(), result.trim().to_owned()))
}

/// Runs `binary --test-threads=1 --nocapture filter`, writes what it printed to `log`.
pub fn run(binary: &Path, filter: &str, log: &Path) -> std::io::Result<ParityRun> {
    let started = Instant::now();
    let output = Command::new(binary)
        .args(["--test-threads=1", "--nocapture", filter])
        .output()?;
    let seconds = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    std::fs::write(
        log,
        format!(
            "$ {} --test-threads=1 --nocapture {filter}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            binary.display()
        ),
    )?;
    Ok(ParityRun {
        binary: binary.to_owned(),
        filter: filter.to_owned(),
        exit_code: output.status.code(),
        seconds,
        tests: stdout.lines().filter_map(parse_test).collect(),
        checks: stderr.lines().filter_map(parse_check).collect(),
        summary: stdout
            .lines()
            .find(|l| l.starts_with("test result:"))
            .map(str::to_owned),
    })
}

impl ParityRun {
    pub fn passed(&self) -> bool {
        self.exit_code == Some(0) && !self.tests.is_empty()
    }

    /// Per case: the worst figures over its checks, against each reference.
    pub fn worst_by_case(&self) -> Vec<(String, String, usize, Check)> {
        let mut rows: Vec<(String, String, usize, Check)> = Vec::new();
        for check in &self.checks {
            let key = (check.case().to_owned(), check.against.clone());
            let row = match rows.iter_mut().find(|r| (&r.0, &r.1) == (&key.0, &key.1)) {
                Some(row) => row,
                None => {
                    rows.push((
                        key.0,
                        key.1,
                        0,
                        Check {
                            label: String::new(),
                            against: check.against.clone(),
                            min_cosine: None,
                            max_abs_diff: None,
                            min_cosine_without_outlier: None,
                        },
                    ));
                    rows.last_mut().expect("just pushed")
                }
            };
            row.2 += 1;
            let worst = &mut row.3;
            worst.min_cosine = min_option(worst.min_cosine, check.min_cosine);
            worst.max_abs_diff = max_option(worst.max_abs_diff, check.max_abs_diff);
            worst.min_cosine_without_outlier = min_option(
                worst.min_cosine_without_outlier,
                check.min_cosine_without_outlier,
            );
        }
        rows
    }

    pub fn to_json(&self) -> Value {
        json!({
            "binary": self.binary.display().to_string(),
            "filter": self.filter,
            "exit_code": self.exit_code,
            "passed": self.passed(),
            "seconds": self.seconds,
            "summary": self.summary,
            "tests": self.tests.iter().map(|(name, result)| json!({"name": name, "result": result})).collect::<Vec<_>>(),
            "cases": self.worst_by_case().iter().map(|(case, against, checks, worst)| json!({
                "case": case,
                "against": against,
                "checks": checks,
                "min_cosine": worst.min_cosine,
                "max_abs_diff": worst.max_abs_diff,
                "min_cosine_without_outlier": worst.min_cosine_without_outlier,
            })).collect::<Vec<_>>(),
            "checks": self.checks.iter().map(|c| json!({
                "label": c.label,
                "against": c.against,
                "min_cosine": c.min_cosine,
                "max_abs_diff": c.max_abs_diff,
                "min_cosine_without_outlier": c.min_cosine_without_outlier,
            })).collect::<Vec<_>>(),
        })
    }
}

fn min_option(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn max_option(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_parity_lines() {
        let check = parse_check(
            "candle CUDA_BF16 batched (budget 2048), raw vs sentence-transformers fp32: \
             min cosine 0.999912345, max |Δ| 5.700e-3, min cosine without the outlier -",
        )
        .unwrap();
        assert_eq!(check.case(), "candle CUDA_BF16");
        assert_eq!(check.against, "sentence-transformers fp32");
        assert_eq!(check.min_cosine, Some(0.999912345));
        assert_eq!(check.max_abs_diff, Some(5.7e-3));
        assert_eq!(check.min_cosine_without_outlier, None);
        assert_eq!(
            parse_test("test cuda::cuda_bf16 ... ok"),
            Some(("cuda::cuda_bf16".into(), "ok".into()))
        );
    }
}
