//! `gateway policy test`: Rego unit tests run the way `opa test` runs them.
//!
//! Every rule named `test_*` in the loaded packages is a test. It passes
//! when it evaluates to `true`, fails when it is undefined or anything else,
//! and errors when evaluation fails (or panics). `with input as …` and
//! `with data.… as …` work as in OPA. Each file is parsed on its own, so a
//! file with a syntax error is reported (as an error) rather than skipped,
//! and the others still run.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use regorus::unstable::{Rule, RuleHead};
use serde::Serialize;

use super::PolicyError;
use super::loader::{FileKind, Sources, data_value};
use super::set::panic_message;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct TestResult {
    /// `data.<package>.<rule>`
    pub name: String,
    pub package: String,
    pub file: String,
    pub line: u32,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `print()` output of the test.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prints: Vec<String>,
    pub duration_ns: u128,
}

/// Coverage of one policy file (test files are not counted).
#[derive(Debug, Clone, Serialize)]
pub struct FileCoverage {
    pub file: String,
    pub covered: Vec<u32>,
    pub not_covered: Vec<u32>,
    pub percent: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub results: Vec<TestResult>,
    /// Files that could not be loaded, with the error (each counts as a failure).
    pub load_errors: Vec<LoadError>,
    pub passed: usize,
    pub failed: usize,
    pub errored: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadError {
    pub file: String,
    pub error: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Coverage {
    pub files: Vec<FileCoverage>,
    pub covered_lines: usize,
    pub total_lines: usize,
    pub percent: f64,
}

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Only tests whose full name matches.
    pub filter: Option<regex::Regex>,
    pub coverage: bool,
    /// Per-test time budget.
    pub budget: Option<Duration>,
}

impl Report {
    /// True when at least one test ran and nothing failed, errored or failed to load.
    pub fn success(&self) -> bool {
        self.passed > 0 && self.failed == 0 && self.errored == 0 && self.load_errors.is_empty()
    }

    /// Failures as counted in the summary line: failed + errored tests + files that did not load.
    pub fn failures(&self) -> usize {
        self.failed + self.errored + self.load_errors.len()
    }
}

/// A test file is `*_test.rego`; coverage counts only the other files.
fn is_test_file(path: &str) -> bool {
    path.ends_with("_test.rego")
}

/// Load `roots` and run every matching test.
pub fn run(roots: &[PathBuf], opts: &RunOptions) -> Result<Report, PolicyError> {
    let sources = Sources::read(roots)?;
    let mut engine = regorus::Engine::new();
    engine.set_strict_builtin_errors(true);
    engine.set_gather_prints(true);
    if let Some(budget) = opts.budget {
        engine.set_execution_timer_config(regorus::utils::limits::ExecutionTimerConfig {
            limit: budget,
            check_interval: std::num::NonZeroU32::MIN.saturating_add(63),
        });
    }
    let mut load_errors = Vec::new();
    for f in &sources.files {
        let loaded = match f.kind {
            FileKind::Rego => engine
                .add_policy(f.display.clone(), f.content.clone())
                .map(|_| ())
                .map_err(|e| e.to_string()),
            FileKind::Json | FileKind::Yaml => data_value(f)
                .map_err(|e| e.to_string())
                .and_then(|v| engine.add_data(v).map_err(|e| e.to_string())),
        };
        if let Err(error) = loaded {
            load_errors.push(LoadError {
                file: f.display.clone(),
                error,
            });
        }
    }
    if opts.coverage {
        engine.set_enable_coverage(true);
    }

    // Discover tests: rule names starting with test_, once per package.
    let mut tests: BTreeMap<String, (String, String, u32)> = BTreeMap::new();
    let mut order = Vec::new();
    for module in engine.get_modules().iter() {
        let package = format!("data.{}", module.package.refr.span().text());
        for rule in &module.policy {
            let Rule::Spec { head, span, .. } = rule.as_ref() else {
                continue;
            };
            let refr = match head {
                RuleHead::Compr { refr, .. } | RuleHead::Set { refr, .. } => refr,
                RuleHead::Func { .. } => continue,
            };
            let name = refr.span().text().to_string();
            if !name.starts_with("test_") || name.contains(['.', '[']) {
                continue;
            }
            let full = format!("{package}.{name}");
            if let std::collections::btree_map::Entry::Vacant(e) = tests.entry(full.clone()) {
                order.push(full);
                e.insert((package.clone(), span.source.file().clone(), span.line));
            }
        }
    }

    let mut results = Vec::new();
    for full in order {
        if let Some(filter) = &opts.filter
            && !filter.is_match(&full)
        {
            continue;
        }
        let Some((package, file, line)) = tests.get(&full).cloned() else {
            continue;
        };
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| engine.eval_rule(full.clone())));
        let duration_ns = started.elapsed().as_nanos();
        let prints = engine.take_prints().unwrap_or_default();
        let (outcome, error) = match outcome {
            Ok(Ok(regorus::Value::Bool(true))) => (Outcome::Pass, None),
            Ok(Ok(regorus::Value::Undefined)) => (Outcome::Fail, Some("undefined".to_string())),
            Ok(Ok(other)) => (
                Outcome::Fail,
                Some(format!("evaluated to {other}, not true")),
            ),
            Ok(Err(e)) => (Outcome::Error, Some(e.to_string())),
            Err(p) => (
                Outcome::Error,
                Some(format!("panic: {}", panic_message(&p))),
            ),
        };
        results.push(TestResult {
            name: full,
            package,
            file,
            line,
            outcome,
            error,
            prints,
            duration_ns,
        });
    }

    let coverage = if opts.coverage {
        let report = engine
            .get_coverage_report()
            .map_err(|e| PolicyError::Eval(e.to_string()))?;
        let mut files = Vec::new();
        let (mut covered_lines, mut total_lines) = (0, 0);
        for f in report.files.iter().filter(|f| !is_test_file(&f.path)) {
            let covered: Vec<u32> = f.covered.iter().copied().collect();
            let not_covered: Vec<u32> = f.not_covered.iter().copied().collect();
            let total = covered.len() + not_covered.len();
            covered_lines += covered.len();
            total_lines += total;
            files.push(FileCoverage {
                file: f.path.clone(),
                percent: percent(covered.len(), total),
                covered,
                not_covered,
            });
        }
        Some(Coverage {
            files,
            covered_lines,
            total_lines,
            percent: percent(covered_lines, total_lines),
        })
    } else {
        None
    };

    let count = |o| results.iter().filter(|r| r.outcome == o).count();
    Ok(Report {
        passed: count(Outcome::Pass),
        failed: count(Outcome::Fail),
        errored: count(Outcome::Error),
        results,
        load_errors,
        coverage,
    })
}

