//! Lenient serde shapes for decoding control frames: each field decodes to
//! "the value" or "wrong type" instead of failing the whole parse, so
//! validation can say exactly which field was wrong.

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
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
pub(crate) enum LHeaders<'a> {
    Ok(Vec<(Cow<'a, str>, Cow<'a, str>)>),
    Wrong,
}

/// The fields of any control frame; unknown fields are ignored.
#[derive(serde::Deserialize)]
pub(crate) struct RawFrame<'a> {
    #[serde(rename = "type", borrow, default)]
    pub ty: Option<LStr<'a>>,
    #[serde(default)]
    pub id: Option<LNum>,
    #[serde(borrow, default)]
    pub method: Option<LStr<'a>>,
    #[serde(borrow, default)]
    pub path: Option<LStr<'a>>,
    #[serde(borrow, default)]
    pub query: Option<LStr<'a>>,
    #[serde(default)]
    pub status: Option<LNum>,
    #[serde(borrow, default)]
    pub headers: Option<LHeaders<'a>>,
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

struct HeadersVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for HeadersVisitor<'a> {
    type Value = LHeaders<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(s.size_hint().unwrap_or(16).min(64));
        let mut wrong = false;
        while let Some(LPair(p)) = s.next_element::<LPair<'a>>()? {
            match p {
                Some(pair) if !wrong => out.push(pair),
                _ => wrong = true,
            }
        }
        Ok(if wrong {
            LHeaders::Wrong
        } else {
            LHeaders::Ok(out)
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

impl<'de: 'a, 'a> Deserialize<'de> for LHeaders<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(HeadersVisitor(PhantomData))
    }
}
