//! The Content-Length accounting of one direction of a stream, written once
//! for both machines and both directions: what a sender may still send, and
//! whether what a receiver got is whole.

use super::{FinishError, WriteError};

/// Whether a response has no body whatever its Content-Length says: one to
/// a HEAD request, a 204 or a 304 (RFC 9110 §6.4.1). The responder knows the
/// request's method, so both machines apply the rule.
pub(crate) fn no_body(head_request: bool, status: u16) -> bool {
    head_request || status == 204 || status == 304
}

/// The body length a head announced, and the bytes that have gone by.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Length {
    declared: Option<u64>,
    done: u64,
}

impl Length {
    /// A body of `declared` bytes (`None`: no Content-Length).
    pub fn new(declared: Option<u64>) -> Length {
        Length { declared, done: 0 }
    }

    /// Whether `n` more bytes stay within the announced length.
    pub fn fits(&self, n: usize) -> bool {
        self.declared.is_none_or(|cl| self.done + n as u64 <= cl)
    }

    /// `n` more bytes went by.
    pub fn add(&mut self, n: usize) {
        self.done += n as u64;
    }

    /// Whether every announced byte went by (false without a length).
    pub fn complete(&self) -> bool {
        self.declared == Some(self.done)
    }

    /// Whether the body is short of its announced length.
    pub fn short(&self) -> bool {
        self.declared.is_some_and(|cl| self.done < cl)
    }

    /// A sender's check before queuing `n` more bytes.
    pub fn check_write(&self, n: usize) -> Result<(), WriteError> {
        match self.declared {
            Some(limit) if !self.fits(n) => Err(WriteError::ContentLengthExceeded { limit }),
            _ => Ok(()),
        }
    }

    /// A sender's check before ending the body.
    pub fn check_finish(&self) -> Result<(), FinishError> {
        match self.declared {
            Some(expected) if self.short() => Err(FinishError::ContentLengthShort {
                expected,
                sent: self.done,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_against_the_announced_length() {
        let mut l = Length::new(Some(5));
        assert!(l.fits(5) && !l.fits(6));
        l.add(3);
        assert!(l.short() && !l.complete());
        assert_eq!(
            l.check_write(3),
            Err(WriteError::ContentLengthExceeded { limit: 5 })
        );
        assert_eq!(
            l.check_finish(),
            Err(FinishError::ContentLengthShort {
                expected: 5,
                sent: 3
            })
        );
        l.add(2);
        assert!(l.complete() && !l.short());
        assert_eq!(l.check_finish(), Ok(()));
        let free = Length::new(None);
        assert!(free.fits(usize::MAX) && !free.complete() && !free.short());
    }
}
