//! `--junit FILE`: the run as JUnit XML, the format CI systems render (one
//! `<testcase>` per case, classname the case's area, e.g. `relay.url`).
//!
//! FAIL is a `<failure>`, SKIP a `<skipped>`; WARN is a `<failure
//! type="WARN">` with `--strict` and otherwise a passing case whose
//! `<system-out>` starts with `WARN:`, as INFO's starts with `INFO:`.

use crate::report::{summarize, CaseResult, Outcome};

/// Escapes text for an XML attribute or element; drops the characters XML 1.0 cannot hold.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// The JUnit XML report of a run.
pub fn xml(mode: &str, target: &str, results: &[CaseResult], strict: bool) -> String {
    let s = summarize(results);
    let failures = s.failed + if strict { s.warned } else { 0 };
    let secs: f64 = results.iter().map(|r| r.took.as_secs_f64()).sum();
    let suite = format!("worker-relay conformance ({mode} mode)");
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{}\" time=\"{secs:.3}\">\n",
        escape(&suite),
        results.len(),
        s.skipped
    ));
    x.push_str(&format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{}\" time=\"{secs:.3}\">\n",
        escape(&suite),
        results.len(),
        s.skipped
    ));
    x.push_str(&format!(
        "    <properties><property name=\"target\" value=\"{}\"/><property name=\"strict\" value=\"{strict}\"/></properties>\n",
        escape(target)
    ));
    for r in results {
        let class = r.id.rsplit_once('.').map_or(r.id, |(a, _)| a);
        x.push_str(&format!(
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\">\n",
            escape(class),
            escape(r.id),
            r.took.as_secs_f64()
        ));
        let text = escape(r.outcome.text());
        let section = escape(r.section);
        match &r.outcome {
            Outcome::Fail(_) => x.push_str(&format!(
                "      <failure type=\"FAIL\" message=\"{section}: {text}\">{text}</failure>\n"
            )),
            Outcome::Warn(_) if strict => x.push_str(&format!(
                "      <failure type=\"WARN\" message=\"{section}: {text}\">{text}</failure>\n"
            )),
            Outcome::Skip(_) => x.push_str(&format!("      <skipped message=\"{text}\"/>\n")),
            Outcome::Pass(_) | Outcome::Info(_) | Outcome::Warn(_) => {}
        }
        x.push_str(&format!(
            "      <system-out>{}: {section} {text}</system-out>\n",
            r.outcome.word()
        ));
        x.push_str("    </testcase>\n");
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn result(id: &'static str, outcome: Outcome) -> CaseResult {
        CaseResult {
            id,
            section: "§Frames",
            outcome,
            took: Duration::from_millis(1500),
        }
    }

    #[test]
    fn each_verdict_maps_to_its_element_and_text_is_escaped() {
        let rs = vec![
            result("relay.a.pass", Outcome::Pass("ok".into())),
            result("relay.a.fail", Outcome::Fail("got <b> & \"c\"\u{1}".into())),
            result("relay.b.skip", Outcome::Skip("no".into())),
            result("relay.b.warn", Outcome::Warn("policy".into())),
        ];
        let lax = xml("relay", "http://x", &rs, false);
        assert!(lax.contains("tests=\"4\" failures=\"1\" errors=\"0\" skipped=\"1\""));
        assert!(lax.contains("classname=\"relay.a\" name=\"relay.a.fail\" time=\"1.500\""));
        assert!(lax.contains("got &lt;b&gt; &amp; &quot;c&quot;\\u{1}"));
        assert!(lax.contains("<skipped message=\"no\"/>"));
        assert!(lax.contains("<system-out>WARN: §Frames policy</system-out>"));
        assert!(!lax.contains("type=\"WARN\""));
        let strict = xml("relay", "http://x", &rs, true);
        assert!(strict.contains("failures=\"2\""));
        assert!(strict.contains("<failure type=\"WARN\""));
        // Every element opened is closed.
        assert_eq!(
            strict.matches("<testcase ").count(),
            strict.matches("</testcase>").count()
        );
    }
}
