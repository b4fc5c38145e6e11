//! Stream ids: integers 1..=4294967295, picked by the relay.

use std::fmt;
use std::num::NonZeroU32;

/// The id of one stream (one HTTP request) on a connection: 1..=2³²−1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(NonZeroU32);

impl StreamId {
    /// The smallest id, 1.
    pub const MIN: StreamId = StreamId(NonZeroU32::MIN);
    /// The largest id, 4294967295.
    pub const MAX: StreamId = StreamId(NonZeroU32::MAX);

    /// The id with this value, or `None` for 0.
    pub const fn new(v: u32) -> Option<StreamId> {
        match NonZeroU32::new(v) {
            Some(n) => Some(StreamId(n)),
            None => None,
        }
    }

    /// The id's integer value.
    pub const fn get(self) -> u32 {
        self.0.get()
    }

    /// The next id after this one, wrapping from 2³²−1 back to 1.
    pub const fn next_wrapping(self) -> StreamId {
        match self.0.checked_add(1) {
            Some(n) => StreamId(n),
            None => StreamId::MIN,
        }
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<StreamId> for u32 {
    fn from(id: StreamId) -> u32 {
        id.get()
    }
}

impl TryFrom<u32> for StreamId {
    type Error = crate::frame::IdError;
    fn try_from(v: u32) -> Result<Self, Self::Error> {
        StreamId::new(v).ok_or(crate::frame::IdError::Zero)
    }
}

impl serde::Serialize for StreamId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_not_an_id() {
        assert_eq!(StreamId::new(0), None);
        assert!(StreamId::try_from(0u32).is_err());
        assert_eq!(StreamId::try_from(9u32).unwrap().get(), 9);
    }

    #[test]
    fn next_wraps_to_one() {
        assert_eq!(StreamId::MAX.next_wrapping(), StreamId::MIN);
        assert_eq!(StreamId::MIN.next_wrapping().get(), 2);
        assert_eq!(StreamId::MAX.get(), u32::MAX);
    }

    #[test]
    fn serializes_as_a_number() {
        let id = StreamId::new(7).unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "7");
        assert_eq!(id.to_string(), "7");
    }
}
