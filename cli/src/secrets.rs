//! Taking secrets out of the process environment for good.
//!
//! `std::env::remove_var` only unlinks the variable from libc's `environ`
//! array; the original `NAME=value` bytes stay in the process's initial
//! environment block, which `/proc/<pid>/environ` shows to any process of
//! the same uid. So the value is overwritten with NUL bytes in place first,
//! as Strata's worker does, then removed. This needs `unsafe` (a write
//! through libc's pointer): it lives here, in the programs' crate, not in
//! the libraries (which are `#![forbid(unsafe_code)]`).
#![allow(dead_code)] // shared by several examples and tests, each using a part

/// Reads `name` from the environment, zeroes its value bytes in place, and
/// removes it. Call this before any other thread exists.
pub fn take_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok()?;
    let cname = std::ffi::CString::new(name).ok()?;
    // SAFETY: single-threaded at this point (called first thing in `main`).
    // `getenv` returns a pointer to the NUL-terminated value inside the
    // environment block (or null); we overwrite exactly its `strlen` bytes,
    // which stay NUL-terminated, and libc owns that memory for the life of
    // the process.
    unsafe {
        let p = libc::getenv(cname.as_ptr());
        if !p.is_null() {
            let len = libc::strlen(p);
            std::ptr::write_bytes(p, 0, len);
        }
    }
    std::env::remove_var(name);
    Some(value)
}
