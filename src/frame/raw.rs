//! Lenient serde shapes for decoding control frames: each field decodes to
//! "the value" or "wrong type" instead of failing the whole parse, so
//! validation can say exactly which field was wrong.

use super::head_limits::{header_line_len, HeadLimitError, HeadLimits};
use super::{HeaderError, Headers};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

/// A JSON value expected to be a string.
pub(crate) enum LStr<'a> {
    Str(Cow<'a, str>),
    Wrong,
}

/// A JSON value expected to be a number.
pub(crate) enum LNum {
    U(u64),
    I(i64),
    F(f64),
    Wrong,
}

/// A JSON value expected to be a list of `[name, value]` string pairs.
pub(crate) enum LHeaders {
    Ok(Headers),
    /// Every element was a pair of strings, and this one broke a header rule.
    Invalid(HeaderError),
    Wrong,
    /// The list crossed a [`HeadLimits`] bound; the rest was skipped unread.
    OverLimit(HeadLimitError),
}

/// The fields of any control frame; unknown fields are ignored, a repeated
/// known field is an error (as serde's derive makes it).
#[derive(Default)]
pub(crate) struct RawFrame<'a> {
    pub ty: Option<LStr<'a>>,
    pub id: Option<LNum>,
    pub method: Option<LStr<'a>>,
    pub path: Option<LStr<'a>>,
    pub query: Option<LStr<'a>>,
    pub status: Option<LNum>,
    pub headers: Option<LHeaders>,
}

/// Whether the reader wants a frame of this `type` and id; `false` stops
/// the parse right there (the frame is ignored without being read further).
pub(crate) type Wanted<'w> = &'w dyn Fn(&str, u64) -> bool;

impl<'a> RawFrame<'a> {
    /// Parses `text`, collecting headers only while they fit `limits`: past a
    /// bound the rest of the list is skipped without allocating, so a huge
    /// head costs a scan, not a parse. Once `type` and an integer `id` are
    /// read (they come first in the spec's field order), `wanted` may stop
    /// the parse: `Ok(None)`, the rest of the text unread.
    pub fn parse(
        text: &'a str,
        limits: Option<&HeadLimits>,
        wanted: Option<Wanted<'_>>,
    ) -> serde_json::Result<Option<RawFrame<'a>>> {
        let skipped = Cell::new(false);
        let mut de = serde_json::Deserializer::from_str(text);
        let seed = FrameSeed {
            // The headers' text is never longer than the frame's.
            header_bytes: text.len().min(MAX_HEADER_PREALLOC),
            limits,
            wanted,
            skipped: &skipped,
        };
        match de::DeserializeSeed::deserialize(seed, &mut de) {
            Err(_) if skipped.get() => Ok(None),
            Err(e) => Err(e),
            Ok(raw) => {
                de.end()?;
                Ok(Some(raw))
            }
        }
    }
}

/// The most a header list reserves for its text up front.
pub(super) const MAX_HEADER_PREALLOC: usize = 16 * 1024;

struct FrameSeed<'l, 'w> {
    header_bytes: usize,
    limits: Option<&'l HeadLimits>,
    wanted: Option<Wanted<'w>>,
    skipped: &'l Cell<bool>,
}

impl<'de> de::DeserializeSeed<'de> for FrameSeed<'_, '_> {
    type Value = RawFrame<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<RawFrame<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FrameSeed<'_, '_> {
    type Value = RawFrame<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RawFrame<'de>, A::Error> {
        let mut f = RawFrame::default();
        // Whether each field was present (a `null` counts as absent but is
        // still a repeat if it comes twice).
        let mut seen = [false; 7];
        while let Some(key) = m.next_key::<LStr<'de>>()? {
            let LStr::Str(key) = key else {
                m.next_value::<IgnoredAny>()?;
                continue;
            };
            let (i, name) = match &*key {
                "type" => (0, "type"),
                "id" => (1, "id"),
                "method" => (2, "method"),
                "path" => (3, "path"),
                "query" => (4, "query"),
                "status" => (5, "status"),
                "headers" => (6, "headers"),
                _ => {
                    m.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if std::mem::replace(&mut seen[i], true) {
                return Err(de::Error::duplicate_field(name));
            }
            match i {
                0 => f.ty = m.next_value()?,
                1 => f.id = m.next_value()?,
                2 => f.method = m.next_value()?,
                3 => f.path = m.next_value()?,
                4 => f.query = m.next_value()?,
                5 => f.status = m.next_value()?,
                _ => {
                    let seed = OptionSeed(HeadersVisitor {
                        limits: self.limits,
                        header_bytes: self.header_bytes,
                    });
                    f.headers = m.next_value_seed(seed)?
                }
            }
            if let (Some(wanted), true, Some(LStr::Str(ty)), Some(LNum::U(id))) =
                (self.wanted, i <= 1, &f.ty, &f.id)
            {
                if !wanted(ty, *id) {
                    self.skipped.set(true);
                    return Err(de::Error::custom("frame not wanted"));
                }
            }
        }
        Ok(f)
    }
}

/// `null` as `None`, anything else through the inner visitor.
struct OptionSeed<V>(V);

impl<'de, V: Visitor<'de>> de::DeserializeSeed<'de> for OptionSeed<V> {
    type Value = Option<V::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for OptionSeed<V> {
    type Value = Option<V::Value>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self.0).map(Some)
    }
}

