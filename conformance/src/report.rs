//! Results: one line per case, the summary, the JSON report.

use std::time::Duration;

/// What one case found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The implementation did what the protocol asks; the text is the figure measured.
    Pass(String),
    /// It did not; the text says what was seen instead.
    Fail(String),
    /// The case could not run here; the text says why.
    Skip(String),
    /// Observed, not judged (the protocol leaves the behaviour open).
    Info(String),
    /// Against one of this kit's recommendations (not a "must" of the spec):
    /// shown and counted, a failure only with `--strict`. The text names why.
    Warn(String),
}

impl Outcome {
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Pass(_) => "PASS",
            Outcome::Fail(_) => "FAIL",
            Outcome::Skip(_) => "SKIP",
            Outcome::Info(_) => "INFO",
            Outcome::Warn(_) => "WARN",
        }
    }

    pub fn text(&self) -> &str {
        match self {
            Outcome::Pass(t)
            | Outcome::Fail(t)
            | Outcome::Skip(t)
            | Outcome::Info(t)
            | Outcome::Warn(t) => t,
        }
    }

    pub fn is_fail(&self) -> bool {
        matches!(self, Outcome::Fail(_))
    }
}

/// `Pass` if `ok`, else `Warn` (a recommendation, not a rule of the spec),
/// with the same text.
pub fn recommend(ok: bool, text: impl Into<String>) -> Outcome {
    if ok {
        Outcome::Pass(text.into())
    } else {
        Outcome::Warn(text.into())
    }
}

/// `Pass` if `ok`, else `Fail`, with the same text.
pub fn judge(ok: bool, text: impl Into<String>) -> Outcome {
    if ok {
        Outcome::Pass(text.into())
    } else {
        Outcome::Fail(text.into())
    }
}

/// One case's line of the report.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub id: &'static str,
    pub section: &'static str,
    pub outcome: Outcome,
    pub took: Duration,
}

impl CaseResult {
    /// `PASS relay.handshake.subprotocol §Connecting selected strata-worker-connect.v1`
    pub fn line(&self) -> String {
        format!(
            "{} {} {} {}",
            self.outcome.word(),
            self.id,
            self.section,
            one_line(self.outcome.text())
        )
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// Counts of each outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub info: usize,
    pub warned: usize,
}

pub fn summarize(results: &[CaseResult]) -> Summary {
    let mut s = Summary::default();
    for r in results {
        match r.outcome {
            Outcome::Pass(_) => s.passed += 1,
            Outcome::Fail(_) => s.failed += 1,
            Outcome::Skip(_) => s.skipped += 1,
            Outcome::Info(_) => s.info += 1,
            Outcome::Warn(_) => s.warned += 1,
        }
    }
    s
}

impl Summary {
    pub fn line(&self) -> String {
        format!(
            "{} passed, {} failed, {} warned ({} skipped, {} info)",
            self.passed, self.failed, self.warned, self.skipped, self.info
        )
    }
}

/// The JSON report for CI.
pub fn json(mode: &str, target: &str, results: &[CaseResult]) -> serde_json::Value {
    let s = summarize(results);
    let cases: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            serde_json::json!({
                "id": r.id,
                "section": r.section,
                "result": r.outcome.word(),
                "detail": r.outcome.text(),
                "millis": r.took.as_millis() as u64,
            })
        })
        .collect();
    serde_json::json!({
        "tool": "worker-relay conformance",
        "spec": "Worker Relay Protocol (strata-worker-connect.v1)",
        "mode": mode,
        "target": target,
        "passed": s.passed,
        "failed": s.failed,
        "skipped": s.skipped,
        "info": s.info,
        "warned": s.warned,
        "cases": cases,
    })
}
