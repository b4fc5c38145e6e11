//! The case table, the `--case` filter and the loop that runs the cases,
//! each bounded by a timeout.

use crate::report::{CaseResult, Outcome};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// A case's body: borrows the mode's context for its run.
pub type CaseFn<C> = for<'a> fn(&'a mut C) -> Pin<Box<dyn Future<Output = Outcome> + 'a>>;

/// Which worker app a case needs (worker mode; relay-mode cases need none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Any worker: only `GET /health` is asked.
    Any,
    /// The crate's example worker (`/echo`, `/sleep`, `/fail-after`, `/slow-sink` …).
    Example,
    /// The example, or Strata's executor protocol (`/v1/execute`).
    ExampleOrStrata,
}

/// What a case is and how it runs.
pub struct Case<C> {
    pub id: &'static str,
    /// The section of the spec (worker-relay-protocol.md) the case checks.
    pub section: &'static str,
    /// What the case checks, for `--list`.
    pub what: &'static str,
    pub needs: Needs,
    /// Takes tens of seconds: runs with `--long`, or when `--case` names it exactly.
    pub long: bool,
    /// Leaves the peer refused for good (a worker exits): runs last, at most one per run.
    pub terminal: bool,
    pub run: CaseFn<C>,
}

/// Declares a case: `case!(Ctx, id, section, needs, long, terminal, what, fn_name)`.
#[macro_export]
macro_rules! case {
    ($ctx:ty, $id:expr, $section:expr, $needs:expr, long = $long:expr, terminal = $term:expr, $what:expr, $f:path) => {{
        fn run<'a>(
            c: &'a mut $ctx,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = $crate::report::Outcome> + 'a>>
        {
            Box::pin($f(c))
        }
        $crate::runner::Case::<$ctx> {
            id: $id,
            section: $section,
            what: $what,
            needs: $needs,
            long: $long,
            terminal: $term,
            run,
        }
    }};
}

/// `--case PATTERN`: `*` matches any run of characters; a pattern without
/// `*` matches the ids that contain it.
pub fn matches(pattern: &str, id: &str) -> bool {
    if !pattern.contains('*') {
        return id.contains(pattern);
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = id;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    rest.is_empty()
}

/// How the run was asked for.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub pattern: Option<String>,
    pub long: bool,
}

impl Selection {
    pub fn selects<C>(&self, case: &Case<C>) -> bool {
        self.pattern.as_deref().is_none_or(|p| matches(p, case.id))
    }

    fn long_enabled<C>(&self, case: &Case<C>) -> bool {
        self.long || self.pattern.as_deref() == Some(case.id)
    }
}