/// Visits and discards whatever a wrong-typed value holds.
macro_rules! wrong_for_others {
    ($wrong:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($wrong)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($wrong)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($wrong)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($wrong)
        }
    };
}

struct StrVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
    type Value = LStr<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(LStr::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LStr::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(LStr::Str(Cow::Owned(v)))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(LStr::Wrong)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LStr::Wrong)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LStr::Wrong)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
        while s.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LStr::Wrong)
    }
    wrong_for_others!(LStr::Wrong);
}

impl<'de: 'a, 'a> Deserialize<'de> for LStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrVisitor(PhantomData))
    }
}

struct NumVisitor;

impl<'de> Visitor<'de> for NumVisitor {
    type Value = LNum;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(LNum::U(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(LNum::I(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(LNum::F(v))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(LNum::Wrong)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
        while s.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LNum::Wrong)
    }
    wrong_for_others!(LNum::Wrong);
}

impl<'de> Deserialize<'de> for LNum {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor)
    }
}

/// One `[name, value]` pair, or wrong.
struct LPair<'a>(Option<(Cow<'a, str>, Cow<'a, str>)>);

struct PairVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for PairVisitor<'a> {
    type Value = LPair<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
        let name = s.next_element::<LStr<'a>>()?;
        let value = s.next_element::<LStr<'a>>()?;
        let mut extra = false;
        while s.next_element::<IgnoredAny>()?.is_some() {
            extra = true;
        }
        Ok(LPair(match (name, value, extra) {
            (Some(LStr::Str(n)), Some(LStr::Str(v)), false) => Some((n, v)),
            _ => None,
        }))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(LPair(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(LPair(None))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LPair(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LPair(None))
    }
    wrong_for_others!(LPair(None));
}

impl<'de: 'a, 'a> Deserialize<'de> for LPair<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PairVisitor(PhantomData))
    }
}

struct HeadersVisitor<'l> {
    limits: Option<&'l HeadLimits>,
    /// Room to reserve for the list's text.
    header_bytes: usize,
}

impl<'de> Visitor<'de> for HeadersVisitor<'_> {
    type Value = LHeaders;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
        // Straight into the list's one buffer: no string per name or value.
        let mut out = Headers::with_capacity(16, self.header_bytes);
        let mut wrong = false;
        let mut invalid = None;
        let (mut count, mut bytes) = (0usize, 0usize);
        while let Some(LPair(p)) = s.next_element::<LPair<'de>>()? {
            count += 1;
            match p {
                Some((n, v)) => {
                    bytes += header_line_len(&n, &v);
                    if !wrong && invalid.is_none() {
                        invalid = out.try_push(&*n, &*v).err();
                    }
                }
                None => wrong = true,
            }
            if let Some(e) = self.limits.and_then(|l| l.header_fits(count, bytes)) {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(LHeaders::OverLimit(e));
            }
        }
        Ok(match (wrong, invalid) {
            (true, _) => LHeaders::Wrong,
            (false, Some(e)) => LHeaders::Invalid(e),
            (false, None) => LHeaders::Ok(out),
        })
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(LHeaders::Wrong)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(LHeaders::Wrong)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LHeaders::Wrong)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LHeaders::Wrong)
    }
    wrong_for_others!(LHeaders::Wrong);
}
