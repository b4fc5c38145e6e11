//! The relay's tokens file: one `<worker-id> <connect-token>` per line.

use super::{Token, TokenError, TokenTable, TokenTableError, WorkerId, WorkerIdError};

/// Why a tokens file was refused: the line (from 1) and what is wrong with
/// it. The message never quotes a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
#[non_exhaustive]
pub struct TokenFileError {
    /// The line, counted from 1.
    pub line: usize,
    /// What is wrong with it.
    pub reason: TokenLineError,
}

/// What is wrong with one line of a tokens file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenLineError {
    /// Not two fields separated by white space.
    #[error("expected `<worker-id> <connect-token>`")]
    Fields,
    /// The worker id is not a valid one.
    #[error("worker id: {0}")]
    WorkerId(WorkerIdError),
    /// The token is not a valid one.
    #[error("token: {0}")]
    Token(TokenError),
    /// The worker already has a token on an earlier line.
    #[error("worker {0} is listed twice")]
    DuplicateWorker(WorkerId),
    /// Another worker has the same token.
    #[error("{0}")]
    DuplicateToken(TokenTableError),
    /// The token is shorter than [`MIN_TABLE_TOKEN`](super::MIN_TABLE_TOKEN)
    /// or longer than [`MAX_PRESENTED_TOKEN`](super::MAX_PRESENTED_TOKEN)
    /// ([`TokenTableError::TooShort`], [`TokenTableError::TooLong`]).
    #[error("{0}")]
    TokenLength(TokenTableError),
}

impl TokenTable {
    /// Parses a tokens file: one `<worker-id> <connect-token>` per line,
    /// separated by white space; blank lines and lines starting with `#` are
    /// skipped. A malformed line, a worker listed twice, a token shared by
    /// two workers, or one shorter than
    /// [`MIN_TABLE_TOKEN`](super::MIN_TABLE_TOKEN) (16 bytes) or longer
    /// than [`MAX_PRESENTED_TOKEN`](super::MAX_PRESENTED_TOKEN) refuses the
    /// whole file, naming the line (never the token).
    ///
    /// ```
    /// use worker_relay::connect::TokenTable;
    ///
    /// let text = "# id token\nabc ct-abc-1f3a9c27d85e40b6\n\nxyz ct-xyz-80c2e5f1a4d97b36\n";
    /// let table = TokenTable::parse(text)?;
    /// assert_eq!(table.lookup("ct-abc-1f3a9c27d85e40b6").map(|w| w.as_str()), Some("abc"));
    /// let err = TokenTable::parse("abc ct-abc-1f3a9c27d85e40b6\nabc ct-abc-again-0123456\n");
    /// assert_eq!(err.unwrap_err().to_string(), "line 2: worker abc is listed twice");
    /// let err = TokenTable::parse("abc ct-abc-1f3a9c27d85e40b6\nxyz s3cret\n").unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "line 2: the token given for worker xyz is shorter than 16 bytes"
    /// );
    /// # Ok::<(), worker_relay::connect::TokenFileError>(())
    /// ```
    pub fn parse(text: &str) -> Result<TokenTable, TokenFileError> {
        let mut table = TokenTable::new();
        for (i, line) in text.lines().enumerate() {
            let at = |reason| TokenFileError {
                line: i + 1,
                reason,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let (Some(id), Some(token), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(at(TokenLineError::Fields));
            };
            let id = WorkerId::new(id).map_err(|e| at(TokenLineError::WorkerId(e)))?;
            let token = Token::new(token).map_err(|e| at(TokenLineError::Token(e)))?;
            if table.contains(id.as_str()) {
                return Err(at(TokenLineError::DuplicateWorker(id)));
            }
            table.insert(id, token).map_err(|e| {
                at(match e {
                    TokenTableError::DuplicateToken { .. } => TokenLineError::DuplicateToken(e),
                    _ => TokenLineError::TokenLength(e),
                })
            })?;
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::{MAX_PRESENTED_TOKEN, MIN_TABLE_TOKEN};

    const S1: &str = "s3cret-0123456789";
    const S2: &str = "s3cret-9876543210";

    fn line_error(text: &str) -> (usize, TokenLineError) {
        let e = TokenTable::parse(text).unwrap_err();
        (e.line, e.reason)
    }

    fn id(s: &str) -> WorkerId {
        WorkerId::new(s).unwrap()
    }

    #[test]
    fn comments_blank_lines_and_white_space_are_skipped() {
        let text = format!("\n  # x y\n\tabc \t {S1}  \r\n\nxyz {S2}\n");
        let t = TokenTable::parse(&text).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.lookup(S1).unwrap().as_str(), "abc");
        assert_eq!(t.lookup(S2).unwrap().as_str(), "xyz");
        assert!(TokenTable::parse("").unwrap().is_empty());
    }

    #[test]
    fn every_bad_line_is_named_and_no_token_is_quoted() {
        assert_eq!(line_error("abc\n"), (1, TokenLineError::Fields));
        assert_eq!(
            line_error(&format!("ok {S1}\nabc {S2} extra\n")),
            (2, TokenLineError::Fields)
        );
        assert!(matches!(
            line_error(&format!("a/b {S1}\n")),
            (1, TokenLineError::WorkerId(_))
        ));
        assert!(matches!(
            line_error("abc s3cr\u{e9}t-0123456789\n"),
            (1, TokenLineError::Token(TokenError::InvalidChar))
        ));
        assert!(matches!(
            line_error(&format!("abc {S1}\nxyz {S1}\n")),
            (2, TokenLineError::DuplicateToken(_))
        ));
        for text in [
            format!("abc {S1}\nxyz {S1}\n"),
            format!("abc {S1}\nabc {S1}\n"),
            format!("abc {S1}\nxyz s3cret\n"),
        ] {
            let e = TokenTable::parse(&text).unwrap_err();
            assert!(!e.to_string().contains("s3cret"), "{e}");
            assert!(!format!("{e:?}").contains("s3cret"), "{e:?}");
        }
    }

    #[test]
    fn a_token_outside_the_length_bounds_is_named_by_line_and_worker() {
        let short = "s".repeat(MIN_TABLE_TOKEN - 1);
        let text = format!("# tokens\nabc {S1}\n\nxyz {short}\n");
        let e = TokenTable::parse(&text).unwrap_err();
        assert_eq!(
            (e.line, &e.reason),
            (
                4,
                &TokenLineError::TokenLength(TokenTableError::TooShort {
                    worker: id("xyz"),
                    min: 16
                })
            )
        );
        assert_eq!(
            e.to_string(),
            "line 4: the token given for worker xyz is shorter than 16 bytes"
        );
        let long = "L".repeat(MAX_PRESENTED_TOKEN + 1);
        assert_eq!(
            line_error(&format!("big {long}\n")),
            (
                1,
                TokenLineError::TokenLength(TokenTableError::TooLong {
                    worker: id("big"),
                    max: 1024
                })
            )
        );
        // At the bounds: accepted.
        let text = format!(
            "a {}\nb {}\n",
            "m".repeat(MIN_TABLE_TOKEN),
            "M".repeat(MAX_PRESENTED_TOKEN)
        );
        assert_eq!(TokenTable::parse(&text).unwrap().len(), 2);
    }
}
