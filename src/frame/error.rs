//! Errors of the wire-format layer, and the close code each maps to.

use super::CloseCode;

/// Why a stream id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The `id` field is absent.
    #[error("id is missing")]
    Missing,
    /// The id is 0.
    #[error("id is 0")]
    Zero,
    /// The id is negative.
    #[error("id is negative")]
    Negative,
    /// The id is a number with a fractional part or an exponent.
    #[error("id is not an integer")]
    Fractional,
    /// The id is larger than 4294967295.
    #[error("id is larger than 4294967295")]
    TooLarge,
    /// The id is not a JSON number (a string, boolean, null, array or object).
    #[error("id is not a number")]
    NotANumber,
}

/// Why a header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The name is empty or holds a character that is not an HTTP token character.
    #[error("header {index}: name is not an HTTP token")]
    InvalidName {
        /// Position of the header in the list.
        index: usize,
    },
    /// The value holds a character above U+00FF, so it is not Latin-1.
    #[error("header {index}: value is not Latin-1")]
    NotLatin1 {
        /// Position of the header in the list.
        index: usize,
    },
    /// The value holds CR, LF or NUL, which would allow header injection.
    #[error("header {index}: value contains CR, LF or NUL")]
    ForbiddenChar {
        /// Position of the header in the list.
        index: usize,
    },
    /// Several Content-Length headers (or a comma list) disagree, or one is not a number.
    #[error("invalid or conflicting Content-Length")]
    InvalidContentLength,
}

/// An error decoding or validating one WebSocket message.
///
/// [`FrameError::close_code`] says which close code a connection uses when it
/// refuses the message; the state machines decide whether to close at all
/// (the worker ignores most malformed control frames, as Strata's does).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The message is longer than the limit (1 MiB + 4 bytes for any message).
    #[error("message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Length of the message.
        len: usize,
        /// The limit it exceeded.
        limit: usize,
    },
    /// A text message that is not valid JSON.
    #[error("text message is not valid JSON: {0}")]
    InvalidJson(String),
    /// A text message that is valid JSON but not an object.
    #[error("text message is not a JSON object")]
    NotAnObject,
    /// A required field is missing (`type`, `method`, `path`, `status`).
    #[error("field `{0}` is missing")]
    MissingField(&'static str),
    /// A field holds a JSON value of the wrong type.
    #[error("field `{0}` has the wrong type")]
    WrongType(&'static str),
    /// The stream id is not an integer in 1..=4294967295.
    #[error("invalid stream id: {0}")]
    InvalidId(#[from] IdError),
    /// The method is not an HTTP token.
    #[error("method is not an HTTP token")]
    InvalidMethod,
    /// The path does not start with `/`, or holds a character outside visible ASCII.
    #[error("path must start with `/` and hold only visible ASCII")]
    InvalidPath,
    /// The query holds a character outside visible ASCII.
    #[error("query must hold only visible ASCII")]
    InvalidQuery,
    /// The status is not an integer in 100..=999.
    #[error("status must be an integer in 100..=999")]
    InvalidStatus,
    /// A header name or value was refused.
    #[error(transparent)]
    InvalidHeader(#[from] HeaderError),
    /// A `request` or `response` head over a bound of the receiver's
    /// [`HeadLimits`](super::HeadLimits) (too many headers, too large, a long
    /// target or method).
    #[error("head over limit: {0}")]
    HeadOverLimit(#[from] super::HeadLimitError),
    /// A binary message shorter than the 4-byte stream id.
    #[error("binary message of {len} bytes is shorter than the 4-byte stream id")]
    ChunkTooShort {
        /// Length of the message.
        len: usize,
    },
}

impl FrameError {
    /// The WebSocket close code a connection uses when it refuses this message:
    /// 1009 for a message too big, 1007 for a text message that is not a JSON
    /// object, 1002 (protocol error) for everything else.
    pub fn close_code(&self) -> CloseCode {
        match self {
            FrameError::TooLarge { .. } => CloseCode::MESSAGE_TOO_BIG,
            FrameError::InvalidJson(_) | FrameError::NotAnObject => CloseCode::INVALID_PAYLOAD,
            _ => CloseCode::PROTOCOL_ERROR,
        }
    }

    /// A stable, machine-readable name for the error, as used in
    /// `tests/vectors/frames.json`.
    pub fn kind(&self) -> &'static str {
        match self {
            FrameError::TooLarge { .. } => "too_large",
            FrameError::InvalidJson(_) => "invalid_json",
            FrameError::NotAnObject => "not_an_object",
            FrameError::MissingField(_) => "missing_field",
            FrameError::WrongType(_) => "wrong_type",
            FrameError::InvalidId(IdError::Missing) => "id_missing",
            FrameError::InvalidId(IdError::Zero) => "id_zero",
            FrameError::InvalidId(IdError::Negative) => "id_negative",
            FrameError::InvalidId(IdError::Fractional) => "id_fractional",
            FrameError::InvalidId(IdError::TooLarge) => "id_too_large",
            FrameError::InvalidId(IdError::NotANumber) => "id_not_a_number",
            FrameError::InvalidMethod => "invalid_method",
            FrameError::InvalidPath => "invalid_path",
            FrameError::InvalidQuery => "invalid_query",
            FrameError::InvalidStatus => "invalid_status",
            FrameError::InvalidHeader(HeaderError::InvalidName { .. }) => "header_name",
            FrameError::InvalidHeader(HeaderError::NotLatin1 { .. }) => "header_not_latin1",
            FrameError::InvalidHeader(HeaderError::ForbiddenChar { .. }) => "header_forbidden_char",
            FrameError::InvalidHeader(HeaderError::InvalidContentLength) => "content_length",
            FrameError::HeadOverLimit(_) => "head_over_limit",
            FrameError::ChunkTooShort { .. } => "chunk_too_short",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_codes() {
        let big = FrameError::TooLarge { len: 10, limit: 5 };
        assert_eq!(big.close_code(), CloseCode::MESSAGE_TOO_BIG);
        assert_eq!(FrameError::NotAnObject.close_code().0, 1007);
        assert_eq!(FrameError::InvalidJson("x".into()).close_code().0, 1007);
        assert_eq!(FrameError::from(IdError::Zero).close_code().0, 1002);
        assert_eq!(FrameError::ChunkTooShort { len: 2 }.close_code().0, 1002);
    }

    #[test]
    fn messages_name_the_field() {
        let e = FrameError::from(HeaderError::NotLatin1 { index: 3 });
        assert_eq!(e.to_string(), "header 3: value is not Latin-1");
        assert_eq!(
            FrameError::MissingField("path").to_string(),
            "field `path` is missing"
        );
        assert!(FrameError::TooLarge { len: 9, limit: 4 }
            .to_string()
            .contains("limit of 4"));
    }
}
