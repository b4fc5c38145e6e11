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
}

impl TokenTable {
    /// Parses a tokens file: one `<worker-id> <connect-token>` per line,
    /// separated by white space; blank lines and lines starting with `#` are
    /// skipped. A malformed line, a worker listed twice or a token shared by
    /// two workers refuses the whole file, naming the line (never the
    /// token).
    ///
    /// ```
    /// use worker_relay::connect::TokenTable;
    ///
    /// let table = TokenTable::parse("# id token\nabc s3cret\n\nxyz 0th3r\n")?;
    /// assert_eq!(table.lookup("s3cret").map(|w| w.as_str()), Some("abc"));
    /// let err = TokenTable::parse("abc s3cret\nabc again\n").unwrap_err();
    /// assert_eq!(err.to_string(), "line 2: worker abc is listed twice");
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
            table
                .insert(id, token)
                .map_err(|e| at(TokenLineError::DuplicateToken(e)))?;
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_error(text: &str) -> (usize, TokenLineError) {
        let e = TokenTable::parse(text).unwrap_err();
        (e.line, e.reason)
    }

    #[test]
    fn comments_blank_lines_and_white_space_are_skipped() {
        let t = TokenTable::parse("\n  # x y\n\tabc \t s3cret  \r\n\nxyz t2\n").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.lookup("s3cret").unwrap().as_str(), "abc");
        assert_eq!(t.lookup("t2").unwrap().as_str(), "xyz");
        assert!(TokenTable::parse("").unwrap().is_empty());
    }

    #[test]
    fn every_bad_line_is_named_and_no_token_is_quoted() {
        assert_eq!(line_error("abc\n"), (1, TokenLineError::Fields));
        assert_eq!(
            line_error("ok t\nabc s3cret extra\n"),
            (2, TokenLineError::Fields)
        );
        assert!(matches!(
            line_error("a/b s3cret\n"),
            (1, TokenLineError::WorkerId(_))
        ));
        assert!(matches!(
            line_error("abc s3cr\u{e9}t\n"),
            (1, TokenLineError::Token(TokenError::InvalidChar))
        ));
        assert!(matches!(
            line_error("abc s3cret\nxyz s3cret\n"),
            (2, TokenLineError::DuplicateToken(_))
        ));
        for text in ["abc s3cret\nxyz s3cret\n", "abc s3cret\nabc s3cret\n"] {
            let e = TokenTable::parse(text).unwrap_err();
            assert!(!e.to_string().contains("s3cret"), "{e}");
            assert!(!format!("{e:?}").contains("s3cret"), "{e:?}");
        }
    }
}
