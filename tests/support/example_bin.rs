//! The example binaries of this very build, for the tests that run them as
//! real processes.
//!
//! `cargo test` builds the examples before it runs any test, but
//! `cargo test --test e2e` does not: a test that took whatever binary was in
//! `target/*/examples` then ran a relay older than the `src/` it was meant
//! to test. So the first time a test process asks for an example, it has
//! cargo build it — the cargo that runs the tests (`$CARGO`), the test's own
//! profile, the same environment (target directory, flags) — and takes the
//! path cargo reports for the artifact. When the binary is fresh, that is a
//! check of under a second; cargo's lock on the target directory makes a
//! concurrent build wait rather than race.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Paths already built by this test process, by example name.
static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// The executable of example `name` as of this build (built if it is not
/// up to date). Panics with cargo's output if the build fails.
pub fn example_bin(name: &str) -> PathBuf {
    // Held across the build: tests of one process that want the same
    // example wait for one build instead of starting several.
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let path = build(name);
    built.insert(name.to_owned(), path.clone());
    path
}

fn build(name: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args([
            "--example",
            name,
            "--message-format=json-render-diagnostics",
        ]);
    // Not the variables cargo sets for this test process (its package's
    // `CARGO_MANIFEST_DIR` and the like): a dependency's build script that
    // reads one (ring's reads `CARGO_MANIFEST_DIR`) would see it changed
    // from the outer `cargo test`'s environment, and the two would rebuild
    // it, and all that depends on it, in turn at every run (10 s or more).
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("CARGO_PKG_")
            || key_str.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&&*key_str)
            || ["CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&&*key_str)
        {
            cmd.env_remove(&key);
        }
    }
    match profile() {
        Some(p) if p == "debug" => {}
        Some(p) if p == "release" => {
            cmd.arg("--release");
        }
        Some(p) => {
            cmd.args(["--profile", &p]);
        }
        None => {}
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cargo:?} build --example {name}: {e}"));
    assert!(
        out.status.success(),
        "`cargo build --example {name}` failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    executable(&String::from_utf8_lossy(&out.stdout), name).unwrap_or_else(|| {
        panic!(
            "`cargo build --example {name}` reported no executable:\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The profile directory this test executable was built in
/// (`target/<profile>/deps/<test>-<hash>`), e.g. `debug`.
fn profile() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    Some(deps.parent()?.file_name()?.to_str()?.to_owned())
}

/// The `executable` of the `compiler-artifact` message for example `name`
/// in cargo's JSON messages (one object per line).
fn executable(messages: &str, name: &str) -> Option<PathBuf> {
    messages.lines().find_map(|line| {
        let msg: serde_json::Value = serde_json::from_str(line).ok()?;
        if msg["reason"] != "compiler-artifact" || msg["target"]["name"] != name {
            return None;
        }
        if !msg["target"]["kind"]
            .as_array()?
            .iter()
            .any(|k| k == "example")
        {
            return None;
        }
        Some(PathBuf::from(msg["executable"].as_str()?))
    })
}