fn percent(covered: usize, total: usize) -> f64 {
    if total == 0 {
        100.0
    } else {
        (covered as f64) * 100.0 / (total as f64)
    }
}

/// The text report: one line per test, then the summary line `N passed, N failed`.
pub fn render_text(report: &Report, verbose: bool) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for e in &report.load_errors {
        let _ = writeln!(
            out,
            "{}: ERROR (file does not load)\n  {}",
            e.file,
            e.error.replace('\n', "\n  ")
        );
    }
    let mut file = "";
    for r in &report.results {
        if r.file != file {
            file = &r.file;
            let _ = writeln!(out, "{file}:");
        }
        let ms = r.duration_ns as f64 / 1e6;
        let label = match r.outcome {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Error => "ERROR",
        };
        let _ = writeln!(out, "{}: {label} ({ms:.2}ms)", r.name);
        if r.outcome != Outcome::Pass || verbose {
            if let Some(e) = &r.error {
                let _ = writeln!(out, "  {}", e.replace('\n', "\n  "));
            }
            for p in &r.prints {
                let _ = writeln!(out, "  print: {p}");
            }
        }
    }
    if let Some(c) = &report.coverage {
        let _ = writeln!(out, "{}", "-".repeat(80));
        let _ = writeln!(out, "coverage (policy files, test files excluded):");
        for f in &c.files {
            let total = f.covered.len() + f.not_covered.len();
            let _ = writeln!(
                out,
                "  {}: {:.1}% ({}/{} lines)",
                f.file,
                f.percent,
                f.covered.len(),
                total
            );
            if !f.not_covered.is_empty() {
                let lines: Vec<String> = f.not_covered.iter().map(u32::to_string).collect();
                let _ = writeln!(out, "    not covered: lines {}", lines.join(", "));
            }
        }
        let _ = writeln!(
            out,
            "  total: {:.1}% ({}/{} lines)",
            c.percent, c.covered_lines, c.total_lines
        );
    }
    let _ = writeln!(out, "{}", "-".repeat(80));
    if report.errored > 0 || !report.load_errors.is_empty() {
        let _ = writeln!(
            out,
            "({} errored, {} files failed to load; counted as failed)",
            report.errored,
            report.load_errors.len()
        );
    }
    if report.results.is_empty() {
        let _ = writeln!(out, "no tests found");
    }
    let _ = writeln!(
        out,
        "{} passed, {} failed",
        report.passed,
        report.failures()
    );
    out
}