/// What the mode's context must answer for the runner.
pub trait Context {
    /// Why a case needing `needs` cannot run against this peer, if it cannot.
    fn unmet(&self, needs: Needs) -> Option<String>;
    /// Called before each case (drains what a previous case left behind).
    fn before_case(&mut self) -> impl Future<Output = ()>;
    /// What the peer sent during the case that breaks the protocol whatever
    /// the case is about (a bad id, malformed JSON, an oversized message …),
    /// one line each; taking them clears them. A case that otherwise passed
    /// fails for them.
    fn take_violations(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// A fresh peer for a terminal case after another terminal case (the
    /// kit restarts the worker it started with `--exec`); `Err` says why
    /// it cannot.
    async fn fresh_peer(&mut self) -> Result<(), String> {
        Err("the kit cannot start a fresh peer".into())
    }
}

pub const CASE_LIMIT: Duration = Duration::from_secs(60);
pub const LONG_CASE_LIMIT: Duration = Duration::from_secs(150);

/// Runs the selected cases in order, calling `each` with every result as it comes.
pub async fn run<C: Context>(
    cases: &[Case<C>],
    ctx: &mut C,
    sel: &Selection,
    mut each: impl FnMut(&CaseResult),
) -> Vec<CaseResult> {
    let mut results = Vec::new();
    let mut ended_by: Option<&'static str> = None;
    for case in cases.iter().filter(|c| sel.selects(c)) {
        let start = Instant::now();
        let outcome = if let Some(why) = ctx.unmet(case.needs) {
            Outcome::Skip(why)
        } else if case.long && !sel.long_enabled(case) {
            Outcome::Skip("long case: run with --long or --case <this id>".into())
        } else if let Some(why) = match (case.terminal, ended_by) {
            (true, Some(prev)) => ctx.fresh_peer().await.err().map(|e| (prev, e)),
            _ => None,
        } {
            let (prev, e) = why;
            Outcome::Skip(format!(
                "{prev} already refused the peer for good and {e}; run this case alone (--case {}) against a fresh peer, or give --exec",
                case.id
            ))
        } else {
            // Getting ready is bounded too (a peer that never goes quiet).
            let _ = tokio::time::timeout(CASE_LIMIT, ctx.before_case()).await;
            // What a previous case's leftovers did is not this case's fault.
            let _ = ctx.take_violations();
            let limit = if case.long {
                LONG_CASE_LIMIT
            } else {
                CASE_LIMIT
            };
            let out = match tokio::time::timeout(limit, (case.run)(ctx)).await {
                Ok(o) => o,
                Err(_) => Outcome::Fail(format!("the case timed out after {} s", limit.as_secs())),
            };
            if case.terminal {
                ended_by = Some(case.id);
            }
            with_violations(out, ctx.take_violations())
        };
        let r = CaseResult {
            id: case.id,
            section: case.section,
            outcome,
            took: start.elapsed(),
        };
        each(&r);
        results.push(r);
    }
    results
}

/// A case's outcome with the protocol violations seen during it: any turns
/// a pass (or a warning, or a note) into a failure naming them.
pub fn with_violations(out: Outcome, seen: Vec<String>) -> Outcome {
    if seen.is_empty() {
        return out;
    }
    let seen = seen.join("; ");
    match out {
        Outcome::Fail(t) => Outcome::Fail(format!("{t}; also: {seen}")),
        Outcome::Skip(t) => Outcome::Skip(t),
        Outcome::Pass(t) | Outcome::Warn(t) | Outcome::Info(t) => {
            Outcome::Fail(format!("{seen} (the case itself: {t})"))
        }
    }
}

/// `--list`: one line per case.
pub fn list<C>(cases: &[Case<C>], sel: &Selection) -> Vec<String> {
    cases
        .iter()
        .filter(|c| sel.selects(c))
        .map(|c| {
            let mut tags = Vec::new();
            if c.long {
                tags.push("long");
            }
            if c.terminal {
                tags.push("terminal");
            }
            match c.needs {
                Needs::Any => {}
                Needs::Example => tags.push("app=example"),
                Needs::ExampleOrStrata => tags.push("app=example|strata"),
            }
            let tags = if tags.is_empty() {
                String::new()
            } else {
                format!(" [{}]", tags.join(", "))
            };
            format!("{} {} {}{}", c.id, c.section, c.what, tags)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{matches, with_violations};
    use crate::report::Outcome;

    #[test]
    fn violations_turn_a_pass_a_warning_or_a_note_into_a_failure() {
        let seen = || vec!["answered on id 0".to_string()];
        for out in [
            Outcome::Pass("ok".into()),
            Outcome::Warn("policy".into()),
            Outcome::Info("seen".into()),
        ] {
            let got = with_violations(out, seen());
            assert!(
                matches!(&got, Outcome::Fail(t) if t.starts_with("answered on id 0")),
                "{got:?}"
            );
        }
        assert_eq!(
            with_violations(Outcome::Fail("bad".into()), seen()),
            Outcome::Fail("bad; also: answered on id 0".into())
        );
        assert_eq!(
            with_violations(Outcome::Skip("n/a".into()), seen()),
            Outcome::Skip("n/a".into())
        );
        assert_eq!(
            with_violations(Outcome::Pass("ok".into()), Vec::new()),
            Outcome::Pass("ok".into())
        );
    }

    #[test]
    fn patterns() {
        assert!(matches("url", "relay.url.prefix"));
        assert!(matches("relay.*", "relay.url.prefix"));
        assert!(matches("*.prefix", "relay.url.prefix"));
        assert!(matches("relay.*.prefix", "relay.url.prefix"));
        assert!(!matches("worker.*", "relay.url.prefix"));
        assert!(!matches("relay.*.x", "relay.url.prefix"));
    }
}
